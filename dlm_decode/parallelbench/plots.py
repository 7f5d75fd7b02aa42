"""Plots of a ParallelBench sweep, written as PNG files next to its JSONL (matplotlib, Agg backend).

    from dlm_decode.parallelbench.plots import write_plots
    write_plots("runs/pb.jsonl")            # -> runs/pb.score_vs_parallelism.png, .pareto.png, .decoding_order.png

* **score vs tokens per step**, one panel per task, one line per method (rule family x block length x cache; its
  options vary along the line), the per-sample oracle as a bound (a star at its tokens per step and score, and a
  dotted vertical line: no decoding of that model can be more parallel on average and still give those answers);
* **Pareto frontier** of mean score over tasks against throughput (generated tokens per second of decoding, with the
  torch thread count of the timings in the axis label), every config a point, the frontier as a step line (the
  oracle is left out: it needs the answer);
* **decoding order** of one sample: for each config, the step at which each generation slot was committed (from
  ``generate(trace=True)``), slots cut or filled without a commit in grey. A ``task`` without such rows is an error
  listing the tasks that have them, raised before any file is written.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dlm_decode.core.words import plural
from dlm_decode.parallelbench.sweep import ROW_KEYS, attach_oracle, config_summary, read_rows, same_settings

PLOTS = ("score_vs_parallelism", "pareto", "decoding_order")


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _colors(methods: list[str]) -> dict[str, Any]:
    plt = _plt()
    cmap = plt.get_cmap("tab10" if len(methods) <= 10 else "tab20")
    return {m: cmap(i % cmap.N) for i, m in enumerate(sorted(methods))}


def plot_score_vs_parallelism(rows: list[dict[str, Any]], path: str | Path) -> Path:
    plt = _plt()
    rows = [r for r in rows if r.get("score") is not None]
    tasks = sorted({r["task"] for r in rows})
    methods = sorted({r["method"] for r in rows if r["config"]["sampler"] != "oracle"})
    colors = _colors(methods)
    ncol = min(4, max(1, len(tasks)))
    nrow = (len(tasks) + ncol - 1) // ncol
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 3.3 * nrow), squeeze=False)
    for ax, task in zip(axes.flat, tasks, strict=False):
        mine = [r for r in rows if r["task"] == task]
        for m in methods:
            pts = sorted((r["tokens_per_step"], r["score"]) for r in mine if r["method"] == m)
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", ms=3.5, lw=1.4, color=colors[m], label=m)
        for r in mine:
            if r["config"]["sampler"] == "oracle":
                ax.axvline(r["tokens_per_step"], color="black", ls=":", lw=1)
                ax.plot(r["tokens_per_step"], r["score"], marker="*", ms=11, color="black", ls="none")
        ax.set_title(task, fontsize=10)
        ax.set_xscale("log", base=2)
        ax.set_ylim(-3, 103)
        ax.grid(alpha=0.3)
        ax.set_xlabel("tokens per step", fontsize=8)
        ax.set_ylabel("score", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(tasks) :]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    handles.append(plt.Line2D([], [], color="black", marker="*", ls=":", ms=10))
    labels.append("oracle bound (per-sample)")
    fig.legend(handles, labels, loc="lower center", ncol=min(5, len(labels)), fontsize=8, frameon=False)
    fig.suptitle("ParallelBench: score vs parallelism", fontsize=12)
    fig.tight_layout(rect=(0, 0.04 + 0.02 * ((len(labels) - 1) // 5), 1, 0.97))
    return _save(fig, path)


def plot_pareto(rows: list[dict[str, Any]], path: str | Path) -> Path:
    plt = _plt()
    summary = [s for s in config_summary(rows) if not s["oracle"] and s["tokens_per_second"]]
    all_tasks = sorted({t for s in summary for t in s["tasks"]})
    summary = [s for s in summary if s["tasks"] == all_tasks]
    methods = sorted({s["method"] for s in summary})
    colors = _colors(methods)
    fig, ax = plt.subplots(figsize=(7, 4.8))
    for m in methods:
        pts = [(s["tokens_per_second"], s["score"]) for s in summary if s["method"] == m]
        ax.scatter(*zip(*pts, strict=True), color=colors[m], label=m, s=28, zorder=3)
    front, best = [], float("-inf")
    for s in sorted(summary, key=lambda s: (-s["tokens_per_second"], -s["score"])):
        if s["score"] > best:
            front.append(s)
            best = s["score"]
    if front:
        xs = [s["tokens_per_second"] for s in front]
        ax.step(xs, [s["score"] for s in front], where="post", color="black", lw=1.2, label="Pareto frontier")
        for s in front:
            xy = (s["tokens_per_second"], s["score"])
            ax.annotate(s["label"], xy, fontsize=7, xytext=(4, 3), textcoords="offset points")
    ax.margins(x=0.15)
    ax.set_ylim(-3, 103)
    threads = sorted({str(r["threads"]) for r in rows if r.get("threads") is not None})
    on = f", {'/'.join(threads)} torch thread{'s' if threads != ['1'] else ''}" if threads else ""
    ax.set_xlabel(f"throughput (generated tokens / s of decoding{on})")
    ax.set_ylabel(f"mean score over {plural(len(all_tasks), 'task')}")
    ax.set_title("ParallelBench: accuracy vs speed")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    return _save(fig, path)


def plot_decoding_order(rows: list[dict[str, Any]], path: str | Path, task: str | None = None) -> Path:
    import numpy as np

    plt = _plt()
    rows = [r for r in rows if r.get("trace")]
    tasks = check_plot_task(rows, task, str(path))
    if task is None:
        task = next((t for t in tasks if "copy" in t), tasks[0] if tasks else None)
    mine = sorted((r for r in rows if r["task"] == task), key=lambda r: (r["method"], r["tokens_per_step"]))
    if len(mine) > 24:  # keep the figure readable: an even spread over the configs
        mine = [mine[round(i * (len(mine) - 1) / 23)] for i in range(24)]
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.32 * max(1, len(mine))))
    if mine:
        grid = np.ma.masked_less(np.array([r["trace"] for r in mine], dtype=float), 0)
        cmap = plt.get_cmap("viridis").with_extremes(bad="lightgrey")
        im = ax.imshow(grid, aspect="auto", cmap=cmap, interpolation="nearest")
        fig.colorbar(im, ax=ax, label="step that committed the slot", pad=0.01)
        ax.set_yticks(range(len(mine)), [f"{r['label']} ({r['nfe']:.0f} steps)" for r in mine], fontsize=7)
    ax.set_xlabel("generation slot")
    ax.set_title(f"decoding order, first sample of {task}", fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def check_plot_task(rows: list[dict[str, Any]], task: str | None, where: str) -> list[str]:
    """The tasks with a decoding trace in ``rows``; a ``task`` among none of them is an error listing them."""
    tasks = sorted({r["task"] for r in rows if r.get("trace")})
    if task is not None and task not in tasks:
        raise ValueError(f"plot task {task!r} has no rows with a decoding order in {where}; tasks: {', '.join(tasks)}")
    return tasks


def _save(fig: Any, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path


def last_settings(rows: list[dict[str, Any]], where: Path, notice: Callable[[str], None]) -> list[dict[str, Any]]:
    """The rows written with the settings (``ROW_KEYS``) of the last row; a notice when others are left out."""
    if not rows:
        return rows
    mine = [r for r in rows if same_settings(r, rows[-1])]
    if len(mine) < len(rows):
        shown = ", ".join(f"{k} {rows[-1].get(k)!r}" for k in ROW_KEYS)
        notice(
            f"{where} holds rows of several settings; plotting the {plural(len(mine), 'row')} of the last ({shown}), "
            f"leaving out {plural(len(rows) - len(mine), 'row')} of others"
        )
    return mine


def _stderr_notice(msg: str) -> None:
    print(f"notice: {msg}", file=sys.stderr)


def write_plots(
    jsonl: str | Path,
    rows: list[dict[str, Any]] | None = None,
    task: str | None = None,
    notice: Callable[[str], None] | None = None,
) -> dict[str, Path]:
    """The three PNGs beside ``jsonl`` (``<stem>.<plot>.png``), from ``rows`` or the file's rows. A file holding
    rows of several runs' settings (``sweep --append``) is plotted with the rows of the last run's settings, and a
    ``notice`` (default: a line on stderr) says how many rows were left out."""
    jsonl = Path(jsonl)
    if rows is None:
        if not jsonl.is_file():
            raise FileNotFoundError(f"sweep file {jsonl} not found (--plot reads the JSONL a --sweep wrote to --out)")
        rows = last_settings(read_rows(jsonl), jsonl, notice or _stderr_notice)
    rows = attach_oracle(rows)
    if not rows:
        raise ValueError(f"{jsonl}: no rows to plot")
    check_plot_task(rows, task, str(jsonl))  # before any file is written
    stem = jsonl.with_suffix("")
    return {
        "score_vs_parallelism": plot_score_vs_parallelism(rows, f"{stem}.score_vs_parallelism.png"),
        "pareto": plot_pareto(rows, f"{stem}.pareto.png"),
        "decoding_order": plot_decoding_order(rows, f"{stem}.decoding_order.png", task),
    }
