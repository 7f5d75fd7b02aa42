"""Score a model on ParallelBench samples with one-token-per-step greedy decoding (shared by train.py/evaluate.py).

Decoding is the benchmark's baseline: ``sampler="low_confidence"``, ``steps = gen_length = block_length =
max_new_tokens`` of the task (32 waiting line, 64 puzzles), temperature 0; the chat is built by ``build_messages``
and rendered by the tokenizer's chat template inside ``dlm_decode.generate``. A block-causal model (``block_length``
given) is decoded open-ended as the issue's demo-llada2 targets ask: gen length ``OPEN_GEN`` (128) as a cap, blocks of
``block_length``, one token per step, stopping after the block that holds the first EOS. Scores come from
``dlm_decode.parallelbench.metrics.score_sample`` (lenient score, as the paper reports, plus the strict one).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

import dlm_decode
from dlm_decode.parallelbench.metrics import score_sample

OPEN_GEN = 128  # the gen-length cap of open-ended (block-causal) decoding
TASKS = [
    "waiting_line/copy",
    "waiting_line/reverse",
    "waiting_line/sort",
    "waiting_line/insert_index",
    "waiting_line/remove_index",
    "waiting_line/replace_index",
    "waiting_line/insert_random",
    "waiting_line/remove_random",
    "waiting_line/replace_random",
    "waiting_line/shuffle",
    "puzzle/latin_square_n4",
    "puzzle/sudoku_n4_12",
]
# the quality bar the shipped demo models are trained for (score x 100 on the official test files)
TARGETS = {
    "waiting_line/copy": 95,
    "waiting_line/reverse": 95,
    "waiting_line/insert_index": 95,
    "waiting_line/remove_index": 95,
    "waiting_line/replace_index": 95,
    "waiting_line/sort": 90,
    "waiting_line/insert_random": 90,
    "waiting_line/remove_random": 90,
    "waiting_line/replace_random": 90,
    "waiting_line/shuffle": 90,
    "puzzle/latin_square_n4": 80,
    "puzzle/sudoku_n4_12": 50,
}


def score_task(
    model: Any,
    tokenizer: Any,
    task: str,
    chats: Sequence[list[dict[str, str]]],
    samples: Sequence[dict],
    gen_length: int,
    batch_size: int = 50,
    block_length: int | None = None,
) -> dict[str, float]:
    """Mean score x 100 (lenient and strict), NFE per sample and seconds for one task's samples; ``block_length``:
    a block-causal model's block (open-ended decoding, gen length ``OPEN_GEN`` as a cap)."""
    gen, block = (gen_length, gen_length) if block_length is None else (OPEN_GEN, block_length)
    was_training = model.training
    model.eval()
    scores, strict, nfe = [], [], 0
    start = time.perf_counter()
    try:
        for i in range(0, len(chats), batch_size):
            out = dlm_decode.generate(
                model,
                list(chats[i : i + batch_size]),
                tokenizer=tokenizer,
                chat=True,
                sampler="low_confidence",
                gen_length=gen,
                block_length=block,
                steps=gen,
                temperature=0.0,
            )
            for text, sample in zip(out.texts, samples[i : i + batch_size], strict=True):
                s = score_sample(task, text or "", sample)
                scores.append(s["score"])
                strict.append(s["score_strict"])
            nfe += out.nfe * len(out.rows)
    finally:
        model.train(was_training)
    n = max(len(scores), 1)
    return {
        "score": 100.0 * sum(scores) / n,
        "score_strict": 100.0 * sum(strict) / n,
        "nfe": nfe / n,
        "n": len(scores),
        "seconds": time.perf_counter() - start,
    }


@torch.no_grad()
def score_tasks(model: Any, tokenizer: Any, items: dict[str, tuple[list, list, int]], **kw: Any) -> dict[str, dict]:
    """``items``: task -> (chats, samples, gen_length). Returns task -> score_task's dict."""
    return {task: score_task(model, tokenizer, task, *items[task], **kw) for task in items}
