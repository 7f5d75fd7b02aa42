"""Sweeps of decoding configurations over ParallelBench tasks, one JSONL row per (task, config), and PBx.

    dlm-decode parallelbench --model demo-llada --data DIR --sweep paper --out runs/pb.jsonl --limit 20

A grid (``GRIDS`` or a JSON file with the same keys, or ``{"configs": [...]}`` listing configs outright) expands to
decoding configurations as in the ParallelBench paper: fixed-budget top-k (``low_confidence`` with ``k`` tokens per
step, i.e. ``steps = gen_length / k``), the confidence threshold (Fast-dLLM, 0.5 ... 1.0), the factor rule (0.7 ...
1.9), each at every block length, plus the per-sample oracle bound at every block length. A config whose sampler
is not registered is skipped with a notice; a top-k config whose ``k`` exceeds the block or does not divide a
task's budget evenly over the blocks is left out of the grid. Rows are appended as soon as a task finishes and a
rerun skips every (task, config) already in the file for the same model, data and limit, so a sweep resumes where it
stopped.

**PBx** (ALGORITHMS.md section 9): the highest average tokens per step over the configs whose mean score over all
tasks is >= x (x in 90, 80, 70, 60; scores x 100). Only configs with a row for every task count; the oracle is a
bound, not a decoding config, and never counts.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from dlm_decode.parallelbench.runner import (
    check_task_kwargs,
    render_table,
    run_task,
    skip_reason,
    task_kwargs,
    warm_up,
)
from dlm_decode.parallelbench.tasks import Task, max_new_tokens

PB_LEVELS = (90, 80, 70, 60)

GRIDS: dict[str, dict[str, Any]] = {
    "paper": {
        "block_lengths": [8, 16, 32],
        "top_k": [1, 2, 4, 8, 16, 32],
        "threshold": [0.5, 0.6, 0.7, 0.8, 0.9, 1.0],
        "factor": [0.7, 1.0, 1.3, 1.6, 1.9],
        "oracle": True,
    },
    "quick": {"block_lengths": [32], "top_k": [1, 2, 4], "threshold": [0.7, 0.9], "factor": [1.0], "oracle": True},
}
# grid key -> (sampler name, option name) of the adaptive rules
ADAPTIVE = {"threshold": ("threshold", "threshold"), "factor": ("factor", "factor")}
ROW_KEYS = ("model", "source", "limit")  # rows match a run when these agree


def load_grid(spec: str | dict[str, Any]) -> dict[str, Any]:
    """A grid by name (``paper``, ``quick``), a JSON file path, or a dict."""
    if isinstance(spec, dict):
        return spec
    if spec in GRIDS:
        return GRIDS[spec]
    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"unknown sweep grid {spec!r}: give one of {', '.join(GRIDS)} or a JSON file")
    return json.loads(path.read_text())


def _short(value: Any) -> Any:
    """A file-path option (a Learn2PD filter) is labelled by its file and parent folder, not its full path."""
    if isinstance(value, str) and ("/" in value or value.endswith(".safetensors")):
        p = Path(value)
        return f"{p.parent.name}/{p.name}" if p.parent.name else p.name
    return value


def _label(cfg: dict[str, Any]) -> str:
    s = cfg["sampler"]
    opts = cfg.get("sampler_options") or {}
    if s == "oracle":
        head = "oracle"
    elif cfg.get("k") is not None and s == "low_confidence" and not opts:
        head = f"top-k k={cfg['k']}"
    else:
        shown = {k: _short(v) for k, v in opts.items()}
        head = s + "".join(f" {v}" if len(shown) == 1 else f" {k}={v}" for k, v in shown.items())
    tail = f" b{cfg['block_length']}" if cfg.get("block_length") else ""
    cache = cfg.get("cache") or "none"
    return head + tail + ("" if cache == "none" else f" +{cache}")


def method_of(cfg: dict[str, Any]) -> str:
    """The line a config belongs to in plots: rule family, block length and cache (options vary along it)."""
    s = cfg["sampler"]
    fam = "top-k" if (s == "low_confidence" and cfg.get("k") is not None) else s
    tail = f" b{cfg['block_length']}" if cfg.get("block_length") else ""
    cache = cfg.get("cache") or "none"
    return fam + tail + ("" if cache == "none" else f" +{cache}")


def expand_grid(grid: dict[str, Any], base: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Grid -> configs (dicts: sampler, sampler_options, block_length, k, cache, cache_options, label, method)."""
    base = dict(base or {})
    caches = grid.get("caches") or [base.get("cache") or "none"]
    configs: list[dict[str, Any]] = []
    if "configs" in grid:
        configs = [dict(c) for c in grid["configs"]]
    else:
        for b in grid.get("block_lengths") or [None]:
            if grid.get("oracle"):
                configs.append({"sampler": "oracle", "block_length": b, "cache": "none"})
            for cache in caches:
                for k in grid.get("top_k", []):
                    if b is None or k <= b:
                        configs.append({"sampler": "low_confidence", "k": k, "block_length": b, "cache": cache})
                for key, (sampler, opt) in ADAPTIVE.items():
                    for v in grid.get(key, []):
                        configs.append(
                            {"sampler": sampler, "sampler_options": {opt: v}, "block_length": b, "cache": cache}
                        )
    out = []
    for c in configs:
        c.setdefault("sampler_options", {})
        c.setdefault("cache", "none")
        c.setdefault("cache_options", base.get("cache_options", {}) if c["cache"] == base.get("cache") else {})
        c.setdefault("k", None)
        c.setdefault("block_length", None)
        c.setdefault("label", _label(c))
        c.setdefault("method", method_of(c))
        out.append(c)
    return out


