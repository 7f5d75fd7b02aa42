"""Smaller things a user hits: preset lengths, sampler names in errors, Ctrl-C, progress bars, --device, --out,
thread counts in the results, the demo-model path helper, the ``error`` field of ``generate --json``, and the recipes'
and benchmarks' scripts answering a user's mistake with one line and exit status 2, never a traceback
(``dlm_decode.cli.run_script``, the rule ``dlm-decode`` itself follows).

    pytest tests/test_usability.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO, SHARED_DATA
from fake import ScriptedModel

import dlm_decode
from dlm_decode.cli import main, run_script
from dlm_decode.parallelbench import runner, sweep
from dlm_decode.parallelbench.runner import load_tasks, run_benchmark
from dlm_decode.parallelbench.sweep import expand_grid, read_rows, run_sweep
from dlm_decode.samplers.presets import get_preset

needs_data = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="official ParallelBench data not present")


pytestmark = pytest.mark.usefixtures("one_thread")


def _main(argv: list[str]) -> int:
    """``main`` with a KeyboardInterrupt that escapes it turned into a test failure (not a pytest abort)."""
    try:
        return main(argv)
    except KeyboardInterrupt:
        pytest.fail("KeyboardInterrupt escaped dlm_decode.cli.main")


def _interrupt_after(monkeypatch, module, n: int) -> list[str]:
    """Let ``module.run_task`` finish ``n`` calls, then raise KeyboardInterrupt (a Ctrl-C mid-run)."""
    real, calls = module.run_task, []

    def run_task(model, tok, task, *a, **k):
        if len(calls) >= n:
            raise KeyboardInterrupt
        calls.append(task.name)
        return real(model, tok, task, *a, **k)

    monkeypatch.setattr(module, "run_task", run_task)
    return calls


def _pb(tok_dir, *extra: str) -> list[str]:
    return ["parallelbench", "--model", str(tok_dir), "--data", str(SHARED_DATA), "--limit", "1", *extra]


# ------------------------------------------------------------------------------------------------ presets


def test_preset_steps_follow_an_overridden_gen_length(llada_dir, capsys):
    kw = get_preset("prophet").generate_kwargs(gen_length=64)
    assert kw["gen_length"] == 64 and kw["steps"] == 64 and kw["block_length"] == 32
    assert get_preset("prophet").generate_kwargs(gen_length=64, steps=32)["steps"] == 32
    assert get_preset("learn2pd").generate_kwargs({"filter": "f"}, gen_length=16)["block_length"] == 16
    argv = ["generate", str(llada_dir), "--input-ids", "5,6", "--preset", "prophet", "--json"]
    assert main([*argv, "--gen-length", "64"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["rows"][0]["generated_ids"]) == 64 and out["sampler"]["name"] == "early_commit"
    assert main([*argv, "--gen-length", "64", "--steps", "16"]) == 0
    assert json.loads(capsys.readouterr().out)["nfe"] <= 16


def test_budget_errors_name_the_sampler_in_use(llada_dir, llada, capsys):
    argv = ["generate", str(llada_dir), "--input-ids", "5,6", "--preset", "prophet", "--gen-length", "64"]
    assert main([*argv, "--steps", "128"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == "dlm-decode generate: error: early_commit: steps (128) must be <= gen_length (64)"
    with pytest.raises(ValueError, match=r"^early_commit: steps \(256\) must be <= gen_length \(64\)"):
        dlm_decode.generate(llada, [[5, 6]], sampler="early_commit", gen_length=64, steps=256)


# ------------------------------------------------------------------------------------------------ Ctrl-C


@needs_data
def test_ctrl_c_in_parallelbench_keeps_the_finished_tasks(tok_dir, capsys, monkeypatch):
    calls = _interrupt_after(monkeypatch, runner, 1)
    rc = _main(_pb(tok_dir, "--tasks", "waiting_line/copy,waiting_line/reverse", "--json"))
    assert rc == 130 and calls == ["waiting_line/copy"]
    cap = capsys.readouterr()
    assert "Traceback" not in cap.err
    assert "dlm-decode parallelbench: interrupted after 1 of 2 tasks" in cap.err
    table = cap.out.splitlines()
    assert any(ln.startswith("waiting_line/copy") for ln in table)
    assert not any(ln.startswith("waiting_line/reverse") for ln in table)
    out = json.loads(table[-1])
    assert out["interrupted"] is True and [t["task"] for t in out["tasks"]] == ["waiting_line/copy"]


@needs_data
def test_ctrl_c_in_run_benchmark_carries_the_finished_results(tok_dir, monkeypatch):
    model, tok = dlm_decode.load_model(tok_dir)
    tasks = load_tasks(SHARED_DATA, ["waiting_line/copy", "waiting_line/reverse"], limit=1)
    _interrupt_after(monkeypatch, runner, 1)
    with pytest.raises(KeyboardInterrupt) as info:
        run_benchmark(model, tok, tasks, {"sampler": "threshold"})
    assert [r.task for r in info.value.results] == ["waiting_line/copy"]


@needs_data
def test_ctrl_c_in_a_sweep_says_where_the_rows_are_and_resumes(tok_dir, tmp_path, capsys, monkeypatch):
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"configs": [{"sampler": "low_confidence", "k": k} for k in (1, 4, 8)]}))
    out = tmp_path / "pb.jsonl"
    argv = _pb(tok_dir, "--tasks", "waiting_line/copy", "--sweep", str(grid), "--out", str(out), "--no-plots")
    _interrupt_after(monkeypatch, sweep, 1)
    assert _main(argv) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"dlm-decode parallelbench: interrupted: 1 row in {out}" in err and "rerun the same command" in err
    assert len(read_rows(out)) == 1
    monkeypatch.undo()
    lines = out.read_text().splitlines()  # a half-written last line (killed mid-write) is dropped on resume
    out.write_text(lines[0] + "\n" + lines[0][:40])
    assert _main(argv) == 0
    err = capsys.readouterr().err
    assert f"dropped a half-written last line of {out}" in err and "1 row done, 2 to run" in err
    rows = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert sorted(r["config"]["k"] for r in rows) == [1, 4, 8]


def test_half_written_last_line_is_dropped_but_a_broken_middle_line_is_an_error(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}\n{"a"')
    notes: list[str] = []
    assert read_rows(path, notice=notes.append) == [{"a": 1}, {"a": 2}]
    assert notes and "half-written last line" in notes[0]
    path.write_text('{"a": 1}\n{"a"\n{"a": 2}\n')
    with pytest.raises(ValueError, match=":2: not a JSON line"):
        read_rows(path)


def test_ctrl_c_elsewhere_exits_130_without_a_traceback(llada_dir, capsys, monkeypatch):
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(dlm_decode, "generate", interrupted)
    assert _main(["generate", str(llada_dir), "--input-ids", "5,6", "--gen-length", "8"]) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == "dlm-decode generate: interrupted"


# ------------------------------------------------------------------------------------------------ progress, threads


@needs_data
def test_parallelbench_shows_a_bar_per_task_and_records_threads(tok_dir, capsys):
    torch.set_num_threads(2)  # the default must not be torch's
    assert main(_pb(tok_dir, "--tasks", "waiting_line/copy,waiting_line/reverse", "--json")) == 0
    cap = capsys.readouterr()
    assert "waiting_line/copy: 100%" in cap.err and "waiting_line/reverse: 100%" in cap.err and "1/1" in cap.err
    out = json.loads(cap.out.splitlines()[-1])
    assert torch.get_num_threads() == 1
    assert [t["threads"] for t in out["tasks"]] == [1, 1] and out["summary"]["threads"] == 1
    assert main(_pb(tok_dir, "--tasks", "waiting_line/copy", "--threads", "2", "--json")) == 0
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert out["tasks"][0]["threads"] == 2 and out["summary"]["threads"] == 2
    assert main(_pb(tok_dir, "--threads", "0")) == 2
    assert "--threads must be >= 1, got 0" in capsys.readouterr().err


@needs_data
def test_sweep_shows_a_bar_per_config_and_rows_record_threads(tok_dir, tmp_path, capsys):
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"configs": [{"sampler": "low_confidence", "k": k} for k in (4, 8)]}))
    out = tmp_path / "pb.jsonl"
    argv = _pb(tok_dir, "--tasks", "waiting_line/copy", "--sweep", str(grid), "--out", str(out), "--json")
    assert main([*argv, "--no-plots"]) == 0
    cap = capsys.readouterr()
    assert "sweep: 100%" in cap.err and "2/2" in cap.err
    assert [r["threads"] for r in read_rows(out)] == [1, 1]
    assert {c["threads"] for c in json.loads(cap.out.splitlines()[-1])["configs"]} == {1}


# ------------------------------------------------------------------------------------------------ --device, --out


def test_device_without_cuda_is_a_clear_error(llada_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for argv in (
        ["generate", str(llada_dir), "--input-ids", "5,6", "--device", "cuda"],
        ["parallelbench", "--model", str(llada_dir), "--data", str(tmp_path), "--device", "cuda"],
        ["demo", "--model", str(llada_dir), "--quick", "--device", "cuda:0"],
    ):
        assert _main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"dlm-decode {argv[0]}: error: --device 'cuda") and "--device cpu" in err, err
        assert len(err.splitlines()) == 1
    assert _main(["generate", str(llada_dir), "--input-ids", "5", "--device", "gpu"]) == 2
    assert "--device 'gpu' is not a torch device" in capsys.readouterr().err
    with pytest.raises(ValueError, match="device 'cuda': CUDA is not available"):
        dlm_decode.load_model(llada_dir, device="cuda")


@needs_data
def test_out_pointing_at_a_directory_is_an_error(tok_dir, tmp_path, capsys):
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"configs": [{"sampler": "low_confidence", "k": 8}]}))
    argv = _pb(tok_dir, "--tasks", "waiting_line/copy", "--sweep", str(grid), "--out", str(tmp_path))
    assert _main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"dlm-decode parallelbench: error: --out {str(tmp_path)!r} is a directory; give a JSONL file path "
        f"such as {str(tmp_path / 'sweep.jsonl')!r}"
    )
    tasks = load_tasks(SHARED_DATA, ["waiting_line/copy"], limit=1)
    with pytest.raises(ValueError, match="is a directory"):
        run_sweep(lambda: None, tasks, expand_grid(json.loads(grid.read_text())), tmp_path)


# ------------------------------------------------------------------------------------------------ path helper, JSON


def test_demo_model_path_works_from_any_directory(tmp_path, monkeypatch):
    from transformers import AutoModel

    monkeypatch.chdir(tmp_path)
    path = dlm_decode.demo_model_path("demo-llada")
    assert path.is_absolute() and path == Path(dlm_decode.__file__).parent / "demo_models" / "demo-llada"
    model = AutoModel.from_pretrained(path)
    assert type(model).__name__ == "LLaDAModelLM"
    with pytest.raises(ValueError, match="unknown demo model 'demo-gpt'; shipped demo models: demo-llada, demo-dream"):
        dlm_decode.demo_model_path("demo-gpt")


def test_generate_json_rows_carry_their_error_field(llada_dir, capsys):
    assert main(["generate", str(llada_dir), "--input-ids", "5,6", "--input-ids", "7", "--gen-length", "8"]) == 0
    capsys.readouterr()
    assert main(["generate", str(llada_dir), "--input-ids", "5,6", "--gen-length", "8", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["error"] for r in rows] == [None]

    def nan_logits(canvas, step):
        return torch.full((*canvas.shape, 16), float("nan"))

    out = dlm_decode.generate(ScriptedModel(nan_logits), [[3, 3]], gen_length=4, block_length=4)
    (row,) = out.to_json()["rows"]
    assert row["error"].startswith("non-finite logits")


# run_script: the recipes' and benchmarks' scripts


def _exit(script_main, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        run_script(script_main, "some/script.py")
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
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # the recipes run as modules of the repository
    proc = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == message
