"""Runs that used to do nothing silently: each is now an error (exit 2, one line naming what was wrong and what is
valid) raised before any model is loaded or any sample decoded.

    pytest tests/test_parallelbench_bad_input.py
"""

from __future__ import annotations

import json

import pytest
from conftest import SHARED_DATA

import dlm_decode
from dlm_decode.cli import main
from dlm_decode.parallelbench.runner import load_tasks
from dlm_decode.parallelbench.sweep import expand_grid, run_sweep

needs_data = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="official ParallelBench data not present")
PREFIX = "dlm-decode parallelbench: error: "


@pytest.fixture
def no_loading(monkeypatch):
    """Fail the test if anything tries to load a model: these errors must come first."""

    def boom(*a, **k):
        raise AssertionError("a model was loaded before the input error was reported")

    monkeypatch.setattr(dlm_decode, "load_model", boom)
    return boom


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines and lines[-1].startswith(PREFIX) and "Traceback" not in err, err
    return lines[-1]


# ------------------------------------------------------------------------------------------------ --data


@needs_data
def test_data_dir_one_level_too_low_names_the_parent(capsys, no_loading):
    group = SHARED_DATA / "waiting_line"
    assert main(["parallelbench", "--data", str(group), "--limit", "1"]) == 2
    line = _error_line(capsys)
    assert "no ParallelBench task" in line and str(group) in line
    assert f"pass its parent {str(SHARED_DATA)!r}" in line
    assert main(["parallelbench", "--data", str(group), "--list-tasks"]) == 2
    assert "no ParallelBench task" in _error_line(capsys)
    with pytest.raises(ValueError, match="no ParallelBench task .* pass its parent"):
        load_tasks(group, limit=1)


@needs_data
def test_data_dir_one_level_too_high_names_the_data_dir_below(tmp_path, capsys, no_loading):
    (tmp_path / "pb").symlink_to(SHARED_DATA, target_is_directory=True)
    assert main(["parallelbench", "--data", str(tmp_path), "--limit", "1"]) == 2
    line = _error_line(capsys)
    assert "no ParallelBench task" in line and f"pass {str(tmp_path / 'pb')!r}" in line
    with pytest.raises(ValueError, match="no ParallelBench task"):
        load_tasks(tmp_path, generate_seed=1, limit=1)


def test_empty_data_dir_says_what_a_data_dir_holds(tmp_path, capsys, no_loading):
    assert main(["parallelbench", "--data", str(tmp_path), "--limit", "1"]) == 2
    line = _error_line(capsys)
    assert "no ParallelBench task" in line and "<group>/task_config.yaml" in line


# ------------------------------------------------------------------------------------------------ sweep grids


def _grid(tmp_path, grid: dict) -> str:
    path = tmp_path / "grid.json"
    path.write_text(json.dumps(grid))
    return str(path)


def _sweep(tmp_path, grid: dict) -> list[str]:
    args = ["parallelbench", "--data", str(SHARED_DATA), "--tasks", "waiting_line/copy", "--limit", "1"]
    return [*args, "--sweep", _grid(tmp_path, grid), "--out", str(tmp_path / "s.jsonl"), "--no-plots"]


@needs_data
def test_grid_with_an_unknown_key_lists_the_known_keys(tmp_path, capsys, no_loading):
    assert main(_sweep(tmp_path, {"blocks": [32], "top_k": [1]})) == 2
    line = _error_line(capsys)
    assert "unknown key(s) blocks" in line
    assert "known keys: block_lengths, caches, configs, factor, oracle, threshold, top_k" in line
    assert not (tmp_path / "s.jsonl").exists()
    with pytest.raises(ValueError, match="unknown key"):
        expand_grid({"blocks": [32]})
    with pytest.raises(ValueError, match=r"config 0: unknown key\(s\) sampler_opts"):
        expand_grid({"configs": [{"sampler": "factor", "sampler_opts": {"factor": 1.0}}]})
    with pytest.raises(ValueError, match="expands to no config"):
        expand_grid({})


