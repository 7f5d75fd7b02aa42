"""Learning curves of demo-model runs from their probe logs (one ``probe.py`` JSON line per export).

    python recipes/train_demo/plot_curves.py RUN_DIR [RUN_DIR ...] --out curves.png

One row of panels per run, one panel per measure: teacher-forced retrieval (``tf``), greedy exact match on short
rows (``exact``) and, where probed, the official-prompt score on held-out samples (``full``); one line per task,
and a dashed one per task for probes run with ``probe.py --padded`` (the two formats are different measurements).
Reads ``RUN_DIR/probe.jsonl``; a half-written last line is skipped.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def read_probes(run: Path) -> list[dict]:
    path = run / "probe.jsonl"
    if not path.is_file():
        raise SystemExit(f"{path}: no probe log (run probe.py on the run's exports, appending to this file)")
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return sorted(rows, key=lambda r: r.get("step", 0))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
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
    main()
