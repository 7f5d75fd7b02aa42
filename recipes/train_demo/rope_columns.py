"""Can one attention head pick out a latin square's column-mates by RoPE position alone? One JSON line per base.

    python recipes/train_demo/rope_columns.py [--bases 10000,1000,100] [--head-dim 32] [--row 8] [--span 30]

The latin-square answer is ``H , 4 , A , C \\n`` per row: a cell's column-mates sit ``row`` (8), 2 x 8 and 3 x 8
tokens away, its row-mates 2, 4, 6. A head's position-only score between two tokens at offset d is
``sum_i a_i cos(theta_i d) + b_i sin(theta_i d)`` over the head's frequency pairs ``theta_i = base^(-2i/head_dim)``.
The linear program here finds the coefficients in [-1, 1] that maximise the margin m with which the score at the
column offsets (+-row, +-2 row, +-3 row) exceeds a threshold and the score at every other even offset within
``span`` falls below it. A margin near 0 means no head can separate them by position without enormous weights:
the column has to come from content. Needs scipy (installed with the ``eval`` extra's scikit-learn).
"""

from __future__ import annotations

import argparse
import json

import numpy as np


def column_margin(base: float, head_dim: int = 32, row: int = 8, span: int = 30) -> float:
    """The largest margin by which a RoPE position score (coefficients in [-1, 1]) puts the column offsets above
    every other even offset in [-span, span] (0 excluded); 0.0 when no score separates them."""
    try:
        from scipy.optimize import linprog
    except ImportError:  # pragma: no cover - scipy comes with scikit-learn (the eval extra)
        raise SystemExit("rope_columns.py needs scipy: pip install scipy (or the eval extra)") from None
    theta = base ** (-np.arange(head_dim // 2) * 2.0 / head_dim)  # [F]
    offsets = np.array([d for d in range(-span, span + 1, 2) if d != 0])  # [D]
    feats = np.concatenate([np.cos(np.outer(offsets, theta)), np.sin(np.outer(offsets, theta))], axis=1)  # [D, 2F]
    column = np.isin(np.abs(offsets), [row, 2 * row, 3 * row])
    n = feats.shape[1]
    # variables: coefficients (n), threshold t, margin m; maximise m
    # column offsets: score - t >= m  ->  -score + t + m <= 0; others: score - t <= -m  ->  score - t + m <= 0
    a_ub = np.zeros((len(offsets), n + 2))
    a_ub[:, :n] = np.where(column[:, None], -feats, feats)
    a_ub[:, n] = np.where(column, 1.0, -1.0)
    a_ub[:, n + 1] = 1.0
    cost = np.zeros(n + 2)
    cost[-1] = -1.0
    bounds = [(-1.0, 1.0)] * n + [(None, None), (0.0, None)]
    res = linprog(cost, A_ub=a_ub, b_ub=np.zeros(len(offsets)), bounds=bounds)
    return round(float(-res.fun), 4) if res.success else 0.0


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bases", default="10000,1000,100", help="RoPE bases, comma-separated")
    ap.add_argument("--head-dim", type=int, default=32, help="the head dimension (demo models: 128 / 4 heads)")
    ap.add_argument("--row", type=int, default=8, help="tokens per square row (4 symbols, 3 commas, a newline)")
    ap.add_argument("--span", type=int, default=30, help="offsets considered: even ones within +-span")
    args = ap.parse_args(argv)
    try:
        bases = [float(b) for b in args.bases.split(",")]
    except ValueError:
        bases = []
    if not bases or min(bases) <= 1.0:
        raise SystemExit(f"--bases: comma-separated numbers > 1, got {args.bases!r}")
    if args.head_dim < 2 or args.head_dim % 2 or args.row < 1 or args.span < 3 * args.row:
        raise SystemExit("--head-dim must be even and >= 2, --row >= 1, --span >= 3 x --row")
    out = []
    for base in bases:
        line = {"base": base, "head_dim": args.head_dim, "row": args.row, "span": args.span}
        line["margin"] = column_margin(base, args.head_dim, args.row, args.span)
        print(json.dumps(line), flush=True)
        out.append(line)
    return out


if __name__ == "__main__":
    from dlm_decode.cli import run_script

    run_script(main, "train_demo/rope_columns.py")
