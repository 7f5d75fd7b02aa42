"""Would fusing a layer's projections pay? One matmul over concatenated weights against separate ones, same inputs.

Issue 16 names fused Q/K/V and gate/up projections as a speed direction. The forward computes them as separate
``F.linear`` calls (``models/common.py``: 43 matmuls per LLaDA forward at 6 layers); fused, q/k/v become one call over
``[Wq; Wk; Wv]`` and gate/up one over ``[Wg; Wu]``, split afterwards (views, no copy). This times both at the shapes
a decode step runs: M rows of activations (a dual-cache step: the 32 slots of a block; no cache: the whole canvas;
one row; a batch of 8 blocks) against the demo size (d 256, MLP 768) and LLaDA-8B's (d 4096, MLP 12288), and checks
that the fused outputs are bitwise equal to the separate ones (they must be for the decode to keep its tokens).

Each pair is timed interleaved (``interleaved.time_pair``: separate then fused, the order alternating per round)
``--repeats`` times over ``--calls`` calls; the
ratio is separate / fused median time (> 1: fusing pays). The last line printed is one JSON object with the torch
thread count.

    python benchmarks/bench_fused_projections.py --threads 1
    python benchmarks/bench_fused_projections.py --threads 1 --sizes demo --rows 32
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

SIZES = {"demo": (256, 768), "llada8b": (4096, 12288)}  # (d_model, MLP hidden)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="demo,llada8b", help=f"comma-separated, from {sorted(SIZES)}")
    add_pair_args(p, rows="1,32,256", budget=0.2)
    args = p.parse_args(argv)
    unknown = [s for s in args.sizes.split(",") if s not in SIZES]
    if unknown:
        p.error(f"--sizes: unknown {unknown}; choose from {sorted(SIZES)}")
    check_pair_args(p, args)
    return args


def compare(x: torch.Tensor, weights: list[torch.Tensor], repeats: int, calls: int) -> dict:
    """Separate ``F.linear`` per weight [N_i, K] against one over their concatenation, on ``x`` [M, K]."""
    fused = torch.cat(weights)  # [sum N_i, K]
    widths = [w.shape[0] for w in weights]

    def separate() -> list[torch.Tensor]:
        return [F.linear(x, w) for w in weights]

    def together() -> tuple[torch.Tensor, ...]:
        return F.linear(x, fused).split(widths, -1)

    same = all(torch.equal(a, b) for a, b in zip(separate(), together(), strict=True))
    sep, fus, calls = time_pair(separate, together, repeats, calls, budget=0.2)
    return {
        "separate_us": round(sep * 1e6, 1),
        "fused_us": round(fus * 1e6, 1),
        "separate_over_fused": round(sep / fus, 3),
        "bitwise_equal": same,
        "calls": calls,
    }


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(args.seed)
    results = []
    print(f"{'size':>8} {'rows':>5} {'what':>7} {'separate us':>12} {'fused us':>9} {'sep/fused':>9} {'bitwise':>7}")
    for size in args.sizes.split(","):
        d, hidden = SIZES[size]
        for m in args.rows:
            x = torch.randn(m, d, generator=g)
            for what, widths in (("qkv", [d, d, d]), ("gate_up", [hidden, hidden])):
                weights = [torch.randn(n, d, generator=g) / d**0.5 for n in widths]
                r = {"size": size, "rows": m, "what": what, **compare(x, weights, args.repeats, args.calls)}
                results.append(r)
                print(
                    f"{size:>8} {m:>5} {what:>7} {r['separate_us']:>12} {r['fused_us']:>9} "
                    f"{r['separate_over_fused']:>9} {str(r['bitwise_equal']):>7}",
                    flush=True,
                )
    out = {"torch_threads": torch.get_num_threads(), "repeats": args.repeats, "results": results}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    from dlm_decode.cli import run_script

    run_script(main, "benchmarks/bench_fused_projections.py")
