"""Elastic-Cache's drift statistics per layer on ParallelBench prompts: why it refreshes (or does not) on a model.

    python benchmarks/elastic_drift.py --model demo-llada --limit 10 --gammas 0.9,0.99 --block-length 32

For each ``gamma`` (and the other ``elastic`` options given), every task of ``--data`` (or ``--tasks``) is decoded
with ``--sampler`` (default ``threshold`` 0.9) under ``cache=elastic``, and the call statistics
(``GenerateOutput.cache_stats``) are summed over tasks: row-steps refreshing from each layer, row-steps that reused
every layer, and the mean drift ``sigma`` (cosine of the tracked tokens' attention rows between steps) per layer.
A low ``sigma`` at a layer means the tokens the window attends to most change their attention there from step to
step: a cache reused at that depth is stale. Also printed: the share of (slot, layer) pairs computed against the
full recomputation, and agreement with the same sampler without a cache. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math

import torch

import dlm_decode
from dlm_decode.parallelbench.runner import load_tasks, skip_reason, task_kwargs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="demo-llada")
    p.add_argument("--data", default=None)
    p.add_argument("--tasks", default=None)
    p.add_argument("--limit", type=int, default=10)
    p.add_argument("--gammas", default="0.9")
    p.add_argument("--window-length", type=int, default=16)
    p.add_argument("--block-length", type=int, default=32)
    p.add_argument("--sampler", default="threshold")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    gammas = [float(g) for g in a.gammas.split(",")]
    torch.set_num_threads(a.threads)
    model, tok = dlm_decode.load_model(a.model)
    names = a.tasks.split(",") if a.tasks else None
    tasks = [t for t in load_tasks(a.data, names, limit=a.limit) if skip_reason(t) is None]
    n_layers = model.kv_shape()[0]
    report = {"model": a.model, "limit": a.limit, "block_length": a.block_length, "sampler": a.sampler, "runs": []}
    for gamma in gammas:
        total = {"from": [0] * n_layers, "reused": 0, "sum": [0.0] * n_layers, "n": [0] * n_layers}
        slot_layers = full_slot_layers = same = slots = 0
        for task in tasks:
            kw = task_kwargs({"sampler": a.sampler, "block_length": a.block_length}, task.name, None)
            chats = [task.messages(i) for i in range(len(task))]
            for b0 in range(0, len(chats), a.batch_size):
                batch = chats[b0 : b0 + a.batch_size]
                ref = dlm_decode.generate(model, batch, tokenizer=tok, chat=True, **kw)
                opts = {"gamma": gamma, "window_length": a.window_length}
                out = dlm_decode.generate(
                    model, batch, tokenizer=tok, chat=True, cache="elastic", cache_options=opts, **kw
                )
                st = out.cache_stats
                for i in range(n_layers):
                    total["from"][i] += st["refresh_from_layer"][i]
                    total["n"][i] += st["drift_tests"][i]
                    if st["drift_mean"][i] is not None:
                        total["sum"][i] += st["drift_mean"][i] * st["drift_tests"][i]
                total["reused"] += st["reused_all_layers"]
                slot_layers += st["slot_layers"]
                full_slot_layers += out.nfe * len(batch) * out.sequences.shape[1] * n_layers
                same += int((out.generated == ref.generated).sum())
                slots += ref.generated.numel()
        mean = [s / n if n else math.nan for s, n in zip(total["sum"], total["n"], strict=True)]
        run = {
            "gamma": gamma,
            "refresh_from_layer": total["from"],
            "reused_all_layers": total["reused"],
            "drift_mean": [round(m, 4) for m in mean],
            "compute_share": round(slot_layers / full_slot_layers, 4),
            "agreement": round(same / slots, 4),
        }
        report["runs"].append(run)
        print(f"gamma {gamma}: " + ", ".join(f"{k} {v}" for k, v in run.items() if k != "gamma"), flush=True)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
