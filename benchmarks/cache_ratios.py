"""Tokens/s of cache settings over the same sampler without a cache, interleaved, on ParallelBench prompts.

    python benchmarks/cache_ratios.py --model demo-llada --caches "none;dual:refresh_interval=2;elastic:gamma=0.995" \
        --sampler threshold --sampler-opt threshold=0.9 --block-length 32 --limit 10 --rounds 3

A sweep (``dlm-decode parallelbench --sweep``) times its configurations one after another, so on a shared CPU its
tokens/s drift with the load; this script times them interleaved instead: per round, per task and batch of
prompts, every cache setting decodes the same batch, the order rotating per round, and each setting's decode seconds
(``GenerateOutput.seconds``) are summed. Reported per setting: tokens/s (generated slots / s) and its ratio to the
first setting (put ``none`` first), NFE over the first setting's, agreement of the generated tokens with the first
setting. The last line is one JSON object (threads recorded).
"""

from __future__ import annotations

import argparse
import json

import torch

import dlm_decode
from dlm_decode.parallelbench.runner import load_tasks, skip_reason, task_kwargs


def parse_caches(spec: str) -> list[tuple[str, str, dict[str, str]]]:
    """``"none;dual:refresh_interval=2"`` -> [(label, name, options)]."""
    out = []
    for item in spec.split(";"):
        name, _, opts = item.strip().partition(":")
        options = dict(kv.split("=", 1) for kv in opts.split(",") if kv)
        out.append((item.strip(), name, options))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="demo-llada")
    p.add_argument("--data", default=None)
    p.add_argument("--tasks", default=None)
    p.add_argument("--limit", type=int, default=10)
    p.add_argument("--caches", default="none;dual:refresh_interval=2;elastic:gamma=0.995")
    p.add_argument("--sampler", default="threshold")
    p.add_argument("--sampler-opt", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--block-length", type=int, default=32)
    p.add_argument("--gen-length", type=int, default=None, help="generation slots (default: each task's own)")
    p.add_argument("--batch-size", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    settings = parse_caches(a.caches)
    torch.set_num_threads(a.threads)
    model, tok = dlm_decode.load_model(a.model)
    names = a.tasks.split(",") if a.tasks else None
    tasks = [t for t in load_tasks(a.data, names, limit=a.limit) if skip_reason(t) is None]
    sopts = dict(kv.split("=", 1) for kv in a.sampler_opt)
    secs = {s[0]: 0.0 for s in settings}
    slots = {s[0]: 0 for s in settings}
    nfe = {s[0]: 0 for s in settings}
    same = {s[0]: 0 for s in settings}
    for r in range(a.rounds):
        for task in tasks:
            base = {"sampler": a.sampler, "sampler_options": sopts, "block_length": a.block_length}
            if a.gen_length:
                base["gen_length"] = a.gen_length
            kw = task_kwargs(base, task.name, None)
            chats = [task.messages(i) for i in range(len(task))]
            for b0 in range(0, len(chats), a.batch_size):
                batch = chats[b0 : b0 + a.batch_size]
                shift = (r + b0 // a.batch_size) % len(settings)
                outs = {}
                for label, name, opts in settings[shift:] + settings[:shift]:
                    out = dlm_decode.generate(
                        model, batch, tokenizer=tok, chat=True, cache=name, cache_options=opts, **kw
                    )
                    outs[label] = out
                    secs[label] += out.seconds
                    slots[label] += out.generated.numel()
                    nfe[label] += sum(row.nfe for row in out.rows)
                ref = outs[settings[0][0]].generated
                for label, out in outs.items():
                    same[label] += int((out.generated == ref).sum())
    first = settings[0][0]
    rows = []
    for label, _, _ in settings:
        tps = slots[label] / secs[label]
        rows.append(
            {
                "cache": label,
                "tokens_per_s": round(tps, 1),
                "ratio": round(tps / (slots[first] / secs[first]), 3),
                "nfe_ratio": round(nfe[label] / max(nfe[first], 1), 3),  # forwards over the first setting's
                "agreement": round(same[label] / slots[label], 4),
            }
        )
        last = rows[-1]
        print(f"{label:40s} tok/s {last['tokens_per_s']:8.1f}  x{last['ratio']:.3f}  agreement {last['agreement']}")
    meta = {"model": a.model, "sampler": a.sampler, "sampler_options": sopts, "block_length": a.block_length}
    meta["gen_length"] = a.gen_length
    print(json.dumps(meta | {"limit": a.limit, "rounds": a.rounds, "threads": a.threads, "settings": rows}))


if __name__ == "__main__":
    main()
