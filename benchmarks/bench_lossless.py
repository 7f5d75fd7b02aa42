"""Lossless draft-and-verify (``lossless``, FreeDave) against the static rule it reproduces and ``threshold`` 0.9.

    python benchmarks/bench_lossless.py                                          # both demo models, 6 tasks, 8 each
    python benchmarks/bench_lossless.py --models demo-llada --tasks waiting_line/copy --limit 2 --repeats 1 --warmup 0
    python benchmarks/bench_lossless.py --drafts 2,4,8 --batch-size 8 --device cuda
    python benchmarks/bench_lossless.py --models demo-llada --cache prefix --drafts 2,3,4     # every config cached

Per model and ParallelBench task (the official test samples, first ``--limit``; each task's own gen length), three
kinds of configuration decode the same chats: the static rule (LLaDA ``low_confidence``, block 32, or Dream
``maskgit_plus``, one block; steps = gen length: one token per step), ``lossless`` with each ``--drafts`` following
that rule, and ``threshold`` 0.9 (block 32, lossy: its tokens may differ). Runs are interleaved: each repeat decodes
every configuration once, in turn, so a slow spell of the machine hits all of them. Reported per configuration:
sequential forwards per sample (NFE, the latency measure), token-forwards per sample (query slots computed: the
compute, which the drafts multiply), accepted static steps per forward, tokens/s (median over repeats, with the
min-max spread; time is ``GenerateOutput.seconds``), the share of samples whose tokens equal the static rule's
(``lossless`` must give 1.0) and the task score (x 100). ``torch_threads`` is recorded. The last line printed is one
JSON object.

``--cache prefix`` / ``dual`` runs every configuration with that cache: ``lossless`` then reproduces the static
rule's output *with the same cache* (its reference), and a draft's forward computes only the active block's slots
beside the cached prompt, so the stacked drafts cost far less than a whole canvas each.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import dlm_decode  # noqa: E402
from dlm_decode.parallelbench.metrics import score_sample  # noqa: E402
from dlm_decode.parallelbench.runner import default_data_dir, load_tasks, render_table  # noqa: E402
from dlm_decode.parallelbench.tasks import max_new_tokens  # noqa: E402

DEFAULT_TASKS = (
    "waiting_line/copy,waiting_line/reverse,waiting_line/sort,waiting_line/insert_index,"
    "puzzle/latin_square_n4,puzzle/sudoku_n4_12"
)
STATIC_RULE = {"llada": "low_confidence", "Dream": "maskgit_plus"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="demo-llada,demo-dream", help="demo names or checkpoint directories")
    p.add_argument("--data", default=None, help="ParallelBench data directory (default: as dlm-decode parallelbench)")
    p.add_argument("--tasks", default=DEFAULT_TASKS, help="comma-separated task names")
    p.add_argument("--limit", type=int, default=8, help="samples per task (the first N of the official file)")
    p.add_argument("--drafts", default="4", help="comma-separated draft counts of lossless")
    p.add_argument("--batch-size", type=int, default=1, help="rows decoded together")
    p.add_argument("--repeats", type=int, default=3, help="timed passes (interleaved over the configurations)")
    p.add_argument("--warmup", type=int, default=1, help="untimed passes first")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--cache",
        default="none",
        choices=("none", "prefix", "dual"),
        help="the cache of every configuration (lossless stays exact against the static rule with the same cache)",
    )
    return p.parse_args(argv)


def configs(model: Any, drafts: list[int], cache: str = "none") -> list[dict[str, Any]]:
    rule = STATIC_RULE[model.config.model_type]
    block = 32 if rule == "low_confidence" else None
    out = [{"label": f"{rule} (static)", "sampler": rule, "block_length": block}]
    for d in drafts:
        opts = {"drafts": d, "rule": rule}
        out.append({"label": f"lossless d={d}", "sampler": "lossless", "sampler_options": opts, "block_length": block})
    out.append({"label": "threshold 0.9", "sampler": "threshold", "sampler_options": {"threshold": 0.9}})
    return [{**c, "cache": cache} for c in out]


def decode(model: Any, tok: Any, chats: list, cfg: dict[str, Any], gen: int, batch: int) -> dict[str, Any]:
    """One pass over the chats: generated ids per sample and the pass's statistics."""
    ids, texts, nfe, accepted, token_forwards, seconds = [], [], 0, 0, 0, 0.0
    kw = {k: v for k, v in cfg.items() if k != "label"}
    for b0 in range(0, len(chats), batch):
        out = dlm_decode.generate(model, chats[b0 : b0 + batch], tokenizer=tok, chat=True, gen_length=gen, **kw)
        ids += [r.generated_ids for r in out.rows]
        texts += [r.text or "" for r in out.rows]
        nfe += sum(r.nfe for r in out.rows)
        accepted += sum(r.accepted_steps for r in out.rows)
        token_forwards += out.token_forwards
        seconds += out.seconds
    return {"ids": ids, "texts": texts, "nfe": nfe, "accepted": accepted, "tf": token_forwards, "s": seconds}


