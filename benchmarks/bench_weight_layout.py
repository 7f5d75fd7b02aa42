"""Row-major (the checkpoint's) against column-major (``models/layout.py``'s "decode") linear weights, same values.

``F.linear(x, W)`` with ``W`` [N, K] stored row-major, as loaded, against the same ``W`` stored column-major
(``W.T`` contiguous), at the shapes a decode step runs: M rows of activations (1 and 8: a few masked slots at the last
layer; 32: a dual-cache step's block; 64; 320: a gen-256 canvas with its 64-token prompt) times each projection of
the demo size (d 256, MLP 768, vocabulary 2048) and, with ``--sizes llada8b``, LLaDA-8B's (d 4096, MLP 12288; the
LM head left out: 126k rows). Per case: median microseconds per call of each layout over ``--repeats`` interleaved
rounds, the ratio row / column (> 1: the decode layout pays), and whether the outputs are bitwise equal. The last
line printed is one JSON object with the torch thread count.

    python benchmarks/bench_weight_layout.py --threads 1
    python benchmarks/bench_weight_layout.py --threads 1 --dtypes float32,bfloat16 --rows 32
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks' shared modules
from interleaved import add_pair_args, check_pair_args, time_pair  # noqa: E402

# name -> (K in, N out) per size
SHAPES = {
    "demo": {"qkvo": (256, 256), "gate_up": (256, 768), "down": (768, 256), "lm_head": (256, 2048)},
    "llada8b": {"qkvo": (4096, 4096), "gate_up": (4096, 12288), "down": (12288, 4096)},
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="demo", help=f"comma-separated, from {sorted(SHAPES)}")
    p.add_argument("--dtypes", default="float32", help=f"comma-separated, from {sorted(DTYPES)}")
    add_pair_args(p, rows="1,8,32,64,320", budget=0.1)
    args = p.parse_args(argv)
    for opt, given, known in (("--sizes", args.sizes, SHAPES), ("--dtypes", args.dtypes, DTYPES)):
        bad = [s for s in given.split(",") if s not in known]
        if bad:
            p.error(f"{opt}: unknown {bad}; choose from {sorted(known)}")
    check_pair_args(p, args)
    return args


def compare(x: torch.Tensor, w: torch.Tensor, repeats: int, calls: int) -> dict:
    """``F.linear(x, w)`` with ``w`` [N, K] row-major against the same values column-major."""
    col = w.t().contiguous().t()

    def row_major() -> torch.Tensor:
        return F.linear(x, w)

    def column_major() -> torch.Tensor:
        return F.linear(x, col)

    same = torch.equal(row_major(), column_major())
    r, c, calls = time_pair(row_major, column_major, repeats, calls, budget=0.1)
    return {
        "row_us": round(r * 1e6, 1),
        "column_us": round(c * 1e6, 1),
        "row_over_column": round(r / c, 3),
        "bitwise_equal": same,
        "calls": calls,
    }


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(args.seed)
    results = []
    print(f"{'size':>8} {'dtype':>8} {'rows':>5} {'what':>8} {'row-major us':>12} {'column us':>9}", end="")
    print(f" {'row/col':>7} {'bitwise':>7}")
    for size in args.sizes.split(","):
        for dname in args.dtypes.split(","):
            dtype = DTYPES[dname]
            for m in args.rows:
                for what, (k, n) in SHAPES[size].items():
                    x = torch.randn(1, m, k, generator=g).to(dtype)
                    w = (torch.randn(n, k, generator=g) / k**0.5).to(dtype)
                    r = {
                        "size": size,
                        "dtype": dname,
                        "rows": m,
                        "what": what,
                        **compare(x, w, args.repeats, args.calls),
                    }
                    results.append(r)
                    print(
                        f"{size:>8} {dname:>8} {m:>5} {what:>8} {r['row_us']:>12} {r['column_us']:>9} "
                        f"{r['row_over_column']:>7} {str(r['bitwise_equal']):>7}",
                        flush=True,
                    )
    out = {"torch_threads": torch.get_num_threads(), "repeats": args.repeats, "results": results}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    from dlm_decode.cli import run_script

    run_script(main, "benchmarks/bench_weight_layout.py")
