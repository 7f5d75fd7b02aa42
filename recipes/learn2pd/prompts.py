"""The prompt sets Learn2PD's filters are trained and checked on: fresh ParallelBench samples, never the test files.

    python -m recipes.learn2pd.prompts --data PARALLELBENCH_DIR [--out runs/learn2pd/prompts]

Twelve tasks (the ten waiting-line operations, ``puzzle/latin_square_n4``, ``puzzle/sudoku_n4_12``) generated from
the official task configs with fresh seeds (``recipes.prompts.build_split``): an ``eval`` split of ``--n-eval`` per
task (seed 9,000,001) and a ``train`` split of ``--n-train`` per task times the task's weight (seed 7,000,001), with
every official test sample excluded from both and the eval samples from train. Rows: ``task``, ``messages`` (JSON
chat), ``target``, ``sample`` (JSON), ``max_new_tokens``; saved with ``DatasetDict.save_to_disk`` for
``oracle_data.py`` / ``check_filter.py --prompts``. These are the sets the shipped filters were trained on (train
split) and checked on (eval split).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dlm_decode.cli import run_script
from dlm_decode.parallelbench.generator import WAITING_LINE_OPS
from recipes.pb_data import DATA_ENV, data_dir
from recipes.prompts import build_split, official_keys

TASKS = [f"waiting_line/{op}" for op in WAITING_LINE_OPS] + ["puzzle/latin_square_n4", "puzzle/sudoku_n4_12"]
# more rows for the tasks expected to learn slowest (ordering names, reversing, sudoku)
WEIGHTS = {"waiting_line/sort": 1.5, "waiting_line/reverse": 1.25, "puzzle/sudoku_n4_12": 1.5}
TRAIN_SEED, EVAL_SEED = 7_000_001, 9_000_001  # official seeds are five-digit numbers


def build_dataset(pb: Path, n_train: int, n_eval: int) -> tuple[object, dict]:
    """DatasetDict(train, eval) plus the collisions dropped from each split."""
    from datasets import Dataset, DatasetDict  # the train extra; imported only where the set is written

    official = official_keys(pb, TASKS)
    eval_rows, eval_dropped, eval_keys = build_split(pb, n_eval, EVAL_SEED, tasks=TASKS, exclude=official)
    held = {t: official[t] | eval_keys[t] for t in TASKS}
    train_rows, train_dropped, _ = build_split(pb, n_train, TRAIN_SEED, tasks=TASKS, weights=WEIGHTS, exclude=held)
    ds = DatasetDict({"train": Dataset.from_list(train_rows), "eval": Dataset.from_list(eval_rows)})
    return ds, {"train_dropped": train_dropped, "eval_dropped": eval_dropped}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None, help=f"official ParallelBench directory (default: ${DATA_ENV})")
    ap.add_argument("--out", default="runs/learn2pd/prompts")
    ap.add_argument("--n-train", type=int, default=6000, help="train samples per task (before weights)")
    ap.add_argument("--n-eval", type=int, default=32, help="held-out samples per task")
    args = ap.parse_args(argv)
    ds, report = build_dataset(data_dir(args.data), args.n_train, args.n_eval)
    ds.save_to_disk(args.out)
    (Path(args.out) / "collisions.json").write_text(json.dumps(report, indent=1))
    print(f"train {len(ds['train'])} rows, eval {len(ds['eval'])} rows -> {args.out}")


if __name__ == "__main__":
    run_script(main, "learn2pd/prompts.py")
