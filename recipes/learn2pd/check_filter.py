"""Learn2PD step 3 (sanity check): decode held-out prompts with a trained filter and compare with one token per step.

    python -m recipes.learn2pd.check_filter --model demo-llada --prompts runs/learn2pd/prompts --split eval \
        --limit 128 --filter dlm_decode/demo_models/demo-llada/learn2pd_filter.safetensors

For each prompt: LLaDA low-confidence one token per step (the answer the oracle was trained to reproduce), the
learned filter without and with EoTP, the oracle bound, and Fast-dLLM's threshold 0.9 and factor 1.0 for scale.
Reports mean NFE per configuration and how often its answer text equals the one-token-per-step text; ``--record``
stores the result in the filter's json. Benchmark scores come from the ParallelBench runner (``dlm-decode
parallelbench``); this is a quick check of a freshly trained filter. Prints one JSON line last.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch

import dlm_decode
from dlm_decode.cli import run_script
from dlm_decode.decode.oracle import oracle_generate
from dlm_decode.samplers.learned_filter import filter_config
from recipes.learn2pd.oracle_data import load_prompts, model_sha256


def _relative(path: str) -> str:
    """``path`` relative to the working directory when it lies below it (recorded files stay machine-independent)."""
    p = Path(path).resolve()
    return str(p.relative_to(Path.cwd())) if p.is_relative_to(Path.cwd()) else str(path)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", default="runs/learn2pd/prompts", help="prompts.py's set, or a jsonl of prompts")
    ap.add_argument("--split", default="eval")
    ap.add_argument("--limit", type=int, default=128)
    ap.add_argument("--filter", required=True)
    ap.add_argument("--block-length", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--record", action="store_true", help="write the results into the filter's json ('check')")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = dlm_decode.load_model(args.model)
    groups = defaultdict(list)
    for p, n in load_prompts(args.prompts, args.split, args.limit, seed=0):
        groups[n or args.block_length].append(p)
    nfe, same, count = defaultdict(float), defaultdict(int), 0
    for gen, items in sorted(groups.items()):
        for i in range(0, len(items), args.batch_size):
            batch = items[i : i + args.batch_size]
            kw = dict(tokenizer=tok, chat=True, gen_length=gen, block_length=args.block_length)
            ref, orc, _ = oracle_generate(model, batch, **kw)
            outs = {"one_per_step": ref, "oracle": orc}
            for name, eotp in (("learned_filter", False), ("learned_filter_eotp", True)):
                opts = {"filter": args.filter, "eotp": eotp}
                outs[name] = dlm_decode.generate(model, batch, sampler="learned_filter", sampler_options=opts,
                                                 steps=gen, **kw)  # fmt: skip
            for name, smp, opts in (("threshold_0.9", "threshold", {"threshold": 0.9}), ("factor_1.0", "factor", {})):
                outs[name] = dlm_decode.generate(model, batch, sampler=smp, sampler_options=opts, **kw)
            for name, out in outs.items():
                nfe[name] += sum(r.nfe for r in out.rows)
                same[name] += sum(a.text == b.text for a, b in zip(out.rows, ref.rows, strict=True))
            count += len(batch)
    result = {
        "how": f"recipes/learn2pd/check_filter.py --split {args.split} --limit {args.limit} (seed 0), "
        f"block {args.block_length}, temperature 0",
        "prompts": count,
        "mean_nfe": {k: round(v / max(1, count), 2) for k, v in nfe.items()},
        "same_text_as_one_per_step": {k: round(v / max(1, count), 3) for k, v in same.items()},
        "filter": _relative(args.filter),
    }
    cfg = filter_config(args.filter)
    trained_for = (cfg.get("data") or {}).get("model_sha256")
    if trained_for and trained_for != model_sha256(args.model):
        print(f"warning: {args.filter} was trained for other weights than {args.model}'s", file=sys.stderr)
    if args.record:  # keep the check with the filter
        config = Path(args.filter).with_suffix(".json")
        config.write_text(json.dumps(cfg | {"check": result}, indent=2) + "\n")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    run_script(main, "learn2pd/check_filter.py")
