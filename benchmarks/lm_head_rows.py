"""What sharing a forward can give on this machine (issue 74): the LM head's matrix product at R rows.

    OMP_NUM_THREADS=1 python benchmarks/lm_head_rows.py --vocab 126464 --width 1024 --rows 1,4,8,16,32,64,128,256

A decode step reads the logits of its candidates: a row of the engine brings the masks of its block (32 at a block's
first step with block 32, fewer as the block fills). When a model's forward is dominated by its LM head (a random
LLaDA at d_model 1024 with LLaDA's 126,464-word vocabulary), what the engine gains by running eight such rows in one
forward is what the product gains from more rows: per row, ``t(R) / R`` against ``t(R * 8) / (R * 8)``. Where the
product is bound by reading the weights (a GPU, or a small R) that gain is large; where it is bound by its arithmetic
(one CPU thread from a few dozen rows) it is small. Per R: the median of ``--repeats`` products
(``torch.nn.functional.linear``, float32, random weights, stored as ``--layout`` says: ``decode``, column-major as
``load_model`` stores them on the CPU, or ``official``), milliseconds a row, GFLOP/s, and ``gain_at_8x``: a row's
time at R over its time at 8R (when 8R was measured). The last line is one JSON object with the thread count.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=126464, help="the head's output rows (the vocabulary)")
    ap.add_argument("--width", type=int, default=1024, help="the hidden size")
    ap.add_argument("--rows", default="1,4,8,16,32,64,128,256", help="comma-separated row counts")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--layout",
        choices=["decode", "official"],
        default="decode",
        help="the weight stored column-major, as load_model stores it on the CPU in fp32 (decode), or row-major",
    )
    args = ap.parse_args(argv)
    try:
        args.rows = [int(x) for x in args.rows.split(",")]
    except ValueError:
        ap.error(f"--rows must be comma-separated whole numbers, got {args.rows!r}")
    for name in ("vocab", "width", "repeats", "threads"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if any(r < 1 for r in args.rows):
        ap.error(f"--rows must be >= 1 each, got {args.rows}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(args.vocab, args.width, generator=g)  # [V, d]
    if args.layout == "decode":  # the same values, [d, V] in memory (``dlm_decode.models.layout``)
        weight = weight.t().contiguous().t()
    per_rows: dict[int, float] = {}
    for r in args.rows:
        x = torch.randn(r, args.width, generator=g)  # [R, d]
        torch.nn.functional.linear(x, weight)  # warm-up
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            torch.nn.functional.linear(x, weight)
            times.append(time.perf_counter() - start)
        per_rows[r] = statistics.median(times)
    out = {}
    for r, t in per_rows.items():
        row = {"ms_a_row": 1000 * t / r, "gflops": 2 * r * args.width * args.vocab / t / 1e9}
        if r * 8 in per_rows:
            row["gain_at_8x"] = (t / r) / (per_rows[r * 8] / (r * 8))
        out[str(r)] = row
        gain = f"  gain at 8x rows {row['gain_at_8x']:.2f}x" if "gain_at_8x" in row else ""
        print(f"rows {r:5d}: {row['ms_a_row']:8.2f} ms a row, {row['gflops']:6.1f} GFLOP/s{gain}")
    info = {"vocab": args.vocab, "width": args.width, "layout": args.layout, "rows": out}
    print(json.dumps(info | {"threads": torch.get_num_threads()}))
    return 0


if __name__ == "__main__":
    from dlm_decode.cli import run_script

    run_script(main, "lm_head_rows.py")
