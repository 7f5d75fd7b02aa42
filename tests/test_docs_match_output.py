"""What the docs say an output is, checked against the output (issue 78's six mismatches; the commands themselves run
in ``test_docs_commands.py``, whose ``EXPECT`` also pins the lossless and ``--input-ids`` examples' printed answers)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dlm_decode.cli import decoding_kwargs, main, parse_args
from dlm_decode.demo import demo_configs
from dlm_decode.parallelbench.aup import aup_table
from dlm_decode.parallelbench.runner import TaskResult, format_table, summarize

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
CLI_MD = (ROOT / "docs" / "cli.md").read_text()


def flat(text: str) -> str:
    return " ".join(text.split())


def test_demo_quick_is_described_as_it_runs():
    cfgs = demo_configs(quick=True)
    samplers = {c["sampler"] for c in cfgs}
    caches = {c["cache"] for c in cfgs} - {"none"}
    assert (len(cfgs), len(samplers), len(caches)) == (8, 5, 2)
    line = next(x for x in README.splitlines() if x.startswith("dlm-decode demo --quick"))
    assert f"{len(cfgs)} configs: {len(samplers)} samplers, {len(caches)} caches" in line
    said = flat(CLI_MD)
    assert f"`--quick`: 3 tasks, 2 samples, {len(cfgs)} configs of {len(samplers)} samplers" in said
    for name in samplers | caches:
        assert f"`{name}`" in said[said.index("`--quick`:") :][:400]


def test_parallelbench_json_writes_option_values_as_the_sampler_took_them():
    opts = ["--sampler-opt", "threshold=0.9", "--cache", "dual", "--cache-opt", "refresh_interval=4", "--json"]
    args = parse_args(["parallelbench", "--model", "demo-llada", "--sampler", "threshold", *opts, "--outputs"])
    kw = decoding_kwargs(args)
    assert kw["sampler_options"] == {"threshold": 0.9} and isinstance(kw["sampler_options"]["threshold"], float)
    assert kw["cache_options"] == {"refresh_interval": 4} and isinstance(kw["cache_options"]["refresh_interval"], int)
    assert '`"sampler_options": {"threshold": 0.9}`' in flat(CLI_MD)


def test_parallelbench_table_mean_row_is_a_mean_of_seconds_too():
    results = [
        TaskResult("a", 1, 32, score=100.0, score_strict=100.0, nfe=10.0, tokens_per_step=3.2, seconds=0.12),
        TaskResult("b", 1, 32, score=50.0, score_strict=0.0, nfe=20.0, tokens_per_step=1.6, seconds=0.50),
    ]
    mean = format_table(results).splitlines()[-1].split()
    assert mean[0] == "mean" and mean[-1] == "0.31"  # (0.12 + 0.50) / 2, not the total 0.62
    assert summarize(results)["seconds"] == pytest.approx(0.62)  # the JSON summary keeps the total, as documented
    assert "a `mean` row with each column's mean over the scored tasks (seconds too" in flat(CLI_MD)


def test_aup_words_match_aup_py_on_the_documented_example():
    """The first point counts unweighted: one fast, poor config outranks a slow, accurate one, as docs/cli.md says."""
    rows = [
        {"method": "early_commit", "task": "t", "tokens_per_step": 8.0, "score": 30.0, "config": {}},
        {"method": "threshold", "task": "t", "tokens_per_step": 2.0, "score": 100.0, "config": {}},
    ]
    table = aup_table(rows)
    assert table["early_commit"]["t"] == pytest.approx(240.0) and table["threshold"]["t"] == pytest.approx(200.0)
    said = flat(CLI_MD)
    assert "the first point counts as the rectangle `rho_1 * y_1`, unweighted" in said
    assert re.search(r"8 tokens per step scoring 30 has AUP 240; one at 2 scoring 100 has 200", said)


def test_an_empty_answer_is_said_not_printed_as_a_blank_line(capsys):
    """The chat-trained demo model answers raw ids 5,6,7 with EOS at once."""
    argv = ["generate", "demo-llada", "--input-ids", "5,6,7", "--gen-length", "32", "--sampler", "threshold"]
    assert main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("[0] nfe=") and out[1].startswith("(empty answer: the text ends at once; generated_ids [")
