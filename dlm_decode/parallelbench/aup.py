"""AUP, Accuracy Under Parallelism (d3LLM, hao-ai-lab 2025; ALGORITHMS.md section 11), per method and task.

One number for a method's whole speed/quality curve on a task, independent of hardware. The points are
``(rho_i, y_i)``: tokens per forward and accuracy in % (our score x 100) of each of the method's configs, sorted by
``rho``. Only points with ``y_i >= y_1 - 5`` count (``y_1``: the accuracy at the smallest ``rho``), and

    AUP = rho_1 y_1 + 1/2 sum_{i>=2} (rho_i - rho_{i-1}) (y_i W(y_i) + y_{i-1} W(y_{i-1}))
    W(y) = min(exp(-alpha (1 - y / y_max)), 1),  alpha = 3

so parallelism bought at a loss of accuracy is discounted exponentially. ``y_max`` is the best accuracy on that task
over every non-oracle config of the sweep (all methods), which is how a shared sweep compares methods on one scale.
Points at equal ``rho`` keep the sweep's order; the oracle is a bound, not a method, and never gets an AUP.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

ALPHA = 3.0
TOLERANCE = 5.0  # accuracy points below y_1 that a point may lose and still count


def weight(y: float, y_max: float, alpha: float = ALPHA) -> float:
    """W(y) = min(exp(-alpha (1 - y / y_max)), 1); 1 when ``y_max`` is 0 (nothing to discount against)."""
    if y_max <= 0:
        return 1.0
    return min(math.exp(-alpha * (1.0 - y / y_max)), 1.0)


def aup(points: Sequence[tuple[float, float]], y_max: float, alpha: float = ALPHA) -> float:
    """AUP of ``(tokens per forward, accuracy %)`` points; ``y_max`` is the task's best accuracy."""
    if not points:
        raise ValueError("aup needs at least one (tokens per forward, accuracy) point")
    pts = sorted(points, key=lambda p: p[0])
    floor = pts[0][1] - TOLERANCE
    kept = [p for p in pts if p[1] >= floor]
    (rho, y), total = kept[0], kept[0][0] * kept[0][1]
    for rho_i, y_i in kept[1:]:
        total += 0.5 * (rho_i - rho) * (y_i * weight(y_i, y_max, alpha) + y * weight(y, y_max, alpha))
        rho, y = rho_i, y_i
    return total


def aup_table(rows: Iterable[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """``{method: {task: AUP, ..., "mean": mean over the method's tasks}}`` from sweep rows (oracle rows skipped)."""
    by: dict[str, dict[str, list[tuple[float, float]]]] = {}
    best: dict[str, float] = {}
    for r in rows:
        if r.get("score") is None or r.get("config", {}).get("sampler") == "oracle":
            continue
        point = (float(r["tokens_per_step"]), float(r["score"]))
        by.setdefault(r["method"], {}).setdefault(r["task"], []).append(point)
        best[r["task"]] = max(best.get(r["task"], point[1]), point[1])
    out: dict[str, dict[str, float]] = {}
    for method, tasks in by.items():
        per = {task: aup(pts, best[task]) for task, pts in sorted(tasks.items())}
        out[method] = {**per, "mean": sum(per.values()) / len(per)}
    return out
