"""Bad inputs that get a stated behaviour rather than an error (issue 50): ``--outputs`` implies ``--json``; a budget
shorter than a task's answers is a notice naming both lengths; a sweep file of other settings is refused unless
``--append`` (and then summary and plots use this run's rows); a notice shared by many tasks is printed once with a
count; counts have the right plural; the test summary says why ParallelBench tests skipped.

    pytest tests/test_stated_behaviours.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, SHARED_DATA

from dlm_decode.cli import main
from dlm_decode.core.words import plural, some
from dlm_decode.parallelbench.plots import write_plots
from dlm_decode.parallelbench.runner import load_tasks
from dlm_decode.parallelbench.sweep import config_summary, read_rows, scored_tasks

needs_data = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="official ParallelBench data not present")
pytestmark = pytest.mark.usefixtures("one_thread")
PB = ["parallelbench", "--model", "demo-llada", "--data", str(SHARED_DATA), "--tasks", "waiting_line/copy"]


def _json_line(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


@needs_data
def test_outputs_implies_json(capsys):
    assert main([*PB, "--limit", "2", "--outputs"]) == 0
    out = _json_line(capsys.readouterr().out)
    assert len(out["tasks"][0]["outputs"]) == 2 and "text" in out["tasks"][0]["outputs"][0]


@needs_data
def test_gen_length_shorter_than_the_answers_is_a_notice_with_both_lengths(capsys):
    assert main([*PB, "--limit", "2", "--gen-length", "4"]) == 0
    err = capsys.readouterr().err
    notes = [ln for ln in err.splitlines() if ln.startswith("notice: waiting_line/copy: gen_length 4 is shorter")]
    assert len(notes) == 1, err
    assert "2 reference answers of 2 samples (up to " in notes[0]
    longest = int(notes[0].split("(up to ")[1].split()[0])
    assert longest > 4
    assert main([*PB, "--limit", "2"]) == 0  # the task's own budget (32) fits every answer: no notice
    assert "is shorter than" not in capsys.readouterr().err


@needs_data
def test_sweep_file_of_other_settings_is_refused_before_loading(tmp_path, capsys, monkeypatch):
    import dlm_decode

    monkeypatch.setattr(dlm_decode, "load_model", lambda *a, **k: pytest.fail("loaded before refusing"))
    out = tmp_path / "pb.jsonl"
    rows = [{"model": "demo-llada", "source": f"data:{SHARED_DATA}", "limit": lim, "task": "t"} for lim in (5, 5, 9)]
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main([*PB, "--sweep", "quick", "--out", str(out), "--limit", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{out} holds 3 rows written with other settings: limit 5 (this run: 2); limit 9 (this run: 2)" in err


@pytest.mark.slow
@needs_data
def test_sweep_file_of_other_settings_is_refused_unless_append(tmp_path, capsys):
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"configs": [{"sampler": "low_confidence", "k": 4}]}))
    out = tmp_path / "pb.jsonl"
    sweep = [*PB, "--sweep", str(grid), "--out", str(out), "--json"]
    assert main([*sweep, "--limit", "1"]) == 0
    capsys.readouterr()
    before = out.read_text()
    assert main([*sweep, "--limit", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{out} holds 1 row written with other settings: limit 1 (this run: 2)" in err and "--append" in err
    assert out.read_text() == before  # nothing written, nothing lost
    assert main([*sweep, "--limit", "2", "--append"]) == 0
    res = _json_line(capsys.readouterr().out)
    assert res["rows"] == 1 and res["configs"][0]["tasks"] == ["waiting_line/copy"]  # this run's row only
    assert len(read_rows(out)) == 2
    notes: list[str] = []
    plots = write_plots(out, notice=notes.append)  # --plot on the mixed file: the last run's rows
    assert len(notes) == 1 and "plotting the 1 row of the last (model 'demo-llada'" in notes[0]
    assert "limit 2" in notes[0] and "leaving out 1 row of others" in notes[0]
    assert all(p.is_file() for p in plots.values())


def test_a_repeated_row_counts_once_in_the_summary():
    row = {"config_id": "c", "label": "x", "method": "m", "config": {"sampler": "threshold"}, "task": "t", "n": 1}
    row |= {"score": 50.0, "score_strict": 50.0, "tokens_per_step": 2.0, "gen_length": 32, "seconds": 1.0}
    (s,) = config_summary([row, row | {"score": 100.0}])
    assert s["tasks"] == ["t"] and s["score"] == 100.0  # the later row wins; the task is not counted twice


@needs_data
def test_skipped_text_tasks_are_one_notice_with_a_count(capsys):
    text = [t for t in load_tasks(SHARED_DATA, limit=1) if t.name.startswith("words_to_sentence/")]
    n = len(text)
    assert n > 3
    notes: list[str] = []
    copy = load_tasks(SHARED_DATA, ["waiting_line/copy"], limit=1)
    assert [t.name for t in scored_tasks(copy + text, notes.append)] == ["waiting_line/copy"]
    assert len(notes) == 1 and notes[0].startswith(f"skipping {n} tasks (words_to_sentence/easy, ")
    assert f"and {n - 3} more): " in notes[0]
    argv = ["parallelbench", "--model", "demo-llada", "--data", str(SHARED_DATA), "--limit", "1"]
    assert main([*argv, "--tasks", ",".join(t.name for t in text)]) == 0
    err = capsys.readouterr().err
    assert err.count("grammar checker") == 1, err
    assert f"notice: {n} tasks not scored (skipped): words_to_sentence/easy, " in err


def test_plural_and_some():
    assert [plural(n, "row") for n in (0, 1, 2)] == ["0 rows", "1 row", "2 rows"]
    assert plural(1, "reference answer") == "1 reference answer" and plural(3, "child", "children") == "3 children"
    assert some(["a", "b"]) == "a, b" and some(list("abcde")) == "a, b, c and 2 more"


def test_skipped_for_missing_data_is_one_hint_line(tmp_path, monkeypatch):
    import conftest

    class Reporter:
        stats = {"skipped": [type("R", (), {"longrepr": ("t.py", 1, "official ParallelBench data not present")})()]}
        lines: list[str] = []

        def write_line(self, line: str) -> None:
            self.lines.append(line)

    rep = Reporter()
    monkeypatch.setattr(conftest, "SHARED_DATA", tmp_path / "absent")
    conftest.pytest_terminal_summary(rep, 0, None)
    assert len(rep.lines) == 1 and rep.lines[0].startswith("1 test skipped: no official ParallelBench data at ")
    monkeypatch.setattr(conftest, "SHARED_DATA", tmp_path)  # data present: no hint
    conftest.pytest_terminal_summary(rep, 0, None)
    assert len(rep.lines) == 1


@pytest.mark.slow
def test_skipped_for_missing_data_says_why_in_the_summary(tmp_path):
    env = os.environ | {"DLM_PARALLELBENCH_DATA": str(tmp_path / "absent"), "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_parallelbench_tasks.py"]
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    hint = [ln for ln in res.stdout.splitlines() if "skipped: no official ParallelBench data at" in ln]
    assert len(hint) == 1 and str(tmp_path / "absent") in hint[0] and "DLM_PARALLELBENCH_DATA" in hint[0]
