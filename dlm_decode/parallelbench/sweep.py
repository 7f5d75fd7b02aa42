"""Sweeps of decoding configurations over ParallelBench tasks, one JSONL row per (task, config), and PBx and AUP.

    dlm-decode parallelbench --model demo-llada --data DIR --sweep paper --out runs/pb.jsonl --limit 20

A grid (``GRIDS`` or a JSON file with the same keys, or ``{"configs": [...]}`` listing configs outright) expands to
decoding configurations as in the ParallelBench paper: fixed-budget top-k (``low_confidence`` with ``k`` tokens per
step, i.e. ``steps = gen_length / k``), the confidence threshold (Fast-dLLM, 0.5 ... 1.0), the factor rule (0.7 ...
1.9), each at every block length, plus the per-sample oracle bound at every block length. Before anything is
decoded: a grid key outside ``GRID_KEYS`` (or a config key outside ``CONFIG_KEYS``) is an error listing the known
ones; so is a config naming an unknown sampler or cache, or an option they do not have (the valid ones are listed);
a config that does not fit a task (a top-k ``k`` that does not divide the task's budget evenly over the blocks, ...)
is skipped with a notice, and a grid with no config left is an error. A top-k ``k`` larger than the block is left
out of the grid. Rows are appended as soon as a task finishes and a rerun skips every (task, config) already in the
file for the same model, data and limit, so a sweep resumes where it stopped (Ctrl-C drops the task being decoded;
a half-written last line is dropped with a notice).

**PBx** (ALGORITHMS.md section 9): the highest average tokens per step over the configs whose mean score over all
tasks is >= x (x in 90, 80, 70, 60; scores x 100). Only configs with a row for every task count; the oracle is a
bound, not a decoding config, and never counts.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from dlm_decode.cache import get_cache
from dlm_decode.core.config import resolve_lengths
from dlm_decode.core.files import read_json_object
from dlm_decode.core.inputs import ModelFacts
from dlm_decode.core.words import plural, some
from dlm_decode.parallelbench.aup import aup_table
from dlm_decode.parallelbench.runner import (
    Interrupted,
    check_task_kwargs,
    render_table,
    run_task,
    skip_reason,
    task_kwargs,
    warm_up,
)
from dlm_decode.parallelbench.tasks import Task, max_new_tokens
from dlm_decode.samplers import get_sampler

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
GRID_KEYS = ("block_lengths", "caches", "configs", "factor", "oracle", "threshold", "top_k")
CONFIG_KEYS = ("block_length", "cache", "cache_options", "k", "label", "method", "sampler", "sampler_options", "steps")
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
    return read_json_object(path, "sweep grid")


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
    """Grid -> configs (dicts: sampler, sampler_options, block_length, k, cache, cache_options, label, method).
    Unknown keys, and a grid that expands to nothing, are errors."""
    _check_keys(grid, GRID_KEYS, "sweep grid")
    if "configs" in grid and len(grid) > 1:
        rest = ", ".join(sorted(set(grid) - {"configs"}))
        raise ValueError(f"sweep grid: 'configs' lists the configs outright; drop the other key(s) {rest}")
    for i, c in enumerate(grid.get("configs") or []):
        _check_keys(c, CONFIG_KEYS, f"sweep grid config {i}")
        if "sampler" not in c:
            raise ValueError(f"sweep grid config {i} has no 'sampler'; keys: {', '.join(CONFIG_KEYS)}")
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
    if not out:
        raise ValueError(f"sweep grid expands to no config: give top_k, threshold, factor, oracle or configs ({grid})")
    return out


def _check_keys(d: Any, known: tuple[str, ...], what: str) -> None:
    if not isinstance(d, dict):
        raise ValueError(f"{what} must be a JSON object with keys {', '.join(known)}; got {d!r}")
    unknown = sorted(set(d) - set(known))
    if unknown:
        raise ValueError(f"{what}: unknown key(s) {', '.join(unknown)}; known keys: {', '.join(known)}")


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


def usable(cfg: dict[str, Any], tasks: list[Task], base: dict[str, Any], facts: ModelFacts | None = None) -> str | None:
    """None when the config runs on every task, else why not (unregistered sampler, bad options, uneven k; given the
    model's ``facts``, also what needs the model: e.g. a shipped Learn2PD filter trained for another block length)."""
    for t in tasks:
        try:
            check_task_kwargs(task_kwargs(decoding_of(cfg, base), t.name, cfg.get("k")), t.name, facts)
        except ValueError as e:
            return str(e)
    return None


def check_out(out: str | Path, what: str = "out") -> Path:
    """The sweep's JSONL path, checked writable before anything is decoded (its folders are created): a directory,
    a path under a regular file, or a place that cannot be written (read-only file system, no permission) is an
    error naming ``what`` (the option) and the path."""
    out = Path(out)
    if out.is_dir():
        example = str(out / "sweep.jsonl")
        raise ValueError(f"{what} {str(out)!r} is a directory; give a JSONL file path such as {example!r}")
    for parent in out.parents:
        if parent.exists() and not parent.is_dir():
            raise ValueError(f"{what} {str(out)!r}: {str(parent)!r} is a file, not a directory")
    existed = out.exists()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("a"):
            pass
    except OSError as e:
        raise ValueError(f"{what} {str(out)!r} cannot be written ({e.strerror or e})") from None
    if not existed:
        out.unlink()
    return out


def check_config(cfg: dict[str, Any]) -> None:
    """A config's sampler and cache resolve with their options (independent of any task); errors list the valid
    names and options."""
    try:
        if cfg["sampler"] != "oracle":  # the oracle is built per batch from its reference answers
            get_sampler(cfg["sampler"], cfg["sampler_options"])
        get_cache(cfg["cache"], cfg["cache_options"])
    except ValueError as e:
        raise ValueError(f"sweep config {cfg['label']!r}: {e}") from None


def runnable_configs(
    configs: list[dict[str, Any]],
    tasks: list[Task],
    base: dict[str, Any],
    notice: Callable[[str], None],
    facts: ModelFacts | None = None,
) -> list[dict[str, Any]]:
    """The configs that run on every task (with ``facts``: on this model). A bad name or option is an error
    (``check_config``); a config that does not fit a task or the model is skipped with a notice, before anything is
    decoded; no config left is an error naming why each one failed."""
    runnable, why_not = [], []
    for c in configs:
        check_config(c)
        why = usable(c, tasks, base, facts)
        if why is None:
            runnable.append(c)
        else:
            why_not.append(f"{c['label']!r}: {why}")
    if not runnable:
        raise ValueError("no config of the grid runs on these tasks: " + "; ".join(why_not))
    for why in why_not:
        notice(f"skipping config {why}")
    return runnable


def _stderr_notice(msg: str) -> None:
    print(f"notice: {msg}", file=sys.stderr)


def read_rows(path: str | Path, notice: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """The rows of a sweep JSONL. A broken last line (the run was killed mid-write) is dropped with a ``notice``
    (default: a line on stderr); a broken line before it is an error."""
    p = Path(path)
    if not p.is_file():
        return []
    try:
        lines = p.read_bytes().decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{p} is not UTF-8 text (byte at offset {e.start}): not a sweep JSONL (a binary file?)"
        ) from None
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            if i == last:
                (notice or _stderr_notice)(f"dropped a half-written last line of {p} (line {i + 1}: {line[:30]!r}...)")
                break
            raise ValueError(f"{p}:{i + 1}: not a JSON line ({e}); fix or remove it to resume") from None
    return rows


def _cut_partial_line(path: Path) -> None:
    """End the file with a complete line before appending: cut a half-written last line (``read_rows`` dropped it)
    or add the missing newline after a complete one."""
    data = path.read_bytes() if path.is_file() else b""
    body = data.rstrip()
    if not body:
        return
    start = body.rfind(b"\n") + 1
    try:
        json.loads(body[start:])
    except ValueError:
        with path.open("r+b") as f:
            f.truncate(start)
        return
    if not data.endswith(b"\n"):
        with path.open("ab") as f:
            f.write(b"\n")


def scored_tasks(tasks: list[Task], notice: Callable[[str], None]) -> list[Task]:
    """The tasks that can be scored here; the others are skipped with one notice (text tasks share one reason, so
    it is said once, with the count and names); none left is an error."""
    scored, skipped = [], {}
    for t in tasks:
        why = skip_reason(t)
        if why is None:
            scored.append(t)
        else:
            skipped.setdefault(why, []).append(t.name)
    for why, names in skipped.items():
        notice(f"skipping {plural(len(names), 'task')} ({some(names)}): {why}")
    if not scored:
        raise ValueError("no task of this sweep can be scored here: " + ", ".join(t.name for t in tasks))
    return scored


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
    facts: ModelFacts | None = None,
    append: bool = False,
) -> list[dict[str, Any]]:
    """Run every (task, config) not yet in ``out`` and append one JSON row each; returns the run's rows.

    ``out`` holding rows written with other settings (``ROW_KEYS``: model, data source, limit) is an error naming
    the difference, unless ``append`` (then they stay in the file and are left out of the returned rows).

    ``load()`` -> (model, tokenizer) is called only if something is left to do, after every check; ``facts`` (the
    model's ``config.json`` facts and checkpoint directory, ``models.loading.model_facts``) lets those checks skip a
    config that cannot run on this model before the model is loaded; without them the same check
    (``runnable_configs``) runs once the model is loaded, before the first decode. ``meta`` (model, source, limit)
    goes into every row and decides which existing rows count as done. ``progress``: one bar over the (config, task)
    runs. Ctrl-C raises ``runner.Interrupted`` with the rows written so far and the path.
    """
    from tqdm.auto import tqdm

    base, meta = dict(base or {}), dict(meta or {})
    out = check_out(out)
    scored = scored_tasks(tasks, notice)
    runnable = runnable_configs(configs, scored, base, notice, facts)
    found = read_rows(out, notice)
    mine = [r for r in found if same_settings(r, meta)]
    if len(mine) < len(found) and not append:
        raise ValueError(other_settings(out, found, meta))
    done = {(r["task"], r["config_id"]) for r in mine}
    todo = [(c, t) for c in runnable for t in scored if (t.name, config_id(c, base)) not in done]
    if done:
        notice(f"resuming {out}: {plural(len(done), 'row')} done, {len(todo)} to run")
    out.parent.mkdir(parents=True, exist_ok=True)
    _cut_partial_line(out)
    model = tok = None
    fit = None  # without ``facts``: the ids of the configs the loaded model runs (the same check, after loading)
    bar = tqdm(todo, desc="sweep", unit="run", disable=not progress)
    try:
        with out.open("a") as f:
            for c, t in bar:
                bar.set_postfix_str(f"{c['label']} / {t.name}")
                if model is None:
                    model, tok = load()
                    if facts is None:
                        runnable = runnable_configs(runnable, scored, base, notice, ModelFacts.of_model(model))
                        fit = {config_id(r, base) for r in runnable}
                    warm_up(model, tok, scored)
                if fit is not None and config_id(c, base) not in fit:
                    continue
                res = run_task(model, tok, t, decoding_of(c, base), k=c.get("k"), batch_size=batch_size)
                row = {**meta, "config_id": config_id(c, base), "label": c["label"], "method": c["method"]}
                row |= {"config": {k: c[k] for k in ("sampler", "sampler_options", "block_length", "k", "cache")}}
                row |= res.to_json()
                f.write(json.dumps(row) + "\n")
                f.flush()
                mine.append(row)
    except KeyboardInterrupt as e:
        raise Interrupted(mine, out) from e
    except OSError as e:  # the disk filled up, the file system went read-only: the rows written so far stay
        raise ValueError(f"{out}: writing a row failed ({e.strerror or e}); rows written before are kept") from None
    finally:
        bar.close()
    ids = {config_id(c, base) for c in runnable}
    names = {t.name for t in scored}
    return [r for r in mine if r["config_id"] in ids and r["task"] in names]