@needs_data
def test_misspelled_sampler_option_is_an_error_naming_the_valid_options(tmp_path, capsys, no_loading):
    grid = {"configs": [{"sampler": "low_confidence", "k": 1}, {"sampler": "factor", "sampler_options": {"facter": 1}}]}
    assert main(_sweep(tmp_path, grid)) == 2
    line = _error_line(capsys)
    assert "has no option(s) facter" in line and "valid options: factor" in line
    assert not (tmp_path / "s.jsonl").exists()
    tasks = load_tasks(SHARED_DATA, ["waiting_line/copy"], limit=1)
    with pytest.raises(ValueError, match="no option.*facter.*valid options: factor"):
        run_sweep(no_loading, tasks, expand_grid(grid), tmp_path / "api.jsonl", notice=lambda m: None)
    assert not (tmp_path / "api.jsonl").exists()
    grid = {"configs": [{"sampler": "no_such_sampler"}]}
    assert main(_sweep(tmp_path, grid)) == 2
    assert "valid samplers: " in _error_line(capsys)


@needs_data
def test_grid_whose_every_config_is_invalid_is_an_error(tmp_path, capsys, no_loading):
    grid = {"configs": [{"sampler": "low_confidence", "k": 3}, {"sampler": "low_confidence", "k": 5}]}
    assert main(_sweep(tmp_path, grid)) == 2
    line = _error_line(capsys)
    assert "no config of the grid runs" in line and "k=3 must divide gen_length 32" in line
    tasks = load_tasks(SHARED_DATA, ["waiting_line/copy"], limit=1)
    with pytest.raises(ValueError, match="no config of the grid runs"):
        run_sweep(no_loading, tasks, expand_grid(grid), tmp_path / "api.jsonl", notice=lambda m: None)


# ------------------------------------------------------------------------------------------------ presets, plots


@needs_data
def test_learn2pd_preset_without_a_filter_is_an_error(capsys, no_loading):
    argv = ["parallelbench", "--data", str(SHARED_DATA), "--tasks", "waiting_line/copy", "--limit", "1"]
    assert main([*argv, "--preset", "learn2pd"]) == 2
    line = _error_line(capsys)
    assert "preset 'learn2pd' needs the sampler option 'filter'" in line and "eotp_only" in line
    assert main(["generate", "demo-llada", "--input-ids", "5,6", "--preset", "learn2pd_no_eotp"]) == 2
    assert "needs the sampler option 'filter'" in capsys.readouterr().err
    from dlm_decode.samplers.presets import get_preset

    with pytest.raises(ValueError, match="needs the sampler option 'filter'"):
        get_preset("learn2pd").generate_kwargs()
    kw = get_preset("learn2pd").generate_kwargs({"filter": "x.safetensors"})
    assert kw["sampler_options"] == {"accept": 0.96, "eotp": True, "filter": "x.safetensors"}


def _rows(tasks: tuple[str, ...]) -> list[dict]:
    return [
        {
            "task": t,
            "config_id": c,
            "label": c,
            "method": "top-k b32",
            "score": 50.0,
            "score_strict": 50.0,
            "tokens_per_step": k,
            "nfe": 32 / k,
            "n": 2,
            "gen_length": 32,
            "seconds": 1.0,
            "config": {"sampler": "low_confidence", "block_length": 32},
            "trace": [0, 1, 2, 3],
        }
        for t in tasks
        for c, k in (("c1", 1.0), ("c2", 2.0))
    ]


def test_plot_task_that_is_not_in_the_file_keeps_the_pngs(tmp_path, capsys):
    from dlm_decode.parallelbench.plots import write_plots

    path = tmp_path / "pb.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _rows(("waiting_line/copy", "puzzle/sudoku_n4_12"))))
    png = write_plots(path)["decoding_order"]
    before = png.read_bytes()
    assert main(["parallelbench", "--plot", str(path), "--plot-task", "waiting_line/cpy"]) == 2
    line = _error_line(capsys)
    assert "'waiting_line/cpy'" in line and "tasks: puzzle/sudoku_n4_12, waiting_line/copy" in line
    assert png.read_bytes() == before
    with pytest.raises(ValueError, match="tasks: puzzle/sudoku_n4_12, waiting_line/copy"):
        write_plots(path, task="nope")
    assert png.read_bytes() == before


