"""Do the random-output tasks fail in the model or in the decoding order? One entry left masked, the rest given.

    python recipes/train_demo/exclusion_probe.py MODEL [--data PB] [--limit 40] [--seed 0]

For ``replace_random`` / ``insert_random`` / ``shuffle`` samples (the official prompts, ``build_messages``), a valid
answer is drawn (a random position for the new person; a random permutation for shuffle), written into the canvas
with the same response layout the model trains on (``stream.encode_row``: answer, ``<|eot_id|>``, EOS padding), and
only the tokens of one entry are masked: the new person's (replace / insert) or a random one (shuffle). Every other
entry is visible, so exactly one answer is valid for the masked entry, the person that is missing from the canvas.
A model that can decode these tasks one token per step must get this right: it is the last step of any decoding
order. The probe prints, per task, how often the masked entry's tokens are all predicted right (argmax) and the mean
probability of its first token, one JSON line last.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from stream import encode_row  # noqa: E402

from dlm_decode.parallelbench.generator import list_to_str  # noqa: E402

TASKS = ("waiting_line/replace_random", "waiting_line/insert_random", "waiting_line/shuffle")


def one_missing(task: str, sample: dict, rng: random.Random) -> tuple[list[str], int]:
    """A valid answer and the index of the entry to mask (given the others, only one person fits there)."""
    people = list(sample["answer"]["input"])
    if task.endswith("shuffle"):
        answer = people[:]
        rng.shuffle(answer)
        return answer, rng.randrange(len(answer))
    new = sample["answer"]["word"]
    if task.endswith("insert_random"):
        at = rng.randrange(len(people) + 1)
        return people[:at] + [new] + people[at:], at
    at = rng.randrange(len(people))
    return people[:at] + [new] + people[at + 1 :], at


def entry_span(tok: Any, answer: list[str], at: int) -> tuple[int, int]:
    """Token span [k0, k1) of entry ``at``'s name inside the tokenised answer list."""
    head = list_to_str(answer[:at])[:-1] + (", " if at else "") + '"'
    k0 = len(tok(head, add_special_tokens=False)["input_ids"])
    k1 = len(tok(head + answer[at], add_special_tokens=False)["input_ids"])
    return k0, k1


def masked_rows(tok: Any, task: Any, limit: int, seed: int) -> list[tuple[torch.Tensor, int, int, torch.Tensor]]:
    """Per sample: (prompt + response ids [T] with one entry masked, its span [lo, hi), the true ids there)."""
    from dlm_decode.parallelbench.tasks import build_messages

    rng = random.Random(seed)
    rows = []
    for sample in task.samples[:limit]:
        answer, at = one_missing(task.name, sample, rng)
        prompt, resp = encode_row(tok, build_messages(task.config, sample), list_to_str(answer), 32)
        k0, k1 = entry_span(tok, answer, at)
        ids = torch.tensor(prompt + resp)  # [T]
        lo, hi = len(prompt) + k0, len(prompt) + k1
        want = ids[lo:hi].clone()
        ids[lo:hi] = tok.mask_token_id
        rows.append((ids, lo, hi, want))
    return rows


def probe_task(model: Any, rows: list[tuple[torch.Tensor, int, int, torch.Tensor]]) -> dict[str, float]:
    """Share of rows whose masked entry is predicted right (argmax), mean p of its first token, and n."""
    right, p_first = 0, 0.0
    for ids, lo, hi, want in rows:
        with torch.no_grad():  # denoise applies the model's logit shift (Dream reads slot i from hidden i - 1)
            logits = model.denoise(ids[None], torch.arange(ids.numel())[None], region=(lo, hi))[0]  # [hi - lo, V]
        right += bool(torch.equal(logits.argmax(-1), want))
        p_first += float(logits[0].softmax(-1)[want[0]])
    return {"right": right / len(rows), "p_first": p_first / len(rows), "n": len(rows)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="checkpoint directory or demo-llada / demo-dream")
    ap.add_argument(
        "--data", default=None, help="ParallelBench data directory (default: $DLM_PARALLELBENCH_DATA or ../shared/...)"
    )
    ap.add_argument("--limit", type=int, default=40, help="samples per task (the first N of the file)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    if args.limit < 1:
        ap.error(f"--limit must be >= 1, got {args.limit}")
    from dlm_decode.models import load_model
    from dlm_decode.parallelbench.runner import require_data_dir
    from dlm_decode.parallelbench.tasks import load_task

    torch.set_num_threads(args.threads)
    try:  # a missing directory or file fails before the weights load
        data = require_data_dir(args.data)
        tasks = [load_task(data, t) for t in TASKS]
    except FileNotFoundError as err:
        raise SystemExit(str(err)) from None
    model, tok = load_model(args.model, dtype=torch.float32)
    model.eval()
    result = {"model": args.model, "seed": args.seed}
    for task in tasks:
        got = probe_task(model, masked_rows(tok, task, args.limit, args.seed))
        result[task.name] = {k: round(v, 3) for k, v in got.items()}
        print(f"{task.name:30s} masked entry right {result[task.name]['right']:.3f}  p(first token) "
              f"{result[task.name]['p_first']:.3f}  n {result[task.name]['n']}")  # fmt: skip
    print(json.dumps(result))


if __name__ == "__main__":
    from dlm_decode.cli import run_script

    run_script(main, "train_demo/exclusion_probe.py")
