"""How far back in the prompt can a demo model retrieve? Per-entry accuracy of a waiting-line answer by token distance.

    dlm-decode parallelbench --model RUN/export --data $PB --tasks waiting_line/reverse,waiting_line/insert_index \\
        --sampler low_confidence --batch-size 50 --json --outputs > run.json
    python recipes/train_demo/horizon.py run.json --model RUN/export [--data $PB] [--bucket 8]

For every entry of every gold answer (a person ``"First Last"``), the distance is the number of tokens between the
slot where the answer writes that entry's last name (the canvas follows the prompt directly, as the decoder lays it
out) and the last place the prompt holds that last-name token (the question's own list, or the operand in the
instruction line of insert / replace). An entry counts as right when the decoded list has exactly that person at that
index. Accuracies are grouped into ``--bucket``-token bins: a model that finds its answer tokens by relative position
shows a sharp edge (measured 2026-11-25 on the step-10,300 demo-llada: every entry closer than 48 tokens right in
98-100% of cases, every entry at 48 or more wrong, which is why its official reverse score was exactly 50 and
insert_index 0). Entries whose last name the prompt does not hold are skipped (counted in ``skipped``); shuffle and
the ``*_random`` tasks are left out (many valid answers, so no entry has a known place).
Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from stream import chat_prompt_ids  # noqa: E402

from dlm_decode.parallelbench.runner import default_data_dir  # noqa: E402
from dlm_decode.parallelbench.tasks import build_messages, load_task  # noqa: E402


def last_name_id(tok: Any, name: str) -> int:
    """The token of ``name``'s last name as it stands in a JSON list: the one before the closing ``"]``."""
    return tok(json.dumps([name]), add_special_tokens=False)["input_ids"][-2]


def entry_slots(tok: Any, answer: list[str]) -> list[int | None]:
    """Index (in the answer's tokens) of each entry's last-name token, walking the entries in order."""
    ids = tok(json.dumps(answer), add_special_tokens=False)["input_ids"]
    out: list[int | None] = []
    at = 0
    for name in answer:
        target = last_name_id(tok, name)
        hit = next((i for i in range(at, len(ids)) if ids[i] == target), None)
        out.append(hit)
        at = hit + 1 if hit is not None else at
    return out


def distances(tok: Any, prompt_ids: list[int], answer: list[str]) -> list[int | None]:
    """Tokens from each entry's last-name slot in the answer back to that token's last place in the prompt."""
    last_seen = {t: i for i, t in enumerate(prompt_ids)}  # token -> its last index in the prompt
    out: list[int | None] = []
    for name, slot in zip(answer, entry_slots(tok, answer), strict=True):
        where = last_seen.get(last_name_id(tok, name))
        out.append(None if slot is None or where is None else len(prompt_ids) + slot - where)
    return out


def horizon(run: dict, tok: Any, data: str | Path, bucket: int = 8) -> dict[str, Any]:
    """{task: {"bins": {lo: [right, total]}, "skipped": n}} from a runner JSON with ``--outputs``."""
    out: dict[str, Any] = {}
    for row in run["tasks"]:
        name = row["task"]
        if not name.startswith("waiting_line/") or name.endswith("_random") or name.endswith("/shuffle"):
            continue  # the random-output tasks have no one answer whose entries sit at known places
        if "outputs" not in row:
            raise SystemExit(f"{name}: the runner JSON has no outputs; rerun dlm-decode parallelbench with --outputs")
        task = load_task(data, name)
        if len(task.samples) != len(row["outputs"]):
            raise SystemExit(f"{name}: {len(row['outputs'])} outputs for {len(task.samples)} samples in {data}")
        bins: dict[int, list[int]] = defaultdict(lambda: [0, 0])
        skipped = 0
        for sample, result in zip(task.samples, row["outputs"], strict=True):
            prompt = chat_prompt_ids(tok, build_messages(task.config, sample))
            gold = json.loads(sample["answer"])
            try:
                got = json.loads(result["text"])
            except (json.JSONDecodeError, TypeError):
                got = []
            for k, dist in enumerate(distances(tok, prompt, gold)):
                if dist is None:
                    skipped += 1
                    continue
                b = bins[dist // bucket * bucket]
                b[0] += int(isinstance(got, list) and k < len(got) and got[k] == gold[k])
                b[1] += 1
        out[name] = {"bins": dict(sorted(bins.items())), "skipped": skipped}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="JSON of dlm-decode parallelbench --json --outputs (its last line is read)")
    ap.add_argument("--model", required=True, help="the model directory or demo name (its tokenizer is used)")
    ap.add_argument("--data", default=None, help="the ParallelBench directory the run used")
    ap.add_argument("--bucket", type=int, default=8, help="distance bin width in tokens")
    args = ap.parse_args(argv)
    if args.bucket <= 0:
        raise SystemExit("--bucket must be a positive number of tokens")
    path = Path(args.run)
    if not path.is_file():
        raise SystemExit(f"{path}: no such file")
    lines = [ln for ln in path.read_text().splitlines() if ln.startswith("{")]
    if not lines:
        raise SystemExit(f"{path}: no JSON line; expected the output of dlm-decode parallelbench --json --outputs")
    from dlm_decode.models.loading import load_tokenizer

    tok = load_tokenizer(args.model)
    result = horizon(json.loads(lines[-1]), tok, args.data or default_data_dir(), args.bucket)
    for name, r in result.items():
        cells = " ".join(f"{lo}-{lo + args.bucket - 1}:{a}/{n}" for lo, (a, n) in r["bins"].items())
        print(f"{name:28s} {cells}" + (f" (skipped {r['skipped']})" if r["skipped"] else ""))
    print(json.dumps({"horizon": result, "bucket": args.bucket}))
    return 0


if __name__ == "__main__":
    from dlm_decode.cli import run_script

    run_script(main, "train_demo/horizon.py")
