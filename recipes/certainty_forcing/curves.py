"""Training curves of certainty-forcing runs: the held-out score and NFE of ``train.py``'s periodic evaluations.

    python -m recipes.certainty_forcing.curves --run ref=runs/certainty_forcing/cf-llada \
        --run ratio-range=runs/certainty_forcing/cf-llada-ru --out runs/certainty_forcing/curves.png

Reads each run directory's ``log.jsonl`` (the ``{"step", "eval": {score, nfe, ...}}`` records; step 0 is the base
model), plots score and NFE against the optimizer step in two panels, one line per run, and optionally writes the
points as JSON lines (run, step, score, nfe). A plateau shows as an NFE line that has stopped falling while the score
line drifts; this is how the runs of the recipe's README were compared.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from dlm_decode.cli import run_script


def eval_points(run_dir: str | Path) -> list[dict[str, Any]]:
    """The periodic evaluations of one run, in step order: [{step, score, nfe}]."""
    log = Path(run_dir) / "log.jsonl"
    if not log.is_file():
        raise ValueError(f"{run_dir}: no log.jsonl (not a train.py run directory)")
    points = []
    for n, line in enumerate(log.read_text().splitlines(), 1):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{log}:{n}: not JSON ({e.msg})") from None
        if "eval" in rec:
            points.append({"step": int(rec["step"]), "score": rec["eval"]["score"], "nfe": rec["eval"]["nfe"]})
    if not points:
        raise ValueError(f"{log}: no evaluations (train.py --eval-every was 0)")
    return sorted(points, key=lambda p: p["step"])


def plot_curves(runs: dict[str, list[dict[str, Any]]], path: str | Path, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(6.5, 5.5), sharex=True)
    for name, pts in runs.items():
        steps = [p["step"] for p in pts]
        line = top.plot(steps, [p["score"] for p in pts], marker="o", ms=3, label=name)[0]
        bottom.plot(steps, [p["nfe"] for p in pts], marker="o", ms=3, color=line.get_color())
    top.set_ylabel("held-out score")
    bottom.set_ylabel("held-out NFE")
    bottom.set_xlabel("optimizer step (0 = base model)")
    top.set_title(title or "certainty forcing: held-out score and NFE during training")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    top.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, list[dict[str, Any]]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", action="append", required=True, metavar="NAME=DIR", help="a train.py --out directory")
    ap.add_argument("--out", default=None, help="PNG of the curves")
    ap.add_argument("--jsonl", default=None, help="the points as JSON lines")
    ap.add_argument("--title", default="")
    args = ap.parse_args(argv)
    runs: dict[str, list[dict[str, Any]]] = {}
    for spec in args.run:
        name, _, path = spec.partition("=")
        if not name or not path:
            raise ValueError(f"--run expects NAME=DIR, got {spec!r}")
        if name in runs:
            raise ValueError(f"--run names must differ: {name!r} twice")
        runs[name] = eval_points(path)
    for name, pts in runs.items():
        first, last = pts[0], pts[-1]
        print(
            f"{name:14s} step {first['step']:>5} score {first['score']:6.2f} NFE {first['nfe']:5.2f} -> "
            f"step {last['step']:>5} score {last['score']:6.2f} NFE {last['nfe']:5.2f}"
        )
    if args.jsonl:
        lines = [json.dumps({"run": name, **p}) for name, pts in runs.items() for p in pts]
        Path(args.jsonl).write_text("\n".join(lines) + "\n")
    if args.out:
        plot_curves(runs, args.out, args.title)
    return runs


if __name__ == "__main__":
    run_script(main, "certainty_forcing/curves.py")
