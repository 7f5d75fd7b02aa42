"""Build the demo models' train / eval data: freshly generated ParallelBench samples, never the test files.

    python recipes/train_demo/data.py --data-dir /work/shared/data/parallelbench --out recipes/train_demo/work/data

Tasks: the ten waiting-line operations, ``puzzle/latin_square_n4`` and ``puzzle/sudoku_n4_12``, generated with
``dlm_decode.parallelbench.generator.generate_task`` from the official task configs but with our own seeds
(all far from the official ones). Every sample whose ``sample_key`` equals an official test sample's is dropped and
counted (the eval split is also kept apart from the train split). Each row holds the chat exactly as
``build_messages`` builds it and one target: ``random_answer`` drawn afresh for each row, so shuffle / *_random /
latin square targets keep the task's diversity while deterministic tasks get their unique answer.

Rows: ``task``, ``messages`` (JSON list of chat turns), ``target`` (answer text), ``sample`` (JSON of the sample, for
scoring), ``max_new_tokens`` (32 waiting line, 64 puzzles). Saved with ``DatasetDict.save_to_disk``.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from dlm_decode.parallelbench.generator import (
    WAITING_LINE_OPS,
    generate_task,
    load_names,
    random_answer,
    sample_key,
)
from dlm_decode.parallelbench.tasks import build_messages, list_tasks, load_task, max_new_tokens

WAITING_LINE = list(WAITING_LINE_OPS)
TASKS = [f"waiting_line/{op}" for op in WAITING_LINE] + ["puzzle/latin_square_n4", "puzzle/sudoku_n4_12"]
# more rows for the tasks expected to learn slowest (ordering names, reversing, sudoku)
DEFAULT_WEIGHTS = {"waiting_line/sort": 1.5, "waiting_line/reverse": 1.25, "puzzle/sudoku_n4_12": 1.5}
TRAIN_SEED, EVAL_SEED = 7_000_001, 9_000_001  # official seeds are five-digit numbers


def task_seed(base: int, index: int) -> int:
    return base + 7919 * index


def official_keys(data_dir: str | Path, tasks: list[str]) -> dict[str, set]:
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
    tasks: list[str] = TASKS,
    weights: dict[str, float] | None = None,
    exclude: dict[str, set] | None = None,
) -> tuple[list[dict], dict[str, int], dict[str, set]]:
    """Generate ``n_per_task`` (times the task's weight) samples per task with fresh seeds.

    Returns (rows, dropped collisions per task, keys of the kept samples per task). ``exclude`` holds keys that must
    not appear (the official test samples, and for the train split also the eval samples).
    """
    names = load_names(Path(data_dir) / "first_last_names.yaml")
    weights = weights or {}
    exclude = exclude or {}
    rows: list[dict] = []
    dropped: dict[str, int] = {}
    kept_keys: dict[str, set] = {}
    for i, task in enumerate(tasks):
        config = load_task(data_dir, task, limit=0).config
        n = round(n_per_task * weights.get(task, 1.0))
        samples = generate_task(task, config, names, n=n, seed=task_seed(seed, i))
        bad = exclude.get(task, set())
        kept = [s for s in samples if sample_key(s) not in bad]
        dropped[task] = len(samples) - len(kept)
        kept_keys[task] = {sample_key(s) for s in kept}
        rows += make_rows(task, kept, config, random.Random(task_seed(seed, i) + 1))
    return rows, dropped, kept_keys


def build_dataset(data_dir: str | Path, n_train: int, n_eval: int, *, weights: dict[str, float] | None = None):
    """DatasetDict(train, eval) plus a report of the collisions dropped from each split."""
    from datasets import Dataset, DatasetDict

    tasks = [t for t in TASKS if t in set(list_tasks(data_dir))]
    if len(tasks) != len(TASKS):
        raise FileNotFoundError(f"{data_dir} lacks tasks {sorted(set(TASKS) - set(tasks))}")
    official = official_keys(data_dir, tasks)
    eval_rows, eval_dropped, eval_keys = build_split(data_dir, n_eval, EVAL_SEED, exclude=official)
    held = {t: official[t] | eval_keys[t] for t in tasks}
    weights = DEFAULT_WEIGHTS if weights is None else weights
    train_rows, train_dropped, _ = build_split(data_dir, n_train, TRAIN_SEED, weights=weights, exclude=held)
    ds = DatasetDict({"train": Dataset.from_list(train_rows), "eval": Dataset.from_list(eval_rows)})
    return ds, {"train_dropped": train_dropped, "eval_dropped": eval_dropped}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default="/work/shared/data/parallelbench", help="official ParallelBench data")
    ap.add_argument("--out", required=True)
    ap.add_argument("--n-train", type=int, default=6000, help="train samples per task (before weights)")
    ap.add_argument("--n-eval", type=int, default=32, help="held-out samples per task")
    args = ap.parse_args()
    ds, report = build_dataset(args.data_dir, args.n_train, args.n_eval)
    ds.save_to_disk(args.out)
    (Path(args.out) / "collisions.json").write_text(json.dumps(report, indent=1))
    total = {k: sum(v.values()) for k, v in report.items()}
    print(f"train {len(ds['train'])} rows, eval {len(ds['eval'])} rows -> {args.out}")
    print(f"dropped (equal to an official test sample or, for train, to an eval sample): {total} {report}")


if __name__ == "__main__":
    from dlm_decode.cli import run_script

    run_script(main, "train_demo/data.py")
