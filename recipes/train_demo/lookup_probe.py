"""Does a demo checkpoint look a last name up by its first name, or read it off a position? One JSON line out.

    python recipes/train_demo/lookup_probe.py RUN/export [--kind next] [--n 200] [--seed 12345] [--len 2-3]

On ``--n`` fresh ``last`` or ``next`` rows (``stream.LAST`` / ``stream.NEXT``: one person asked for by a first name
that is unique in the list; bare, unpadded, drawn from held-out copy samples) the answer's last-name slot is masked
alone and its argmax sorted by where the predicted last name sits in the list relative to the asked-for person:

* ``right``: the asked-for person's last name; ``right_not_first``: the same over the rows whose person is not the
  list's first entry, where the position route gives nothing (chance among the list's last names: about 1 / n);
* ``first_entry_not_first``: the first entry's last name where the person is another one: the position route (the
  first answer slot's last name is the first entry's in copy, the task these models learned first);
* ``offsets``: list offset of a wrong prediction that is in the list (-1: the entry before), and ``not_in_list``.

Why (eighteenth round): the teacher-forced ``probe.py --find`` / ``--next`` numbers mix the two routes. h3's 0.29 on
next rows was the position route: right 14% where the person is not the first entry (chance ~20%), the first entry's
last name 35%.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from probe import aux_rows_and_samples  # noqa: E402
from stream import LAST, NEXT, RowStream, list_lengths  # noqa: E402

KINDS = {"last": LAST, "next": NEXT}


def classify(people: Sequence[str], asked: int, predicted: str) -> str:
    """Where ``predicted`` (a last name) sits against ``people[asked]``: "right", "first_entry" (the first entry's
    last name while another person was asked for), "offset+k" / "offset-k" (another entry's) or "not_in_list"."""
    lasts = [p.split(" ", 1)[1] for p in people]
    if predicted == lasts[asked]:
        return "right"
    if predicted not in lasts:
        return "not_in_list"
    if predicted == lasts[0]:
        return "first_entry"
    return f"offset{lasts.index(predicted) - asked:+d}"


def summarise(labels: Sequence[tuple[int, str]]) -> dict[str, Any]:
    """(asked index, classify label) per row -> the shares the module docstring names."""
    n = len(labels)
    later = [lab for i, lab in labels if i > 0]
    offsets = Counter(lab for _, lab in labels if lab.startswith("offset"))
    return {
        "n": n,
        "right": round(sum(lab == "right" for _, lab in labels) / max(n, 1), 3),
        "n_not_first": len(later),
        "right_not_first": round(sum(lab == "right" for lab in later) / max(len(later), 1), 3),
        "first_entry_not_first": round(sum(lab == "first_entry" for lab in later) / max(len(later), 1), 3),
        "not_in_list": round(sum(lab == "not_in_list" for _, lab in labels) / max(n, 1), 3),
        "offsets": dict(sorted(offsets.items())),
    }


def probe(
    model: Any, tok: Any, stream: RowStream, kind: str, n: int, seed: int, lengths: tuple[int, int] | None = None
) -> dict[str, Any]:
    labels = []
    rows, samples = aux_rows_and_samples(stream, n, seed, False, False, KINDS[kind], lengths)
    for (prompt, resp), sample in zip(rows, samples, strict=True):
        ids = torch.tensor([[*prompt, model.mask_token_id, *resp[1:]]])  # the last-name slot masked alone
        with torch.no_grad():
            top = int(model(ids).logits[0, len(prompt)].argmax())
        people = json.loads(sample["input"]["context"])
        (first,) = json.loads(re.search(r"last (\[[^\]]*\])", tok.decode(prompt)).group(1))  # the asked-for name
        asked = [p.split(" ", 1)[0] for p in people].index(first)
        labels.append((asked, classify(people, asked, tok.decode([top]).strip())))
    return summarise(labels)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="checkpoint directory (a run's export/) or demo name")
    ap.add_argument("--kind", choices=sorted(KINDS), default="next", help="row kind (default next)")
    ap.add_argument("--n", type=int, default=200, help="rows")
    ap.add_argument("--seed", type=int, default=12345)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--len", default=None, help="people per list, LO-HI (a stage's len); default the copy task's")
    ap.add_argument(
        "--data", default=None, help="ParallelBench data directory (default: $DLM_PARALLELBENCH_DATA or ../shared/...)"
    )
    args = ap.parse_args(argv)
    if args.n < 1:
        ap.error(f"--n must be >= 1, got {args.n}")
    lengths = list_lengths(args.len, "--len") if args.len else None
    import dlm_decode
    from dlm_decode.parallelbench.runner import require_data_dir

    try:
        data = require_data_dir(args.data)
    except FileNotFoundError as err:
        ap.error(str(err))
    torch.set_num_threads(args.threads)
    model, tok = dlm_decode.load_model(args.model)
    model.eval()
    stream = RowStream(data, tok, seed=0)
    result = {
        "model": str(args.model),
        "kind": args.kind,
        **probe(model, tok, stream, args.kind, args.n, args.seed, lengths),
    }
    if lengths:
        result["len"] = list(lengths)
    training = Path(args.model) / "training.json"
    if training.is_file():
        result["step"] = json.loads(training.read_text())["step"]
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    from dlm_decode.cli import run_script

    run_script(main, "train_demo/lookup_probe.py")
