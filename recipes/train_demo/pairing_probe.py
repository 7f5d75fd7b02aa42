"""Are a model's wrong answers on the random-output tasks wrong people, or right names paired wrong?

    python recipes/train_demo/pairing_probe.py MODEL [--data PB] [--tasks T,...] [--limit 20] [--stride 5]

Each person is two tokens (first name, last name). A task whose answer is not fixed (shuffle, insert_random,
remove_random, replace_random) leaves every entry of the canvas open to several people, and one token per step can
still solve it if each committed token decides the rest: once a first name is on the canvas, its last name has to be
found in the prompt by content (the token after that first name: an induction step). This probe decodes official
samples one token per step (``low_confidence``, the runner's defaults) and sorts every answer into:

* ``solved``: the official metric scores it 1;
* ``paired_wrong``: not solved, but its first names are, as a multiset, the first names of some valid answer and its
  last names those of some valid answer: the right names, recombined (``["Karen Kim", "Jerry Hall", "Jose Marshall"]``
  with one person removed -> ``["Karen Hall", "Jose Marshall"]``);
* ``other``: anything else (a wrong or repeated person, a wrong length, no list).

Valid answers' name multisets: the input's people (shuffle, sort), the input and the new person (insert_random), the
input less any one person (remove_random), the input with any one person replaced by the new one (replace_random).
Prints one line per task and one JSON line last. Samples are every ``--stride``-th official line (all list lengths).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from typing import Any

RANDOM_TASKS = ("waiting_line/shuffle", "waiting_line/insert_random", "waiting_line/remove_random",
                "waiting_line/replace_random")  # fmt: skip
SAME_PEOPLE = ("shuffle", "sort", "copy", "reverse")  # waiting-line tasks whose answer holds the input's people
RULED = (*SAME_PEOPLE, "insert_random", "remove_random", "replace_random")  # the tasks ``valid_people`` knows


def valid_people(task: str, answer: dict[str, Any] | str) -> list[list[str]]:
    """The multisets of people (as lists) a valid answer of ``task`` may hold (``answer``: the sample's answer, a
    dict with the input list, or the answer list itself as JSON text for the fixed-answer tasks such as sort)."""
    people = json.loads(answer) if isinstance(answer, str) else list(answer["input"])
    name = task.split("/")[-1]
    if name in SAME_PEOPLE:
        return [people]
    if name == "insert_random":
        return [[*people, answer["word"]]]
    if name == "remove_random":
        return [people[:i] + people[i + 1 :] for i in range(len(people))]
    if name == "replace_random":
        return [people[:i] + [answer["word"]] + people[i + 1 :] for i in range(len(people))]
    raise ValueError(f"pairing_probe: no rule for {task!r}; tasks with one: waiting_line/{{{','.join(RULED)}}}")


def classify(task: str, answer: dict[str, Any] | str, predicted: list[str] | None, score: float) -> str:
    """``solved``, ``paired_wrong`` or ``other`` (see the module docstring)."""
    if score == 1.0:
        return "solved"
    if not predicted or any(len(p.split()) != 2 for p in predicted):
        return "other"
    firsts, lasts = Counter(p.split()[0] for p in predicted), Counter(p.split()[1] for p in predicted)
    options = valid_people(task, answer)
    first_ok = any(Counter(p.split()[0] for p in ok) == firsts for ok in options)
    last_ok = any(Counter(p.split()[1] for p in ok) == lasts for ok in options)
    return "paired_wrong" if first_ok and last_ok else "other"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="checkpoint directory or demo name")
    ap.add_argument(
        "--data", default=None, help="ParallelBench data directory (default: $DLM_PARALLELBENCH_DATA or ../shared/...)"
    )
    ap.add_argument("--tasks", default=",".join(RANDOM_TASKS), help="comma-separated waiting-line tasks")
    ap.add_argument("--limit", type=int, default=20, help="samples per task")
    ap.add_argument("--stride", type=int, default=5, help="every N-th official sample (all list lengths)")
    ap.add_argument("--batch-size", type=int, default=20)
    args = ap.parse_args(argv)
    if args.limit < 1 or args.stride < 1:
        ap.error("--limit and --stride must be >= 1")
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unruled = [t for t in tasks if not t.startswith("waiting_line/") or t.split("/")[-1] not in RULED]
    if unruled:  # refused before the model loads
        ap.error(f"--tasks: no rule for {', '.join(unruled)}; tasks with one: waiting_line/{{{','.join(RULED)}}}")

    import dataclasses

    import dlm_decode
    from dlm_decode.parallelbench.metrics import parse_list
    from dlm_decode.parallelbench.runner import load_tasks, require_data_dir, run_task

    try:
        data = require_data_dir(args.data)
    except FileNotFoundError as e:
        ap.error(str(e))
    model, tok = dlm_decode.load_model(args.model)
    report: dict[str, Any] = {"model": args.model, "stride": args.stride}
    for task in load_tasks(data, tasks, limit=args.limit * args.stride):
        task = dataclasses.replace(task, samples=task.samples[:: args.stride][: args.limit])
        res = run_task(model, tok, task, {}, batch_size=args.batch_size, progress=False)
        counts = Counter(
            classify(task.name, s["answer"], parse_list(o["text"]), o["score"])
            for o, s in zip(res.outputs, task.samples, strict=True)
        )
        row = {k: counts.get(k, 0) for k in ("solved", "paired_wrong", "other")} | {"n": res.n}
        report[task.name] = row
        print(f"{task.name:28s} solved {row['solved']:3d}  paired wrong {row['paired_wrong']:3d}  other "
              f"{row['other']:3d}  of {row['n']}", file=sys.stderr)  # fmt: skip
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    from dlm_decode.cli import run_script

    run_script(main, "train_demo/pairing_probe.py")
