"""ParallelBench runner, sweeps and PBx, the oracle bound, plots and the speed benchmark, on tiny checkpoints.

The tiny model writes garbage, so scores are ~0: these tests check shapes, bookkeeping, batching invariance and the
oracle's step counts; the demo-model test at the end checks real scores when the model is shipped.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from conftest import SHARED_DATA, load_script
from fake import ScriptedModel, peaked

import dlm_decode
from dlm_decode.cli import main
from dlm_decode.models.loading import DEMO_MODELS, resolve_model_path
from dlm_decode.parallelbench.runner import load_tasks, run_task, task_seed
from dlm_decode.parallelbench.sweep import attach_oracle, expand_grid, pbx, read_rows, run_sweep
from dlm_decode.samplers.oracle import Oracle

needs_data = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="official ParallelBench data not present")
REPO = Path(__file__).resolve().parent.parent


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model_tok(tok_dir):
    return dlm_decode.load_model(tok_dir)


def _last_json(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------------ runner


@needs_data
def test_cli_table_json_limit_and_text_task_notice(tok_dir, capsys):
    rc = main(
        [
            "parallelbench",
            "--model",
            str(tok_dir),
            "--data",
            str(SHARED_DATA),
            "--tasks",
            "waiting_line/copy,words_to_sentence/easy",
            "--limit",
            "2",
            "--sampler",
            "threshold",
            "--sampler-opt",
            "threshold=0.9",
            "--oracle",
            "--json",
        ]
    )
    assert rc == 0
    cap = capsys.readouterr()
    assert "1 task not scored (skipped): words_to_sentence/easy:" in cap.err
    table = cap.out.splitlines()
    assert table[0].split()[:7] == ["task", "n", "score", "strict", "NFE", "tok/step", "seconds"]
    assert any(line.startswith("words_to_sentence/easy") and "skipped" in line for line in table)
    out = _last_json(cap.out)
    (entry,) = out["tasks"]
    assert {"task", "score", "score_strict", "nfe", "tokens_per_step", "seconds", "n", "oracle_nfe"} <= set(entry)
    assert entry["task"] == "waiting_line/copy" and entry["n"] == 2 and entry["sampler"]["name"] == "threshold"
    assert entry["tokens_per_step"] == pytest.approx(32 / entry["nfe"])
    assert 1 <= entry["oracle_nfe"] <= entry["nfe"] and entry["nfe_ratio"] >= 1
    assert 0 <= entry["score"] <= 100 and len(entry["trace"]) == 32
    assert "words_to_sentence/easy" in out["skipped"]
    assert out["decoding"]["cache"] == "none"  # a bidirectional model's default, named


@needs_data
def test_batching_does_not_change_answers(model_tok):
    model, tok = model_tok
    (task,) = load_tasks(SHARED_DATA, ["waiting_line/reverse"], limit=3)
    task = type(task)(task.name, task.config, [task.samples[0], task.samples[-1], task.samples[1]])
    dec = {"sampler": "threshold", "sampler_options": {"threshold": 0.5}}
    one = run_task(model, tok, task, dec, batch_size=1)
    three = run_task(model, tok, task, dec, batch_size=3)
    assert [o["text"] for o in one.outputs] == [o["text"] for o in three.outputs]
    assert [o["nfe"] for o in one.outputs] == [o["nfe"] for o in three.outputs]
    assert one.trace == three.trace and one.score == three.score


@needs_data
def test_generated_tasks_are_seeded_and_exclude_official_samples(tok_dir, capsys):
    a = load_tasks(SHARED_DATA, ["waiting_line/copy", "puzzle/sudoku_n4_12"], limit=3, generate_seed=11)
    b = load_tasks(SHARED_DATA, ["waiting_line/copy", "puzzle/sudoku_n4_12"], limit=3, generate_seed=11)
    c = load_tasks(SHARED_DATA, ["waiting_line/copy"], limit=3, generate_seed=12)
    assert [t.samples for t in a] == [t.samples for t in b] and a[0].samples != c[0].samples
    assert all(len(t) == 3 for t in a) and task_seed(11, "x") != task_seed(12, "x")
    official = {
        json.dumps(s["input"], sort_keys=True) for s in load_tasks(SHARED_DATA, ["puzzle/sudoku_n4_12"])[0].samples
    }
    gen = load_tasks(SHARED_DATA, ["puzzle/sudoku_n4_12"], limit=40, generate_seed=3, exclude_official=True)[0]
    assert not official & {json.dumps(s["input"], sort_keys=True) for s in gen.samples}
    rc = main(
        [
            "parallelbench",
            "--model",
            str(tok_dir),
            "--data",
            str(SHARED_DATA),
            "--generate-seed",
            "11",
            "--tasks",
            "waiting_line/copy",
            "--limit",
            "2",
            "--sampler",
            "low_confidence",
            "--steps",
            "8",
            "--json",
        ]
    )
    assert rc == 0
    out = _last_json(capsys.readouterr().out)
    assert out["source"].startswith("generated:11") and out["tasks"][0]["nfe"] == 8


def test_bad_task_and_missing_data_are_user_errors(tmp_path, capsys):
    assert main(["parallelbench", "--data", str(tmp_path / "none"), "--tasks", "x/y"]) == 2
    assert "not found" in capsys.readouterr().err
    if SHARED_DATA.is_dir():
        assert main(["parallelbench", "--data", str(SHARED_DATA), "--tasks", "waiting_line/nope"]) == 2
        assert "valid tasks" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ oracle


def _chain_model(ref: list[int], prompt_len: int, vocab: int = 16, free: set[int] = frozenset()):
    """Predicts slot i's reference token once every earlier slot is decoded (or when i is in ``free``),
    a wrong token otherwise: the oracle then needs one step per non-free slot."""

    def fn(canvas, step):
        b, t = canvas.shape
        out = torch.zeros(b, t, vocab)
        for i, y in enumerate(ref):
            ready = bool((canvas[:, prompt_len : prompt_len + i] != 15).all()) or i in free
            out[:, prompt_len + i] = peaked(y if ready else (y % 10) + 3, 0.6 if ready else 0.9, vocab)
        return out

    return ScriptedModel(fn, vocab=vocab)


def test_oracle_commits_exactly_the_matching_slots():
    ref = [4, 5, 6, 7, 8, 9, 10, 11]
    kw = {"gen_length": 8, "block_length": 8, "cache": "none"}
    sampler = Oracle(reference=(tuple(ref),))
    out = dlm_decode.generate(_chain_model(ref, 2), [[3, 3]], sampler=sampler, trace=True, **kw)
    assert out.rows[0].generated_ids == ref and out.nfe == 8  # strictly left to right
    assert out.trace[0].tolist() == list(range(8))
    out = dlm_decode.generate(_chain_model(ref, 2, free=set(range(8))), [[3, 3]], sampler=sampler, **kw)
    assert out.rows[0].generated_ids == ref and out.nfe == 1  # everything already right: one step


# ------------------------------------------------------------------------------------------------ sweeps and PBx


def _row(task, cid, score, tps, method="threshold b32", sampler="threshold", nfe=None, seconds=1.0):
    gen = 32
    return {
        "task": task,
        "config_id": cid,
        "label": f"{method} {cid}",
        "method": method,
        "score": score,
        "score_strict": score,
        "tokens_per_step": tps,
        "nfe": nfe or gen / tps,
        "n": 4,
        "gen_length": gen,
        "seconds": seconds,
        "config": {"sampler": sampler, "block_length": 32},
        "trace": [0, 1, 2, 1],
    }


def test_pbx_on_hand_made_rows():
    rows = [
        _row("a", "c1", 100, 1.0),
        _row("b", "c1", 90, 1.0),  # mean 95, 1 tok/step
        _row("a", "c2", 90, 3.0),
        _row("b", "c2", 76, 2.0),  # mean 83, 2.5
        _row("a", "c3", 80, 6.0),
        _row("b", "c3", 50, 4.0),  # mean 65, 5
        _row("a", "c4", 99, 9.0),  # misses task b: never counts
        _row("a", "or", 100, 20.0, "oracle b32", "oracle"),
        _row("b", "or", 90, 20.0, "oracle b32", "oracle"),
    ]
    got = pbx(rows)
    assert got["PB90"]["tokens_per_step"] == 1.0 and got["PB90"]["label"].endswith("c1")
    assert got["PB80"]["tokens_per_step"] == 2.5 and got["PB70"]["tokens_per_step"] == 2.5
    assert got["PB60"]["tokens_per_step"] == 5.0
    assert pbx(rows, levels=(99,)) == {"PB99": None}
    ratios = {r["config_id"]: r["nfe_ratio"] for r in attach_oracle(rows) if r["task"] == "a"}
    assert ratios["c1"] == pytest.approx(20.0) and ratios["or"] == pytest.approx(1.0)


def test_grid_expansion_follows_the_paper_axes():
    cfgs = expand_grid(
        {"block_lengths": [8, 32], "top_k": [1, 16], "threshold": [0.5], "factor": [1.0], "oracle": True}
    )
    labels = [c["label"] for c in cfgs]
    assert "top-k k=16 b8" not in labels and "top-k k=16 b32" in labels  # k never exceeds the block
    assert {"oracle b8", "oracle b32", "threshold 0.5 b8", "factor 1.0 b32"} <= set(labels)


def test_plots_written_from_rows(tmp_path):
    from dlm_decode.parallelbench.plots import write_plots

    rows = [
        _row(t, c, s, k, m, seconds=0.5 * k)
        for t in ("x/a", "x/b")
        for c, s, k, m in (("c1", 90, 1.0, "top-k b32"), ("c2", 70, 2.0, "top-k b32"), ("c3", 80, 1.5, "threshold b32"))
    ]
    rows += [_row(t, "or", 90, 6.0, "oracle b32", "oracle") for t in ("x/a", "x/b")]
    path = tmp_path / "sweep.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    plots = write_plots(path)
    assert set(plots) == {"score_vs_parallelism", "pareto", "decoding_order"}
    assert all(p.is_file() and p.stat().st_size > 1000 and p.parent == tmp_path for p in plots.values())


@needs_data
def test_sweep_appends_rows_and_resumes_without_the_model(model_tok, tmp_path):
    tasks = load_tasks(SHARED_DATA, ["waiting_line/copy"], limit=1)
    configs = expand_grid(
        {
            "configs": [
                {"sampler": "low_confidence", "k": 1},
                {"sampler": "low_confidence", "k": 4},
                {"sampler": "low_confidence", "k": 5},  # does not divide 32: skipped with a notice
                {"sampler": "oracle"},
            ]
        }
    )
    out, notes = tmp_path / "s.jsonl", []
    meta = {"model": "tiny", "source": "test", "limit": 1}
    rows = run_sweep(lambda: model_tok, tasks, configs, out, meta=meta, notice=notes.append)
    assert len(rows) == 3 and len(read_rows(out)) == 3 and any("k=5 must divide" in n for n in notes)
    by = {r["label"]: r for r in attach_oracle(rows)}
    assert by["top-k k=4"]["nfe"] == 8 and by["top-k k=1"]["nfe"] == 32
    assert by["top-k k=1"]["oracle_nfe"] == by["oracle"]["nfe"] <= 32

    def no_model():
        raise AssertionError("a finished sweep must not load the model")

    again = run_sweep(no_model, tasks, configs, out, meta=meta, notice=notes.append)
    assert len(again) == 3 and len(read_rows(out)) == 3


# ------------------------------------------------------------------------------------------------ bench, demo model


@needs_data
def test_bench_speed_prints_one_json_line_last(tok_dir, capsys):
    bench = load_script("benchmarks/bench_speed.py")
    rc = bench.main(
        [
            "--model",
            str(tok_dir),
            "--data",
            str(SHARED_DATA),
            "--tasks",
            "waiting_line/copy",
            "--prompts",
            "2",
            "--batch-size",
            "2",
            "--gen-length",
            "8",
            "--repeats",
            "2",
            "--warmup",
            "1",
            "--samplers",
            "low_confidence,threshold",
            "--caches",
            "none",
        ]
    )
    assert rc == 0
    out = _last_json(capsys.readouterr().out)
    assert [(r["sampler"], r["cache"]) for r in out["results"]] == [("low_confidence", "none"), ("threshold", "none")]
    base, thr = out["results"]
    assert base["speedup"] == 1.0 and base["nfe"] == 8 and base["same_as_baseline"] == 1.0
    assert thr["nfe"] <= 8 and thr["tokens_per_s_spread"][0] <= thr["tokens_per_s"] <= thr["tokens_per_s_spread"][1]
    assert "token_forwards_per_token" in thr and "peak_mem_mb" in thr and out["memory"]


@needs_data
def test_bench_speed_interleaves_the_timed_passes(tok_dir, capsys, monkeypatch):
    """Warm-up passes first, pair by pair; then every timed pass runs each pair once, the order reversed on odd
    passes, so a ratio to the baseline compares runs taken side by side."""
    bench = load_script("benchmarks/bench_speed.py")
    calls, real = [], bench.decode_all

    def recorded(model, tok, chats, kw, batch_size):
        calls.append(kw["sampler"][0] + kw["cache"][0])  # "ln": low_confidence/none, "tn", "td": threshold/dual
        return real(model, tok, chats, kw, batch_size)

    monkeypatch.setattr(bench, "decode_all", recorded)
    argv = ["--model", str(tok_dir), "--data", str(SHARED_DATA), "--tasks", "waiting_line/copy", "--prompts", "1"]
    argv += ["--batch-size", "1", "--gen-length", "8", "--repeats", "3", "--warmup", "1"]
    assert bench.main(argv + ["--samplers", "low_confidence,threshold", "--caches", "none,dual"]) == 0
    pairs = ["ln", "ld", "tn", "td"]
    assert calls == pairs + pairs + pairs[::-1] + pairs
    out = _last_json(capsys.readouterr().out)
    assert [r["sampler"][0] + r["cache"][0] for r in out["results"]] == pairs


# The shipped demo models decode official samples one token per step and solve them (decoded here, not read from
# scores.json; fp32 at T=0 is deterministic, so a weight, tokenizer or decode-loop change that breaks reading the
# prompt shows as a drop). demo-llada (round seven's u1 + 1,200 CPU steps + 200 with self rows + 3,631 H100 steps with
# sort weighted up, mean 96.8): reverse
# and copy of six people (official samples 75-82: entries 48+ tokens back), the three index tasks, the random-output
# tasks (the look-up of a last name by its first name and the comparison with the people already written), sort of
# three people, sudoku (64-token answers) and the latin square (a solved square is re-checked: each row and column
# holds each symbol once).
# The bar is what was solved at batch 8, less one on the tasks whose answer is any valid one (random-output tasks,
# shuffle, sort, latin square), so a near-tie that rounds the other way on another CPU does not fail the test.
# demo-dream: the same cases, re-measured for its weights. Both re-measured for the weights of the twenty-fifth
# round (demo-llada 96.8, demo-dream 96.2; sort 8 of 8 on both; demo-dream's latin square 5 of these 8, 88 of 100).
DEMO_SOLVES = {  # (model, case "task" or "task#label") -> (first official sample, how many of the eight must be solved)
    ("demo-llada", "waiting_line/reverse"): (75, 8),
    ("demo-llada", "waiting_line/copy"): (75, 8),
    ("demo-llada", "waiting_line/copy#three"): (0, 8),
    ("demo-llada", "waiting_line/insert_index"): (0, 8),
    ("demo-llada", "waiting_line/remove_index"): (0, 8),
    ("demo-llada", "waiting_line/replace_index"): (75, 8),
    ("demo-llada", "waiting_line/shuffle"): (0, 7),
    ("demo-llada", "waiting_line/insert_random"): (75, 6),
    ("demo-llada", "waiting_line/replace_random"): (75, 6),
    ("demo-llada", "waiting_line/remove_random"): (0, 7),
    ("demo-llada", "waiting_line/sort"): (0, 7),
    ("demo-llada", "puzzle/sudoku_n4_12"): (0, 7),
    ("demo-llada", "puzzle/latin_square_n4"): (0, 7),
    ("demo-dream", "waiting_line/reverse"): (75, 8),
    ("demo-dream", "waiting_line/copy"): (75, 8),
    ("demo-dream", "waiting_line/copy#three"): (0, 8),
    ("demo-dream", "waiting_line/insert_index"): (0, 8),
    ("demo-dream", "waiting_line/remove_index"): (0, 8),
    ("demo-dream", "waiting_line/replace_index"): (75, 8),
    ("demo-dream", "waiting_line/shuffle"): (0, 7),
    ("demo-dream", "waiting_line/insert_random"): (75, 7),
    ("demo-dream", "waiting_line/replace_random"): (75, 6),
    ("demo-dream", "waiting_line/remove_random"): (0, 7),
    ("demo-dream", "waiting_line/sort"): (0, 7),
    ("demo-dream", "puzzle/sudoku_n4_12"): (0, 8),
    ("demo-dream", "puzzle/latin_square_n4"): (0, 4),
}


@needs_data
@pytest.mark.parametrize("name,case", sorted(DEMO_SOLVES))
def test_shipped_demo_models_solve_official_samples(name, case):
    model, tok = dlm_decode.load_model(name)
    task, first, solved_at_least = case.split("#")[0], *DEMO_SOLVES[name, case]
    (t,) = load_tasks(SHARED_DATA, [task], limit=first + 8)
    t = dataclasses.replace(t, samples=t.samples[first:])
    res = run_task(model, tok, t, {}, batch_size=8, progress=False)
    solved = [o for o in res.outputs if o["score"] == 1.0]
    assert res.n == 8 and res.nfe == (64 if task.startswith("puzzle/") else 32)  # one token per step
    assert len(solved) >= solved_at_least, [o["text"] for o in res.outputs]
    for o, sample in zip(res.outputs, t.samples, strict=True):
        if o["score"] != 1.0:
            continue
        if isinstance(sample["answer"], str):  # deterministic task: a solved answer is the sample's own list
            assert o["text"].startswith(sample["answer"]), (o["text"], sample["answer"])
        elif task.endswith("shuffle"):  # a solved shuffle holds exactly the input's people (checked here directly)
            written = json.loads(o["text"][: o["text"].index("]") + 1])
            assert sorted(written) == sorted(sample["answer"]["input"]), (o["text"], sample["answer"])
        elif task.endswith("latin_square_n4"):  # a solved square: every row and column holds each symbol once
            grid = [row.split(",") for row in o["text"].strip().splitlines()[:4]]
            symbols = sorted(sample["answer"]["symbols"])
            columns = list(zip(*grid, strict=True))
            assert all(sorted(r) == symbols for r in grid) and all(sorted(c) == symbols for c in columns), o


GRIDS_DIR = Path(__file__).parents[1] / "benchmarks" / "grids"


@pytest.mark.parametrize("grid", sorted(p.name for p in GRIDS_DIR.glob("*.json")))
def test_shipped_grids_expand_to_runnable_configs_and_their_filters_exist(grid, monkeypatch):
    from dlm_decode.parallelbench.sweep import check_config, load_grid

    root = Path(__file__).parents[1]
    monkeypatch.chdir(root)  # the grids name filters relative to the repository root, as the documented commands run
    configs = expand_grid(load_grid(str(GRIDS_DIR / grid)))
    assert len(configs) >= 2
    filters = [c["sampler_options"]["filter"] for c in configs if "filter" in (c["sampler_options"] or {})]
    for cfg in configs:
        check_config(cfg)
    for f in filters:  # "shipped" (each demo model's own filter) or a path to a filter with its json beside it
        if f == "shipped":
            for name in DEMO_MODELS:
                assert (resolve_model_path(name) / "learn2pd_filter.safetensors").is_file(), name
        else:
            assert (root / f).is_file() and (root / f).with_suffix(".json").is_file(), f