def same_settings(row: dict[str, Any], meta: dict[str, Any]) -> bool:
    """Whether ``row`` was written by a run with ``meta``'s settings (``ROW_KEYS``)."""
    return all(row.get(k) == meta.get(k) for k in ROW_KEYS)


def other_settings(out: Path, rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The error for a sweep file holding rows of other settings: how many, and what differs."""
    others = [r for r in rows if not same_settings(r, meta)]
    diffs = sorted(
        {f"{k} {r.get(k)!r} (this run: {meta.get(k)!r})" for r in others for k in ROW_KEYS if r.get(k) != meta.get(k)}
    )
    return (
        f"{out} holds {plural(len(others), 'row')} written with other settings: {'; '.join(diffs)}; pass --append "
        "(append=True) to add this run's rows beside them, or give another --out"
    )


# ------------------------------------------------------------------------------------------------ analysis


def _block_of(row: dict[str, Any]) -> int:
    """The block a row decoded with: its config's, clipped to the gen length as ``task_kwargs`` does, else the
    default (the oracle rows it is matched with are blockwise)."""
    b = (row.get("config") or {}).get("block_length")
    gen = row.get("gen_length") or max_new_tokens(row["task"])
    return resolve_lengths(gen, min(b, gen) if b else None)[0]


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
    last: dict[str, dict[str, dict[str, Any]]] = {}  # config -> task -> row (a repeated row counts once)
    for r in rows:
        if r.get("score") is not None:
            last.setdefault(r["config_id"], {})[r["task"]] = r
    out = []
    for cid, per_task in last.items():
        rs = list(per_task.values())
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
                "slots_per_forward": _mean([_slots_per_forward(r) for r in rs]),
                "token_forwards": _mean([r.get("token_forwards") for r in rs]),  # rows written before: None
                "accepted_steps_per_call": _mean([r.get("accepted_steps_per_call") for r in rs]),
                "nfe_ratio": sum(ratios) / len(ratios) if ratios else None,
                "tokens_per_second": sum(r["n"] * r["gen_length"] for r in rs) / secs if secs > 0 else None,
                "threads": _threads(rs),
            }
        )
    return out


def _slots_per_forward(row: dict[str, Any]) -> float | None:
    """Query slots computed per sequential forward of one task row (drafts multiply it; None: not recorded)."""
    tf, tps, gen = row.get("token_forwards"), row.get("tokens_per_step"), row.get("gen_length")
    return tf * tps / gen if tf is not None and tps and gen else None


def _mean(vals: list[float | None]) -> float | None:
    vals = [v for v in vals if v is not None]
    return sum(vals) / len(vals) if vals else None


def _threads(rows: list[dict[str, Any]]) -> int | list[int] | None:
    """The torch thread count the rows were timed with (a list when they differ, None when not recorded)."""
    found = sorted({r["threads"] for r in rows if r.get("threads") is not None})
    return found[0] if len(found) == 1 else (found or None)


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
    # draft-and-verify configs (lossless) buy fewer sequential forwards with more compute: show both sides
    if any((s["accepted_steps_per_call"] or 1.0) > 1.0 for s in summary):
        head += ["steps/call", "slots/fwd"]
        for s, line in zip(summary, body, strict=True):
            calls, slots = s["accepted_steps_per_call"], s["slots_per_forward"]
            line += ["-" if calls is None else f"{calls:.2f}", "-" if slots is None else f"{slots:.1f}"]
    lines = [render_table(head, body), ""]
    for name, v in pbx(rows).items():
        lines.append(
            f"{name}: " + ("-" if v is None else f"{v['tokens_per_step']:.2f} ({v['label']}, {v['score']:.1f})")
        )
    table = aup_table(rows)
    if table:
        tasks = sorted({t for per in table.values() for t in per if t != "mean"})
        lines += ["", "AUP (accuracy under parallelism, per method and task):"]
        body = [
            [m, *(f"{per[t]:.1f}" if t in per else "-" for t in tasks), f"{per['mean']:.1f}"]
            for m, per in table.items()
        ]
        lines.append(render_table(["method", *tasks, "mean"], sorted(body)))
    return "\n".join(lines)
