"""``dlm-decode demo`` on a tiny official-format checkpoint (scores are ~0: the table and JSON shapes are checked)
and its message when the demo model is not shipped."""

from __future__ import annotations

import json

import pytest
from conftest import SHARED_DATA

from dlm_decode.cli import main
from dlm_decode.demo import demo_configs

needs_data = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="official ParallelBench data not present")


pytestmark = pytest.mark.usefixtures("one_thread")


def test_configs_come_from_the_registries():
    from dlm_decode.cache import CACHES
    from dlm_decode.samplers import SAMPLERS

    cfgs = demo_configs(max_configs=1000)
    assert cfgs[0]["label"] == "low_confidence k=1" and cfgs[0]["oracle"]
    assert {c["sampler"] for c in cfgs} >= set(SAMPLERS) - {"oracle"}
    # every cache the demo's (bidirectional) samplers run with; sub_block is the fast_dllm_v2 sampler's alone
    assert {c["cache"] for c in cfgs} == {c for c in CACHES if not CACHES[c].samplers}
    assert "sub_block" in CACHES and CACHES["sub_block"].samplers == ("fast_dllm_v2",)
    assert len(demo_configs(max_configs=4)) == 4


@needs_data
def test_demo_says_clearly_when_the_demo_model_is_not_shipped(capsys, monkeypatch, tmp_path):
    import dlm_decode.models.loading as loading

    monkeypatch.setattr(loading, "DEMO_DIR", tmp_path)  # an install without the demo model
    assert main(["demo", "--quick"]) == 2
    assert "not shipped yet" in capsys.readouterr().err


@needs_data
def test_demo_quick_on_a_tiny_model(tok_dir, capsys):
    rc = main(
        [
            "demo",
            "--model",
            str(tok_dir),
            "--quick",
            "--tasks",
            "waiting_line/copy",
            "--samples",
            "2",
            "--max-configs",
            "3",
            "--json",
        ]
    )
    assert rc == 0
    cap = capsys.readouterr()
    out = json.loads(cap.out.strip().splitlines()[-1])
    assert [r["config"] for r in out["rows"]] == [
        "low_confidence k=1",
        "low_confidence k=4",
        "threshold",
        "oracle (bound)",
    ]
    base, topk, _, bound = out["rows"]
    assert base["nfe"] == 32 and topk["nfe"] == 8 and 1 <= bound["nfe"] <= 32 and bound["score"] == base["score"]
    assert cap.out.splitlines()[0].split() == ["task", "sampler", "cache", "score", "NFE", "tok/step", "tok/s"]


@needs_data
def test_demo_quick_runs_every_quick_config(tok_dir, capsys):
    assert main(["demo", "--model", str(tok_dir), "--quick", "--tasks", "waiting_line/copy", "--samples", "2"]) == 0
    table = capsys.readouterr().out
    cfgs = demo_configs(quick=True)
    assert sum(line.startswith("all tasks") for line in table.splitlines()) + table.count("not run:") >= 1
    for c in cfgs:
        assert c["label"] in table


@needs_data
def test_shipped_held_out_tasks_equal_a_fresh_generation(tmp_path):
    from dlm_decode.demo import HELD_OUT_FILE, write_held_out_tasks

    fresh = tmp_path / "tasks.json"
    write_held_out_tasks(SHARED_DATA, fresh)
    assert fresh.read_text() == HELD_OUT_FILE.read_text()
    official = {
        json.dumps(json.loads(line)["input"], sort_keys=True)
        for task in ("copy", "reverse", "replace_random", "shuffle")
        for line in (SHARED_DATA / "waiting_line" / f"{task}.jsonl").read_text().splitlines()
    }
    shipped = json.loads(HELD_OUT_FILE.read_text())["tasks"]
    inputs = [json.dumps(s["input"], sort_keys=True) for t in shipped if "waiting" in t["name"] for s in t["samples"]]
    assert len(inputs) == 32 and not official & set(inputs)  # none of the official test samples


def test_demo_runs_without_a_data_directory_on_the_shipped_tasks(tok_dir, capsys, monkeypatch):
    import dlm_decode.parallelbench.runner as runner

    monkeypatch.delenv("DLM_PARALLELBENCH_DATA", raising=False)
    monkeypatch.setattr(runner, "default_data_dir", lambda: None)  # a fresh machine without the benchmark files
    argv = ["demo", "--model", str(tok_dir), "--quick", "--samples", "2", "--max-configs", "2", "--json"]
    assert main(argv) == 0
    cap = capsys.readouterr()
    assert "shipped held-out tasks" in cap.err
    out = json.loads(cap.out.strip().splitlines()[-1])
    assert {r["task"] for r in out["rows"]} == {"waiting_line/copy", "waiting_line/shuffle", "puzzle/sudoku_n4_12"}
    # asking for more than the shipped set holds names what is shipped and how to get more
    assert main(["demo", "--model", str(tok_dir), "--samples", "9"]) == 2
    assert "8 samples each" in capsys.readouterr().err


def test_demo_gives_adaptive_block_the_tokenizers_newline_ids():
    from transformers import AutoTokenizer

    from dlm_decode.demo import _with_tokenizer_delimiters
    from dlm_decode.models.loading import resolve_model_path

    tok = AutoTokenizer.from_pretrained(resolve_model_path("demo-llada"))
    cfg = _with_tokenizer_delimiters({"sampler": "adaptive_block", "label": "adaptive_block"}, tok)
    ids = cfg["sampler_options"]["delimiter_ids"]
    assert ids and all("\n" in tok.decode([i]) for i in ids)
    assert _with_tokenizer_delimiters({"sampler": "threshold"}, tok) == {"sampler": "threshold"}


def test_demo_on_the_block_causal_demo_model_shows_the_exact_cache(capsys):
    """`make demo`'s second line: demo-llada2's cached row equals its uncached one (same score, same forwards);
    `dual` and the fixed-length oracle bound are listed as not applying, with the reason."""
    assert main(["demo", "--model", "demo-llada2", "--quick", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = {(r["task"], r["sampler"], r["cache"]): r for r in out["rows"]}
    tasks = {r["task"] for r in out["rows"]}
    for t in tasks:
        plain, cached = rows[(t, "threshold", "none")], rows[(t, "threshold", "prefix")]
        assert (cached["score"], cached["nfe"]) == (plain["score"], plain["nfe"])
        assert "does not apply to the block-causal model" in rows[(t, "threshold", "dual")]["skipped"]
    assert any(r["score"] > 0 for r in out["rows"] if r.get("score") is not None)  # it decodes something right
