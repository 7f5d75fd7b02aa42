"""The tree is the product: run records never enter it (issue 47).

Runs write under git-ignored folders (`runs/`, `results/`, `recipes/*/work/`); this test fails when a tracked file
appears under any of them, so records cannot creep back in through a careless `git add -A`.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECORD_DIRS = {"runs", "results", "work"}


def _tracked() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked-file rules need `git ls-files`")
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return out.splitlines()


def record_files(paths: list[str]) -> list[str]:
    """The paths that sit under a run-record folder."""
    return [p for p in paths if RECORD_DIRS.intersection(p.split("/")[:-1])]


def test_record_rule_catches_a_record() -> None:
    paths = ["recipes/train_demo/runs/a/log.jsonl", "benchmarks/results/x.json", "dlm_decode/cli.py"]
    assert record_files(paths) == paths[:2]


def test_no_tracked_run_records() -> None:
    assert record_files(_tracked()) == []


def test_benchmarks_keep_few_plots() -> None:
    plots = [p for p in _tracked() if p.startswith("benchmarks/") and p.endswith(".png")]
    assert len(plots) <= 10, plots
