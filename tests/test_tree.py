"""The tree is the product: run records never enter it (issue 47).

Runs write under git-ignored folders (`runs/`, `results/`, `recipes/*/work/`); this test fails when a tracked file
appears under any of them, so records cannot creep back in through a careless `git add -A`.
"""

from __future__ import annotations

import ast
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


MAX_FUNCTION_LINES = 80
CODE_DIRS = ("dlm_decode", "recipes", "benchmarks")


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int]]:
    """(name, lines) of every function in ``source`` longer than ``limit`` lines, Triton kernels (``@triton.jit``)
    aside: a kernel is one compiled unit and cannot call Python helpers."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if any(ast.unparse(d).startswith("triton.jit") for d in node.decorator_list):
            continue
        lines = node.end_lineno - node.lineno + 1
        if lines > limit:
            found.append((node.name, lines))
    return found


def test_long_function_rule_catches_one_and_spares_kernels() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(81))
    source = f"def long():\n{body}\n\ndef short():\n    return 1\n\n@triton.jit\ndef kernel():\n{body}\n"
    assert long_functions(source) == [("long", 82)]


def test_no_function_over_80_lines() -> None:
    """The working rule (issue 47's target for the package and the recipes; the benchmarks keep it too)."""
    found = {
        f"{path}:{name}": lines
        for path in _tracked()
        if path.endswith(".py") and path.startswith(CODE_DIRS)
        for name, lines in long_functions((ROOT / path).read_text())
    }
    assert found == {}
