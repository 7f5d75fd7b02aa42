"""The recipes' and benchmarks' scripts answer a user's mistake with one line and exit status 2, never a traceback
(``dlm_decode.cli.run_script``, the rule ``dlm-decode`` itself follows)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dlm_decode.cli import run_script

ROOT = Path(__file__).resolve().parents[1]


def _exit(main, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        run_script(main, "some/script.py")
    return info.value.code, capsys.readouterr().err


def test_run_script_turns_user_errors_into_one_line_and_status_2(capsys):
    def bad_option():
        raise ValueError("--limit must be >= 1, got 0")

    def missing_file():
        raise FileNotFoundError("runs/x/train.jsonl not found")

    def old_style():
        raise SystemExit("--stages: no stage given")

    def usage_error():
        raise SystemExit(2)  # argparse's exit after printing its own usage line

    assert _exit(bad_option, capsys) == (2, "some/script.py: error: --limit must be >= 1, got 0\n")
    assert _exit(missing_file, capsys) == (2, "some/script.py: error: runs/x/train.jsonl not found\n")
    assert _exit(old_style, capsys) == (2, "some/script.py: error: --stages: no stage given\n")
    assert _exit(usage_error, capsys) == (2, "")


def test_run_script_keeps_the_status_main_returns_and_reports_ctrl_c(capsys):
    def interrupted():
        raise KeyboardInterrupt

    assert _exit(lambda: 3, capsys) == (3, "")
    assert _exit(lambda: {"score": 1.0}, capsys) == (0, "")  # a main returning its results: success
    assert _exit(lambda: None, capsys) == (0, "")
    assert _exit(interrupted, capsys) == (130, "some/script.py: interrupted\n")


def test_run_script_lets_bugs_raise():
    def bug():
        raise KeyError("not a user error")

    with pytest.raises(KeyError):
        run_script(bug, "some/script.py")


@pytest.mark.parametrize(
    ("module", "args", "message"),
    [
        (
            "recipes.certainty_forcing.trajectories",
            ["--model", "demo-llada", "--out", "unused", "--seed", "5", "--heldout-seed", "5"],
            "certainty_forcing/trajectories.py: error: --seed and --heldout-seed must differ",
        ),
        (
            "recipes.train_demo.train",
            ["--config", "no/such.yaml", "--out", "unused"],
            "train_demo/train.py: error: --config: no/such.yaml is not a file",
        ),
        (
            "recipes.learn2pd.train_filter",
            ["--data", "no/such/records", "--out", "unused"],
            "learn2pd/train_filter.py: error: no/such/records: records no/such/records.safetensors not found "
            "(oracle_data.py --out no/such/records writes them)",
        ),
    ],
)
def test_recipe_scripts_answer_a_bad_input_with_one_line(tmp_path, module, args, message):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # the recipes run as modules of the repository
    proc = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == message
