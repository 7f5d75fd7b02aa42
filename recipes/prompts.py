"""Fresh ParallelBench prompts for the recipes: generated with their own seeds, official test samples excluded.

``build_split`` draws ``n_per_task`` samples per task with ``generate_task`` from the official task configs (seed
``seed + 7919 * task index``), drops every sample whose ``sample_key`` is in ``exclude`` (the official test samples;
for the training split also the held-out ones) and returns one row per kept sample: the chat as ``build_messages``
builds it, one target drawn by ``random_answer`` (random-output tasks keep their diversity), the sample and the gen
length. Used by certainty_forcing's trajectories and learn2pd's prompt sets (the rows train_demo's former ``data.py``
built, byte for byte, so earlier trajectories and filter records rebuild).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

from dlm_decode.parallelbench.generator import generate_task, load_names, random_answer, sample_key
from dlm_decode.parallelbench.tasks import build_messages, load_task, max_new_tokens


def task_seed(base: int, index: int) -> int:
    return base + 7919 * index


def official_keys(data_dir: str | Path, tasks: Sequence[str]) -> dict[str, set]:
    """``sample_key`` of every official test sample, per task."""
    return {t: {sample_key(s) for s in load_task(data_dir, t).samples} for t in tasks}


def make_rows(task: str, samples: list[dict], config: dict, rng: random.Random) -> list[dict]:
    gen_len = max_new_tokens(task)
    return [
        {
            "task": task,
            "messages": json.dumps(build_messages(config, s), ensure_ascii=False),
            "target": random_answer(task, s, rng),
            "sample": json.dumps(s, ensure_ascii=False),
            "max_new_tokens": gen_len,
        }
        for s in samples
    ]


def build_split(
    data_dir: str | Path,
    n_per_task: int,
    seed: int,
    *,
    tasks: Sequence[str],
    weights: dict[str, float] | None = None,
    exclude: dict[str, set] | None = None,
) -> tuple[list[dict], dict[str, int], dict[str, set]]:
    """(rows, dropped collisions per task, keys of the kept samples per task); ``weights`` scale a task's count."""
    names = load_names(Path(data_dir) / "first_last_names.yaml")
    exclude = exclude or {}
    rows: list[dict] = []
    dropped: dict[str, int] = {}
    kept_keys: dict[str, set] = {}
    for i, task in enumerate(tasks):
        config = load_task(data_dir, task, limit=0).config
        n = round(n_per_task * (weights or {}).get(task, 1.0))
        samples = generate_task(task, config, names, n=n, seed=task_seed(seed, i))
        bad = exclude.get(task, set())
        kept = [s for s in samples if sample_key(s) not in bad]
        dropped[task] = len(samples) - len(kept)
        kept_keys[task] = {sample_key(s) for s in kept}
        rows += make_rows(task, kept, config, random.Random(task_seed(seed, i) + 1))
    return rows, dropped, kept_keys