def bench_task(model: Any, tok: Any, task: Any, cfgs: list[dict[str, Any]], args: argparse.Namespace) -> list[dict]:
    chats = [task.messages(i) for i in range(len(task))]
    gen = max_new_tokens(task.name)
    n = len(chats)
    seconds: dict[str, list[float]] = {c["label"]: [] for c in cfgs}
    first: dict[str, dict[str, Any]] = {}
    for r in range(args.warmup + args.repeats):
        for c in cfgs:  # interleaved: every configuration once per pass
            res = decode(model, tok, chats, c, gen, args.batch_size)
            first.setdefault(c["label"], res)
            if r >= args.warmup:
                seconds[c["label"]].append(res["s"])
    static = first[cfgs[0]["label"]]["ids"]
    rows = []
    for c in cfgs:
        res, secs = first[c["label"]], seconds[c["label"]] or [first[c["label"]]["s"]]
        tps = [n * gen / s for s in secs if s > 0]
        key = task.config if "metric" in task.config else task.name  # as the runner scores
        scores = [score_sample(key, t, task.samples[i])["score"] for i, t in enumerate(res["texts"])]
        rows.append(
            {
                "task": task.name,
                "config": c["label"],
                "sampler": c["sampler"],
                "sampler_options": c.get("sampler_options") or {},
                "cache": c["cache"],
                "gen_length": gen,
                "n": n,
                "sequential_forwards": res["nfe"] / n,
                "token_forwards": res["tf"] / n,
                "accepted_steps_per_call": res["accepted"] / res["nfe"] if res["nfe"] else None,
                "tokens_per_s": statistics.median(tps) if tps else None,
                "tokens_per_s_spread": [min(tps), max(tps)] if tps else None,
                "same_as_static": sum(a == b for a, b in zip(res["ids"], static, strict=True)) / n,
                "score": 100.0 * sum(scores) / n,
            }
        )
    base = rows[0]
    for row in rows:
        row["forwards_vs_static"] = base["sequential_forwards"] / row["sequential_forwards"]
        row["speedup_vs_static"] = (
            row["tokens_per_s"] / base["tokens_per_s"] if row["tokens_per_s"] and base["tokens_per_s"] else None
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    data = args.data or default_data_dir()
    names = [t for t in args.tasks.split(",") if t]
    tasks = load_tasks(data, names, limit=args.limit)
    drafts = [int(d) for d in args.drafts.split(",") if d]
    results = []
    for name in args.models.split(","):
        model, tok = dlm_decode.load_model(name, device=args.device)
        cfgs = configs(model, drafts, args.cache)
        for task in tasks:
            for row in bench_task(model, tok, task, cfgs, args):
                results.append({"model": name, **row})
    head = ["model", "task", "config", "NFE", "x fwd", "tok-fwd", "steps/fwd", "tok/s", "x tok/s", "same", "score"]

    def f(v: Any, d: int = 2) -> str:
        return "-" if v is None else f"{v:.{d}f}"

    body = [
        [
            r["model"],
            r["task"],
            r["config"],
            f(r["sequential_forwards"], 1),
            f(r["forwards_vs_static"]),
            f(r["token_forwards"], 0),
            f(r["accepted_steps_per_call"]),
            f(r["tokens_per_s"], 1),
            f(r["speedup_vs_static"]),
            f(r["same_as_static"]),
            f(r["score"], 1),
        ]
        for r in results
    ]
    print(render_table(head, body))
    meta = {"torch_threads": torch.get_num_threads(), "device": args.device, "batch_size": args.batch_size}
    meta["cache"] = args.cache
    meta |= {"limit": args.limit, "repeats": args.repeats, "warmup": args.warmup, "drafts": drafts}
    print(json.dumps({"benchmark": "lossless", **meta, "results": results}))
    return 0


if __name__ == "__main__":
    from dlm_decode.cli import run_script

    run_script(main, "benchmarks/bench_lossless.py")
