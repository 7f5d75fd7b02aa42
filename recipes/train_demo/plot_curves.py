"""Learning curves of demo-model runs from their probe logs (one ``probe.py`` JSON line per export).

    python recipes/train_demo/plot_curves.py RUN_DIR [RUN_DIR ...] --out curves.png

One row of panels per run, one panel per measure: teacher-forced retrieval (``tf``), greedy exact match on short
rows (``exact``) and, where probed, the official-prompt score on held-out samples (``full``); one line per task,
and a dashed one per task for probes run with ``probe.py --padded`` (the two formats are different measurements).
Reads ``RUN_DIR/probe.jsonl``; a half-written last line is skipped.

    python recipes/train_demo/plot_curves.py RUN_DIR [RUN_DIR ...] --evals --out evals.png

``--evals`` draws the held-out scores that ``train.py --eval-every`` writes into ``RUN_DIR/log.jsonl`` instead: one
panel per run, one line per task, the mean in black.

    python recipes/train_demo/plot_curves.py RUN_DIR [RUN_DIR ...] --loss --out loss.png

``--loss`` draws every run's training-loss EMA from ``RUN_DIR/log.jsonl`` in one panel (log scale), a dotted line
where a run's stage changes (a new stage's rows raise the loss for a while: that jump is not a regression).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _records(path: Path, missing: str) -> list[dict]:
    """The JSON lines of ``path`` (a half-written line skipped); a missing file exits with ``missing``."""
    if not path.is_file():
        raise SystemExit(f"{path}: {missing}")
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def read_probes(run: Path) -> list[dict]:
    rows = _records(run / "probe.jsonl", "no probe log (run probe.py on the run's exports, appending to this file)")
    return sorted(rows, key=lambda r: r.get("step", 0))


def read_evals(run: Path) -> list[dict]:
    path = run / "log.jsonl"
    rows = [r for r in _records(path, "no training log (train.py writes it into the run directory)") if "eval" in r]
    if not rows:
        raise SystemExit(f"{path}: no held-out evaluations (train.py --eval-every N writes them)")
    return rows


def plot_evals(runs: list[Path], out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(len(runs), 4)
    nrows = (len(runs) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(5 * cols, 4 * nrows), sharey=True, squeeze=False)
    for ax, run in zip(axes.flat, runs, strict=False):
        records = read_evals(run)
        steps = [r["step"] for r in records]
        tasks = sorted({t for r in records for t in r["eval"] if not t.startswith("short/")})
        colors = plt.get_cmap("tab20").colors  # twelve tasks: more colours than the default cycle's ten
        for i, task in enumerate(tasks):
            ys = [r["eval"].get(task) for r in records]
            ax.plot(steps, ys, marker=".", color=colors[i % len(colors)], label=task.split("/")[-1])
        ax.plot(steps, [r.get("eval_mean") for r in records], color="black", linewidth=2, label="mean")
        ax.set_title(run.name, fontsize=9)
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(runs) :]:
        ax.axis("off")
    axes[0][0].set_ylabel("held-out score (official prompts)")
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(out)


def stage_starts(records: list[dict]) -> list[int]:
    """The steps at which a run's ``stage`` field changes (the first step of each later stage)."""
    return [b["step"] for a, b in zip(records, records[1:], strict=False) if b.get("stage") != a.get("stage")]


def plot_loss(runs: list[Path], out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5))
    for run in runs:
        records = [r for r in _records(run / "log.jsonl", "no training log") if "ema" in r]
        if not records:
            raise SystemExit(f"{run / 'log.jsonl'}: no loss records")
        (line,) = ax.plot([r["step"] for r in records], [r["ema"] for r in records], label=run.name, linewidth=1.2)
        for step in stage_starts(records):
            ax.axvline(step, color=line.get_color(), linestyle=":", alpha=0.6)
    ax.set_yscale("log")
    ax.set_xlabel("training step")
    ax.set_ylabel("training loss (EMA)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--out", required=True)
    ap.add_argument("--evals", action="store_true", help="draw log.jsonl's held-out scores instead of probe logs")
    ap.add_argument("--loss", action="store_true", help="draw log.jsonl's loss EMA, stage changes marked")
    args = ap.parse_args(argv)
    if args.loss:
        plot_loss(args.runs, args.out)
        return
    if args.evals:
        plot_evals(args.runs, args.out)
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measures = [("tf", "teacher-forced retrieval (share right)"), ("exact", "short rows, greedy exact match")]
    measures.append(("full", "official prompts, held-out score / 100"))
    n = len(args.runs)
    fig, axes = plt.subplots(n, len(measures), figsize=(6 * len(measures), 4 * n), sharey=True, squeeze=False)
    for row, run in zip(axes, args.runs, strict=True):
        probes = read_probes(run)
        for ax, (key, title) in zip(row, measures, strict=True):
            series = sorted({(t, bool(r.get("padded")) and key != "full") for r in probes for t in r.get(key, {})})
            for task, padded in series:
                pts = [
                    (r["step"], r[key][task])
                    for r in probes
                    if task in r.get(key, {}) and (bool(r.get("padded")) == padded or key == "full")
                ]
                ys = [y / 100 if key == "full" else y for _, y in pts]
                label = task.split("/")[-1] + (" (padded rows)" if padded else "")
                ax.plot([s for s, _ in pts], ys, marker=".", linestyle="--" if padded else "-", label=label)
            ax.set_title(f"{run.name}: {title}", fontsize=9)
            ax.set_xlabel("training step")
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=6)
        row[0].set_ylabel("share")
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(args.out)


if __name__ == "__main__":
    from dlm_decode.cli import run_script

    run_script(main, "train_demo/plot_curves.py")
