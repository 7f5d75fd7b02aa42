"""``dlm-decode demo`` (``make demo``): the shipped demo model decoding ParallelBench-style tasks with every sampler
and every cache registered, in a few minutes on a laptop CPU.

    dlm-decode demo [--model demo-llada] [--samples 8] [--quick] [--json]

Tasks are waiting-line and puzzle tasks regenerated with a held-out seed (``HELD_OUT_SEED``: neither the official
test files, whose samples are excluded, nor the demo model's training or evaluation seeds) from the task configs of
the ParallelBench data directory (``--data``, ``$DLM_PARALLELBENCH_DATA`` or ``../shared/data/parallelbench``).
Configurations: the baseline (``low_confidence``, one token per step, no cache), naive top-k (``low_confidence`` at
``k = 4`` tokens per step), every other registered sampler with its default options and no cache (fixed-budget ones
at ``k = 4`` as well), the primary parallel sampler (``threshold`` when registered) with every registered cache, and
the per-sample oracle bound (Learn2PD; its reference decode is the baseline's, so it costs one extra pass); at most
``--max-configs`` of them. A configuration that does not apply to the model (say a sampler that needs a trained
filter) is listed with the reason instead of a score. Every (configuration, task) pair decodes the task's samples as
one batch; the table gives task, sampler, cache, score (mean x 100), NFE (mean per sample), tokens per step (gen
length / NFE) and tokens per second of decoding, then the means over tasks. Defaults (6 tasks x 4 samples, about 22
configurations) take a few minutes on two CPU cores with the demo model; ``--quick`` well under a minute. The demo
runs one torch thread by default: the demo model's matrices are small, so a second thread gains little, and on a
busy machine spinning threads made decoding over ten times slower (measured here during training runs).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

HELD_OUT_SEED = 3_000_017  # official seeds are five-digit; the demo model trains on 7_000_001+ and evals on 9_000_001+
DEMO_TASKS = [
    "waiting_line/copy",
    "waiting_line/reverse",
    "waiting_line/replace_random",
    "waiting_line/shuffle",
    "puzzle/latin_square_n4",
    "puzzle/sudoku_n4_12",
]
QUICK_TASKS = ["waiting_line/copy", "waiting_line/shuffle", "puzzle/sudoku_n4_12"]
BASELINE = "low_confidence"
PRIMARY = ("threshold", "factor", BASELINE)  # the first registered one is crossed with every cache
QUICK_SAMPLERS = ("threshold", "factor", "local_leap", "entropy_threshold")
FIXED_BUDGET_K = 4  # fixed-budget samplers other than the baseline: tokens per step


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="demo-llada", help="shipped demo name or checkpoint directory")
    p.add_argument("--data", default=None, help="ParallelBench data directory (task configs and names)")
    p.add_argument("--samples", type=int, default=None, help="samples per task (default 4; --quick: 2)")
    p.add_argument("--tasks", default=None, help="comma-separated tasks (default: 6 waiting-line and puzzle tasks)")
    p.add_argument("--seed", type=int, default=HELD_OUT_SEED, help="task generation seed (default: held out)")
    p.add_argument("--max-configs", type=int, default=24, help="cap on sampler x cache configurations")
    p.add_argument("--quick", action="store_true", help="3 tasks, 2 samples, a few samplers and caches")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1, see the docstring)")
    p.add_argument("--json", action="store_true", help="print one JSON object last")


def demo_configs(quick: bool = False, max_configs: int = 24) -> list[dict[str, Any]]:
    """(label, sampler, cache, k) configurations from the registries at call time; the first (the baseline) also
    computes the oracle bound, reported as its own row."""
    from dlm_decode.cache import CACHES
    from dlm_decode.samplers import SAMPLERS, get_sampler

    def cfg(sampler: str, cache: str = "none", k: int | None = None) -> dict[str, Any]:
        return {"sampler": sampler, "cache": cache, "k": k, "label": sampler + (f" k={k}" if k else "")}

    configs = [cfg(BASELINE, k=1) | {"oracle": True}, cfg(BASELINE, k=FIXED_BUDGET_K)]
    names = [s for s in SAMPLERS if s not in (BASELINE, "oracle")]
    if quick:
        names = [s for s in QUICK_SAMPLERS if s in SAMPLERS]
    for s in names:
        configs.append(cfg(s, k=FIXED_BUDGET_K if get_sampler(s).fixed_budget else None))
    primary = next(s for s in PRIMARY if s in SAMPLERS)
    caches = [c for c in CACHES if c != "none"]
    if quick:
        caches = [c for c in ("prefix", "dual") if c in CACHES] or caches[:2]
    k = None if not get_sampler(primary).fixed_budget else 1
    configs += [cfg(primary, c, k) for c in caches]
    return configs[: max(1, max_configs)]


def _load_model(name: str, dtype: str, device: str):
    import dlm_decode
    from dlm_decode.models.loading import DEMO_DIR, DEMO_MODELS

    try:
        return dlm_decode.load_model(name, dtype=dtype, device=device)
    except FileNotFoundError as e:
        if name in DEMO_MODELS:
            raise FileNotFoundError(
                f"the demo model {name!r} is not shipped yet (expected at {DEMO_DIR / name}); it is trained by "
                "recipes/train_demo — until it lands, run the demo on any LLaDA/Dream checkpoint directory with a "
                "tokenizer: dlm-decode demo --model DIR"
            ) from e
        raise


def run(args: argparse.Namespace) -> int:
    import torch
    from tqdm.auto import tqdm

    from dlm_decode.parallelbench.runner import load_tasks, run_task, warm_up

    if args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    torch.set_num_threads(args.threads)
    samples = args.samples if args.samples is not None else (2 if args.quick else 4)
    if samples < 1:
        raise ValueError(f"--samples must be >= 1, got {samples}")
    names = [t.strip() for t in args.tasks.split(",")] if args.tasks else (QUICK_TASKS if args.quick else DEMO_TASKS)
    try:
        tasks = load_tasks(args.data, names, limit=samples, generate_seed=args.seed, exclude_official=True)
    except KeyError as e:
        raise ValueError(e.args[0]) from None
    model, tok = _load_model(args.model, args.dtype, args.device)
    if tok is None:
        raise ValueError(f"{args.model} ships no tokenizer: the demo needs one for its chat prompts")
    configs = demo_configs(args.quick, args.max_configs)
    warm_up(model, tok, tasks)
    print(
        f"demo: {args.model}, {len(tasks)} tasks x {samples} samples (seed {args.seed}), {len(configs)} configs",
        file=sys.stderr,
    )
    rows: list[dict[str, Any]] = []
    oracle_rows: list[dict[str, Any]] = []
    units = [(c, t) for c in configs for t in tasks]
    for c, t in tqdm(units, desc="demo", unit="run", file=sys.stderr):
        decoding = {"sampler": c["sampler"], "cache": c["cache"], "temperature": 0.0, "seed": 0}
        row = {"task": t.name, "config": c["label"], "sampler": c["sampler"], "cache": c["cache"]}
        try:
            res = run_task(model, tok, t, decoding, k=c["k"], batch_size=samples, oracle=bool(c.get("oracle")))
        except ValueError as e:  # the configuration does not apply to this model / task
            rows.append(row | {"skipped": str(e).splitlines()[0]})
            continue
        rows.append(row | {k: v for k, v in res.to_json().items() if k in _KEEP})
        if res.oracle_nfe:
            bound = {
                "score": res.oracle_score,
                "nfe": res.oracle_nfe,
                "tokens_per_step": res.gen_length / res.oracle_nfe,
            }
            oracle_rows.append(
                {"task": t.name, "config": "oracle (bound)", "sampler": "oracle", "cache": "none"} | bound
            )
    rows += oracle_rows
    print(format_demo(rows))
    if args.json:
        print(json.dumps({"model": str(args.model), "seed": args.seed, "samples": samples, "rows": rows}))
    return 0


_KEEP = ("score", "score_strict", "nfe", "tokens_per_step", "tokens_per_second", "seconds", "skipped", "errors")


def format_demo(rows: list[dict[str, Any]]) -> str:
    """Rows grouped by task, then the mean over tasks per configuration, then the configurations that did not run."""
    from dlm_decode.parallelbench.runner import render_table

    def f(v: Any, d: int = 1) -> str:
        return "-" if v is None else f"{v:.{d}f}"

    head = ["task", "sampler", "cache", "score", "NFE", "tok/step", "tok/s"]
    body, skipped = [], {}
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    for r in sorted(rows, key=lambda r: tasks.index(r["task"])):  # stable: configurations keep their order
        if r.get("skipped"):
            skipped.setdefault(r["config"] + " / " + r["cache"], r["skipped"])
            continue
        body.append(
            [
                r["task"],
                r["config"],
                r["cache"],
                f(r["score"]),
                f(r["nfe"]),
                f(r["tokens_per_step"], 2),
                f(r.get("tokens_per_second")),
            ]
        )
    order: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        if not r.get("skipped"):
            order.setdefault((r["config"], r["cache"]), []).append(r)
    for (cfg, cache), rs in order.items():
        n = len(rs)
        secs = sum(r.get("seconds") or 0.0 for r in rs)
        tokens = sum(r["tokens_per_second"] * r["seconds"] for r in rs if r.get("tokens_per_second"))
        tps = tokens / secs if secs else None
        body.append(
            [
                "all tasks",
                cfg,
                cache,
                f(sum(r["score"] for r in rs) / n),
                f(sum(r["nfe"] for r in rs) / n),
                f(sum(r["tokens_per_step"] for r in rs) / n, 2),
                f(tps),
            ]
        )
    out = render_table(head, body)
    if skipped:
        out += "\n\nnot run:\n" + "\n".join(f"  {k}: {v}" for k, v in skipped.items())
    return out
