"""Where a demo model's sorting fails: pairs of people put out of order, by how close their first names are.

    python recipes/train_demo/sort_probe.py MODEL [--parallelbench PB] [--close 100]

ParallelBench's sort orders people by their full name as a string, i.e. by first name. The script decodes every
official sort sample one token per step (``low_confidence``, steps = gen length), and for the wrong answers that are
permutations of the list counts the pairs in the wrong order, grouped by the distance of their two first names in
the alphabetical list of the names file (1: neighbours); beside it, how many pairs of each distance the file holds.
``--close N`` also decodes N fresh official-format sort prompts whose people have neighbouring first names
(``aux_rows.close_sort_sample``, the ``aux/sort_close`` rows) the same way and reports how many it solves. One
JSON line last.
("Twenty-third round" in the README: the shipped demo-llada inverts neighbours at chance.)
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

FAR = 5  # distances from FAR up are counted together


def first_name(person: str) -> str:
    return person.split(" ", 1)[0]


def inversions_by_distance(
    lists: Sequence[Sequence[str]], answers: Sequence[Any], firsts: Sequence[str]
) -> tuple[Counter, Counter, int]:
    """For each input list and decoded answer (a list of people or None): the pairs of the list by first-name
    distance (capped at ``FAR``), the pairs an answer that is a permutation of its list puts in the wrong order (same
    distances), and how many wrong answers are not permutations of their list."""
    rank = {n: i for i, n in enumerate(sorted(set(firsts)))}

    def dist(a: str, b: str) -> int:
        return min(abs(rank[first_name(a)] - rank[first_name(b)]), FAR)

    pairs, inverted, other = Counter(), Counter(), 0
    for people, answer in zip(lists, answers, strict=True):
        for i, a in enumerate(people):
            for b in people[i + 1 :]:
                pairs[dist(a, b)] += 1
        if answer == sorted(people):
            continue
        if not isinstance(answer, list) or sorted(answer) != sorted(people):
            other += 1
            continue
        for i, a in enumerate(answer):
            for b in answer[i + 1 :]:
                if a > b:
                    inverted[dist(a, b)] += 1
    return pairs, inverted, other


def _parse(text: str | None) -> Any:
    try:
        return json.loads(text or "")
    except json.JSONDecodeError:
        return None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="checkpoint directory or demo name")
    ap.add_argument("--parallelbench", default="/work/shared/data/parallelbench")
    ap.add_argument("--close", type=int, default=0, help="also decode N fresh sort_close prompts")
    ap.add_argument("--seed", type=int, default=4242)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    pb = Path(args.parallelbench)
    if not (pb / "waiting_line" / "sort.jsonl").is_file():
        raise SystemExit(f"--parallelbench {pb}: no waiting_line/sort.jsonl there")
    if args.close < 0:
        raise SystemExit("--close must be >= 0")
    import torch

    import dlm_decode
    from dlm_decode.parallelbench.generator import load_names
    from dlm_decode.parallelbench.runner import run_task
    from dlm_decode.parallelbench.tasks import Task, load_task

    torch.set_num_threads(args.threads)
    model, tok = dlm_decode.load_model(args.model)
    names = load_names(pb / "first_last_names.yaml")
    task = load_task(pb, "waiting_line/sort")
    decoding = {"sampler": "low_confidence", "steps": 32, "block_length": 32, "temperature": 0.0}
    res = run_task(model, tok, task, decoding, batch_size=50)
    lists = [json.loads(s["input"]["context"]) for s in task.samples]
    answers = [_parse(o["text"]) for o in res.outputs]
    pairs, inverted, other = inversions_by_distance(lists, answers, names[0])
    out: dict[str, Any] = {
        "model": args.model,
        "sort_score": round(res.score, 1),
        "inverted_by_distance": {f"{d}{'+' if d == FAR else ''}": [inverted[d], pairs[d]] for d in sorted(pairs)},
        "wrong_not_permutation": other,
    }
    if args.close:  # decoded and scored as the official samples are
        from stream import RowStream, close_sort_sample

        stream = RowStream(pb, tok, seed=args.seed)
        rng = random.Random(args.seed)
        samples = [close_sort_sample(s, rng, names) for s in stream.samples("waiting_line/sort", args.close, args.seed)]
        close = run_task(model, tok, Task(task.name, task.config, samples), decoding, batch_size=50)
        out["sort_close_exact"] = [sum(o["score"] == 1.0 for o in close.outputs), args.close]
    for d, (inv, n) in out["inverted_by_distance"].items():
        print(f"first-name distance {d:>3}: {inv:4d} of {n:4d} pairs inverted")
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    from dlm_decode.cli import run_script

    run_script(main, "train_demo/sort_probe.py")
