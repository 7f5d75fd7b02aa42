"""AUP (ALGORITHMS.md section 11) on hand-computed points, and its place in the sweep summary."""

from __future__ import annotations

import math

import pytest

from dlm_decode.parallelbench.aup import aup, aup_table, weight
from dlm_decode.parallelbench.sweep import format_sweep


def test_weight_is_one_at_the_best_accuracy_and_discounts_below_it():
    assert weight(80.0, 80.0) == 1.0
    assert weight(90.0, 80.0) == 1.0  # capped at 1
    assert weight(40.0, 80.0) == pytest.approx(math.exp(-1.5))
    assert weight(0.0, 0.0) == 1.0


def test_single_point_is_rho_times_accuracy():
    assert aup([(1.0, 80.0)], 80.0) == pytest.approx(80.0)
    assert aup([(2.5, 60.0)], 100.0) == pytest.approx(150.0)


def test_trapezoid_with_weights_and_the_five_point_cut():
    # sorted by rho: (1, 80), (2, 78), (3, 76), (4, 70); y_1 = 80, so (4, 70) is below 75 and left out
    pts = [(3.0, 76.0), (1.0, 80.0), (4.0, 70.0), (2.0, 78.0)]
    w78, w76 = math.exp(-3 * (1 - 78 / 80)), math.exp(-3 * (1 - 76 / 80))
    want = 1 * 80 + 0.5 * (2 - 1) * (78 * w78 + 80 * 1.0) + 0.5 * (3 - 2) * (76 * w76 + 78 * w78)
    assert aup(pts, 80.0) == pytest.approx(want)
    assert want == pytest.approx(80 + 76.18 + 68.89, abs=0.01)  # 225.07, worked by hand
    # a better y_max elsewhere on the task discounts every point of this method
    assert aup(pts, 100.0) < aup(pts, 80.0)


def test_empty_points_are_an_error():
    with pytest.raises(ValueError, match="at least one"):
        aup([], 1.0)


def _row(task, method, score, tps, sampler="threshold"):
    return {
        "task": task,
        "method": method,
        "score": score,
        "tokens_per_step": tps,
        "config": {"sampler": sampler},
    }


def test_table_per_method_and_task_uses_the_task_best_over_methods_and_skips_the_oracle():
    rows = [
        _row("a", "top-k b32", 90.0, 1.0),
        _row("a", "top-k b32", 60.0, 2.0),  # 30 below y_1: cut
        _row("a", "threshold b32", 100.0, 1.5),  # the task's best: y_max = 100 for both methods
        _row("a", "threshold b32", 98.0, 3.0),
        _row("b", "threshold b32", 50.0, 2.0),
        _row("a", "oracle b32", 100.0, 20.0, sampler="oracle"),
    ]
    got = aup_table(rows)
    assert set(got) == {"top-k b32", "threshold b32"}
    assert got["top-k b32"]["a"] == pytest.approx(90.0)
    w98 = math.exp(-3 * 0.02)
    assert got["threshold b32"]["a"] == pytest.approx(150.0 + 0.5 * 1.5 * (98 * w98 + 100))
    assert got["threshold b32"]["b"] == pytest.approx(100.0)
    assert got["threshold b32"]["mean"] == pytest.approx((got["threshold b32"]["a"] + 100.0) / 2)


def test_sweep_summary_prints_the_aup_table():
    rows = [
        {
            **_row("a", "top-k b32", 90.0, 1.0),
            "config_id": "c1",
            "label": "top-k k=1",
            "score_strict": 90.0,
            "n": 4,
            "gen_length": 32,
            "seconds": 1.0,
        },
        {
            **_row("a", "top-k b32", 88.0, 2.0),
            "config_id": "c2",
            "label": "top-k k=2",
            "score_strict": 88.0,
            "n": 4,
            "gen_length": 32,
            "seconds": 1.0,
        },
    ]
    text = format_sweep(rows)
    want = 90.0 + 0.5 * (88 * math.exp(-3 * (1 - 88 / 90)) + 90)
    assert "AUP" in text and f"{want:.1f}" in text