@needs_data
def test_sweep_plot_task_is_checked_before_decoding(tmp_path, capsys, no_loading):
    argv = _sweep(tmp_path, {"configs": [{"sampler": "low_confidence", "k": 1}]})
    argv = [a for a in argv if a != "--no-plots"]
    assert main([*argv, "--plot-task", "waiting_line/cpy"]) == 2
    line = _error_line(capsys)
    assert "--plot-task 'waiting_line/cpy'" in line and "tasks of this run: waiting_line/copy" in line
    assert not (tmp_path / "s.jsonl").exists()


@needs_data
def test_sweep_checks_the_shipped_filter_against_the_block_before_loading(tmp_path, capsys, no_loading):
    # demo-llada's shipped Learn2PD filter is trained for block 32; a sweep that asks for it at block 16 learns so from
    # the checkpoint directory before any weight is read (it used to fail when the sweep reached that config)
    lf16 = {"sampler": "learned_filter", "sampler_options": {"filter": "shipped"}, "block_length": 16}
    assert main(_sweep(tmp_path, {"configs": [lf16]})) == 2
    line = _error_line(capsys)
    assert "no config of the grid runs on these tasks" in line
    assert "learn2pd_filter.safetensors was trained for block length 32, but decoding uses block length 16" in line
    assert not (tmp_path / "s.jsonl").exists()


@needs_data
def test_sweep_skips_a_config_the_model_cannot_run_and_runs_the_rest(tmp_path, capsys):
    lf16 = {"sampler": "learned_filter", "sampler_options": {"filter": "shipped"}, "block_length": 16}
    lf32 = {"sampler": "learned_filter", "sampler_options": {"filter": "shipped"}, "block_length": 32}
    assert main(_sweep(tmp_path, {"configs": [lf16, lf32]})) == 0
    err = capsys.readouterr().err
    assert "skipping config" in err and "trained for block length 32, but decoding uses block length 16" in err
    rows = [json.loads(x) for x in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert [r["config"]["block_length"] for r in rows] == [32]
    assert rows[0]["task"] == "waiting_line/copy" and rows[0]["score"] == 100.0  # the shipped model copies


@needs_data
def test_run_sweep_without_facts_skips_what_the_loaded_model_cannot_run(tmp_path):
    # a Python caller that gives run_sweep no facts: the configs the model cannot run are found once the model is
    # loaded and skipped with a notice, before the first decode, and the others run
    lf16 = {"sampler": "learned_filter", "sampler_options": {"filter": "shipped"}, "block_length": 16}
    lf32 = {"sampler": "learned_filter", "sampler_options": {"filter": "shipped"}, "block_length": 32}
    tasks = load_tasks(SHARED_DATA, ["waiting_line/copy"], limit=1)
    notes: list[str] = []
    loads: list[int] = []

    def load():
        loads.append(1)
        model, tok = dlm_decode.load_model("demo-llada")
        return model, tok

    out = tmp_path / "s.jsonl"
    rows = run_sweep(load, tasks, expand_grid({"configs": [lf16, lf32]}), out, notice=notes.append)
    assert loads == [1]
    assert [r["config"]["block_length"] for r in rows] == [32] and rows[0]["score"] == 100.0
    assert [json.loads(x)["config"]["block_length"] for x in out.read_text().splitlines()] == [32]
    skipped = [n for n in notes if n.startswith("skipping config")]
    assert len(skipped) == 1
    assert "trained for block length 32, but decoding uses block length 16" in skipped[0]


@needs_data
@pytest.mark.parametrize("limit", ["0", "-3"])
def test_limit_below_one_is_an_error_not_a_table_of_empty_tasks(limit, tmp_path, capsys, no_loading):
    # --limit 0 used to score nothing and print every task as "0 skipped" with exit status 0 (a silent empty result)
    argv = ["parallelbench", "--data", str(SHARED_DATA), "--tasks", "waiting_line/copy", "--limit", limit]
    for extra in ([], ["--sweep", "quick", "--out", str(tmp_path / "s.jsonl")]):
        assert main([*argv, *extra]) == 2
        line = _error_line(capsys)
        assert line.endswith(f"--limit must be >= 1 (samples per task; leave it out for all), got {limit}")
    assert not (tmp_path / "s.jsonl").exists()
