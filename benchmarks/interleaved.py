"""Time two ways of computing the same thing against each other, interleaved, for the micro-benchmarks
(``bench_fused_projections.py``, ``bench_weight_layout.py``)."""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable


def seconds(fn: Callable[[], object], calls: int) -> float:
    """Wall-clock seconds of ``calls`` calls of ``fn``."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return time.perf_counter() - start


def time_pair(
    a: Callable[[], object], b: Callable[[], object], repeats: int, calls: int, budget: float
) -> tuple[float, float, int]:
    """(median seconds per call of ``a``, of ``b``, calls per round) over ``repeats`` rounds that run ``calls`` calls
    of each, the order alternating per round; ``calls`` 0: as many as take about ``budget`` seconds of ``a``."""
    if calls == 0:
        calls = max(1, int(budget / max(seconds(a, 3) / 3, 1e-6)))
    t_a: list[float] = []
    t_b: list[float] = []
    for i in range(repeats):
        for fn, acc in ((a, t_a), (b, t_b))[:: 1 if i % 2 == 0 else -1]:
            acc.append(seconds(fn, calls))
    return statistics.median(t_a) / calls, statistics.median(t_b) / calls, calls


def add_pair_args(p: argparse.ArgumentParser, rows: str, budget: float) -> None:
    """The options every such micro-benchmark takes: activation rows, rounds, calls per round, threads, seed."""
    p.add_argument("--rows", default=rows, help="activation rows M per call, comma-separated")
    p.add_argument("--repeats", type=int, default=5, help="interleaved timed rounds (median)")
    p.add_argument("--calls", type=int, default=0, help=f"calls per timed round (0: about {budget} s of work)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)


def check_pair_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--rows`` parsed into a list of ints; the counts checked (``p.error`` names the option)."""
    try:
        args.rows = [int(r) for r in args.rows.split(",")]
    except ValueError:
        p.error(f"--rows: comma-separated positive integers, got {args.rows!r}")
    if min(args.rows) < 1 or args.repeats < 1 or args.calls < 0 or args.threads < 1:
        p.error("--rows, --repeats and --threads must be >= 1, --calls >= 0")
