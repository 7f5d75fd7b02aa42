"""How much a bidirectional demo model's answers need the prompt to attend to the answer slots (issue 49).

    python benchmarks/prompt_blind.py --model demo-llada --data ../shared/data/parallelbench --limit 10

Decodes the official samples twice without a cache, one token per step (``low_confidence``): as the model runs, and
with the prompt *blind*, its queries masked off every key at or after the prompt (the answer slots and their MASKs;
the answer's queries still see everything). A model whose prompt states did not depend on the answer would score the
same both ways, and its prefix cache would be exact. The patch is applied to ``masked_attention`` in this process
only (the last layer's narrowed forward computes answer slots alone and is left as it is). One JSON line last:
the mean and per-task scores of both ways.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from collections.abc import Iterator

import torch

import dlm_decode.decode.forward as forward
import dlm_decode.models.common as common
from dlm_decode.cli import main as cli


def blind_attention(attention, prompt_len):  # noqa: ANN001, ANN201
    """``attention`` (``masked_attention``'s signature) with the prompt's queries kept off the keys from
    ``prompt_len()`` on, in full-canvas forwards (queries = keys); other forwards compute answer slots only and pass."""

    def blind(q, k, v, *, key_mask=None, key_index=None, **kw):  # noqa: ANN001, ANN003, ANN202
        b, h, n, s = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
        if key_index is not None or n != s:
            return attention(q, k, v, key_mask=key_mask, key_index=key_index, **kw)
        p = prompt_len()
        slot = torch.arange(n, device=q.device)
        visible = ~((slot[:, None] < p) & (slot[None, :] >= p))[None, None].expand(b, 1, n, s)  # [B, 1, N, S]
        if key_mask is not None:
            visible = visible & key_mask[:, None, None, :]
        if k.shape[1] != h:
            k, v = k.repeat_interleave(h // k.shape[1], 1), v.repeat_interleave(h // v.shape[1], 1)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=visible)

    return blind


@contextlib.contextmanager
def prompt_blind() -> Iterator[None]:
    """Within the block, every decode's full-canvas attention is ``blind_attention`` at the decode's prompt length."""
    run_model, attention, prompt = forward.run_model, common.masked_attention, {"len": 0}

    def run(model, state, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        prompt["len"] = state.prompt_len
        return run_model(model, state, *a, **k)

    forward.run_model = run
    common.masked_attention = blind_attention(attention, lambda: prompt["len"])
    try:
        yield
    finally:
        forward.run_model, common.masked_attention = run_model, attention


def score(args: argparse.Namespace) -> dict:
    """The runner's JSON summary of one pass (every task of --data, the first --limit samples each)."""
    argv = ["parallelbench", "--model", args.model, "--data", args.data, "--sampler", "low_confidence"]
    argv += ["--limit", str(args.limit), "--batch-size", "50", "--threads", str(args.threads), "--json"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli(argv)
    if rc:
        raise SystemExit(f"dlm-decode {' '.join(argv)} exited {rc}")
    d = json.loads(out.getvalue().strip().splitlines()[-1])
    return {"score": d["summary"]["score"], "tasks": {t["task"]: t["score"] for t in d["tasks"]}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="demo-llada")
    ap.add_argument("--data", required=True, help="the official ParallelBench directory")
    ap.add_argument("--limit", type=int, default=10, help="samples per task")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    plain = score(args)
    with prompt_blind():
        blind = score(args)
    for task in plain["tasks"]:
        print(f"{task:32s} {plain['tasks'][task]:6.1f} {blind['tasks'][task]:6.1f}")
    print(f"{'mean':32s} {plain['score']:6.1f} {blind['score']:6.1f}")
    print(json.dumps({"model": args.model, "limit": args.limit, "as_run": plain, "prompt_blind": blind}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