def decoding_of(cfg: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """Generate kwargs of a config: the run's base flags (temperature, seed, ...) overridden by the config."""
    kw = {k: v for k, v in base.items() if k not in ("sampler", "sampler_options", "steps")}
    for key in ("sampler", "sampler_options", "cache", "cache_options", "block_length"):
        kw[key] = cfg[key]
    if cfg.get("steps") is not None:
        kw["steps"] = cfg["steps"]
    return kw


def config_id(cfg: dict[str, Any], base: dict[str, Any]) -> str:
    """Stable id of everything that changes a config's output (not its label)."""
    blob = json.dumps({"decoding": decoding_of(cfg, base), "k": cfg.get("k")}, sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def usable(cfg: dict[str, Any], tasks: list[Task], base: dict[str, Any]) -> str | None:
    """None when the config runs on every task, else why not (unregistered sampler, bad options, uneven k)."""
    for t in tasks:
        try:
            check_task_kwargs(task_kwargs(decoding_of(cfg, base), t.name, cfg.get("k")), t.name)
        except ValueError as e:
            return str(e)
    return None


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    p = Path(path)
    if not p.is_file():
        return []
    rows = []
    for n, line in enumerate(p.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{p}:{n}: not a JSON line ({e}); fix or remove it to resume") from None
    return rows


def run_sweep(
    load: Callable[[], tuple[Any, Any]],
    tasks: list[Task],
    configs: list[dict[str, Any]],
    out: str | Path,
    *,
    base: dict[str, Any] | None = None,
    meta: dict[str, Any] | None = None,
    batch_size: int = 8,
    notice: Callable[[str], None] = print,
    progress: bool = False,
) -> list[dict[str, Any]]:
    """Run every (task, config) not yet in ``out`` and append one JSON row each; returns the run's rows.

    ``load()`` -> (model, tokenizer) is called only if something is left to do. ``meta`` (model, source, limit)
    goes into every row and decides which existing rows count as done.
    """
    from tqdm.auto import tqdm

    base, meta = dict(base or {}), dict(meta or {})
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    scored = []
    for t in tasks:
        why = skip_reason(t)
        if why is None:
            scored.append(t)
        else:
            notice(f"skipping {t.name}: {why}")
    runnable = []
    for c in configs:
        why = usable(c, scored, base)
        if why is None:
            runnable.append(c)
        else:
            notice(f"skipping config {c['label']!r}: {why}")
    mine = [r for r in read_rows(out) if all(r.get(k) == meta.get(k) for k in ROW_KEYS)]
    done = {(r["task"], r["config_id"]) for r in mine}
    todo = [(c, t) for c in runnable for t in scored if (t.name, config_id(c, base)) not in done]
    if done:
        notice(f"resuming {out}: {len(done)} rows done, {len(todo)} to run")
    model = tok = None
    with out.open("a") as f:
        for c, t in tqdm(todo, desc="sweep", disable=not progress):
            if model is None:
                model, tok = load()
                warm_up(model, tok, scored)
            res = run_task(model, tok, t, decoding_of(c, base), k=c.get("k"), batch_size=batch_size)
            row = {**meta, "config_id": config_id(c, base), "label": c["label"], "method": c["method"]}
            row |= {"config": {k: c[k] for k in ("sampler", "sampler_options", "block_length", "k", "cache")}}
            row |= res.to_json()
            f.write(json.dumps(row) + "\n")
            f.flush()
            mine.append(row)
    ids = {config_id(c, base) for c in runnable}
    names = {t.name for t in scored}
    return [r for r in mine if r["config_id"] in ids and r["task"] in names]


# ------------------------------------------------------------------------------------------------ analysis


def _block_of(row: dict[str, Any]) -> int:
    b = (row.get("config") or {}).get("block_length")
    gen = row.get("gen_length") or max_new_tokens(row["task"])
    return min(b or 32, gen)


def attach_oracle(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Give every row the oracle NFE of its task at its (effective) block length, from the oracle rows."""
    bound = {(r["task"], _block_of(r)): r["nfe"] for r in rows if r["config"]["sampler"] == "oracle"}
    out = []
    for r in rows:
        o = r.get("oracle_nfe") or bound.get((r["task"], _block_of(r)))
        out.append(r | {"oracle_nfe": o, "nfe_ratio": (r["nfe"] / o) if (o and r.get("nfe")) else None})
    return out


def config_summary(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per config: mean score / strict / tokens per step / NFE ratio over its tasks, throughput, task count."""
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("score") is not None:
            by.setdefault(r["config_id"], []).append(r)
    out = []
    for cid, rs in by.items():
        n = len(rs)
        ratios = [r["nfe_ratio"] for r in rs if r.get("nfe_ratio")]
        secs = sum(r["seconds"] for r in rs)
        out.append(
            {
                "config_id": cid,
                "label": rs[0]["label"],
                "method": rs[0]["method"],
                "oracle": rs[0]["config"]["sampler"] == "oracle",
                "tasks": sorted(r["task"] for r in rs),
                "score": sum(r["score"] for r in rs) / n,
                "score_strict": sum(r["score_strict"] for r in rs) / n,
                "tokens_per_step": sum(r["tokens_per_step"] for r in rs) / n,
                "nfe_ratio": sum(ratios) / len(ratios) if ratios else None,
                "tokens_per_second": sum(r["n"] * r["gen_length"] for r in rs) / secs if secs > 0 else None,
            }
        )
    return out


def pbx(rows: Iterable[dict[str, Any]], levels: Iterable[int] = PB_LEVELS) -> dict[str, dict[str, Any] | None]:
    """``{"PB90": {"tokens_per_step", "score", "label"} or None, ...}`` over configs covering every task."""
    summary = config_summary(rows)
    all_tasks = sorted({t for s in summary for t in s["tasks"]})
    full = [s for s in summary if not s["oracle"] and s["tasks"] == all_tasks]
    out: dict[str, dict[str, Any] | None] = {}
    for x in levels:
        ok = [s for s in full if s["score"] >= x]
        best = max(ok, key=lambda s: s["tokens_per_step"], default=None)
        out[f"PB{x}"] = (
            None
            if best is None
            else {"tokens_per_step": best["tokens_per_step"], "score": best["score"], "label": best["label"]}
        )
    return out


def format_sweep(rows: list[dict[str, Any]]) -> str:
    """Per-config table (sorted by method, then tokens per step) followed by the PBx lines."""
    summary = sorted(config_summary(rows), key=lambda s: (s["method"], s["tokens_per_step"]))
    head = ["config", "tasks", "score", "strict", "tok/step", "NFE/oracle", "tok/s"]
    body = [
        [
            s["label"],
            str(len(s["tasks"])),
            f"{s['score']:.1f}",
            f"{s['score_strict']:.1f}",
            f"{s['tokens_per_step']:.2f}",
            "-" if s["nfe_ratio"] is None else f"{s['nfe_ratio']:.2f}",
            "-" if s["tokens_per_second"] is None else f"{s['tokens_per_second']:.1f}",
        ]
        for s in summary
    ]
    lines = [render_table(head, body), ""]
    for name, v in pbx(rows).items():
        lines.append(
            f"{name}: " + ("-" if v is None else f"{v['tokens_per_step']:.2f} ({v['label']}, {v['score']:.1f})")
        )
    return "\n".join(lines)
