"""Score a demo checkpoint on the official ParallelBench test files (waiting line + puzzles).

    python recipes/train_demo/evaluate.py --model demo-llada --data /work/shared/data/parallelbench

Each sample's chat is built by ``build_messages`` from the official jsonl, decoded one token per step (sampler
``low_confidence``, ``steps = gen_length = block_length = max_new_tokens``: 32 waiting line, 64 puzzles,
temperature 0, no cache) and scored with ``metrics.score_sample``. Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scoring import TARGETS, TASKS, score_task  # noqa: E402

import dlm_decode  # noqa: E402
from dlm_decode.parallelbench.tasks import build_messages, load_task, max_new_tokens  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="checkpoint directory or demo name (demo-llada, demo-dream)")
    ap.add_argument("--data", default="/work/shared/data/parallelbench")
    ap.add_argument("--tasks", nargs="*", default=TASKS)
    ap.add_argument("--limit", type=int, default=None, help="first N samples per task")
    ap.add_argument("--stride", type=int, default=1, help="every k-th sample (files are ordered by list length)")
    ap.add_argument("--batch-size", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    model, tok = dlm_decode.load_model(args.model)
    start = time.perf_counter()
    results = {}
    for name in args.tasks:
        task = load_task(args.data, name, limit=args.limit)
        samples = task.samples[:: args.stride]
        chats = [build_messages(task.config, s) for s in samples]
        gl = max_new_tokens(name)
        results[name] = score_task(model, tok, name, chats, samples, gl, batch_size=args.batch_size)
        r = results[name]
        print(f"{name:28s} {r['score']:6.1f}  (strict {r['score_strict']:5.1f}, n={r['n']}, {r['seconds']:.0f}s)")
    print(f"{'task':28s} {'score':>6s} {'target':>6s}  met")
    for name, r in results.items():
        target = TARGETS.get(name)
        met = "" if target is None else ("yes" if r["score"] >= target else "NO")
        print(f"{name:28s} {r['score']:6.1f} {target or '':>6}  {met}")
    mean = sum(r["score"] for r in results.values()) / max(len(results), 1)
    print(f"{'mean':28s} {mean:6.1f}   ({time.perf_counter() - start:.0f}s)")
    summary = {
        "model": str(args.model),
        "scores": {k: round(v["score"], 1) for k, v in results.items()},
        "strict": {k: round(v["score_strict"], 1) for k, v in results.items()},
        "mean": round(mean, 1),
        "n": {k: v["n"] for k, v in results.items()},
        "seconds": round(time.perf_counter() - start, 1),
        "stride": args.stride,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    from dlm_decode.cli import run_script

    run_script(main, "train_demo/evaluate.py")
