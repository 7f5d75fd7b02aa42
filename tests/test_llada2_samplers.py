"""Every within-block rule on a block-causal model (LLaDA2): it decodes (no MASK left, the prompt untouched), and the
exact cache gives the tokens and the forwards of decoding without a cache; rules that cannot work say why first."""

from __future__ import annotations

import json

import pytest
from checkpoints import write_tokenizer
from conftest import SHARED_DATA
from llada2_reference import EOS, MASK, write_llada2

import dlm_decode
from dlm_decode.cli import main
from dlm_decode.models.loading import load_model

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [[1, 2, 3], list(range(3, 19))]  # mid-block and on the 16 boundary, in one batch

RULES = {
    "low_confidence": {},
    "threshold": {"threshold": 0.5},
    "factor": {"factor": 1.0},
    "entropy_threshold": {"eta": 0.5},
    "local_leap": {},
    "early_commit": {},
    "lossless": {},
    "llada2": {"threshold": 0.7},
    "token_editing": {"threshold": 0.7, "editing_threshold": 0.6, "max_post_steps": 2},
}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return load_model(write_llada2(tmp_path_factory.mktemp("llada2") / "m", seed=5))[0]


@pytest.mark.parametrize("name", sorted(RULES))
def test_rule_runs_and_the_exact_cache_changes_nothing(model, name):
    kw = dict(sampler=name, sampler_options=RULES[name], gen_length=32, block_length=16, steps=32)
    none = dlm_decode.generate(model, PROMPTS, cache="none", **kw)
    exact = dlm_decode.generate(model, PROMPTS, cache="prefix", **kw)
    p = none.sequences.shape[1] - 32
    for i, pr in enumerate(PROMPTS):
        assert none.sequences[i, p - len(pr) : p].tolist() == pr
        assert MASK not in none.rows[i].generated_ids
        assert exact.rows[i].generated_ids == none.rows[i].generated_ids, (name, i)
    assert exact.nfe == none.nfe
    assert exact.token_forwards < none.token_forwards


def test_learned_filter_runs_without_a_filter_or_says_why(model):
    out = dlm_decode.generate(
        model,
        PROMPTS,
        sampler="learned_filter",
        sampler_options={"eotp": True},
        gen_length=32,
        block_length=16,
        steps=32,
    )
    assert all(MASK not in r.generated_ids for r in out.rows)
    with pytest.raises(ValueError, match="filter"):
        dlm_decode.generate(
            model,
            PROMPTS,
            sampler="learned_filter",
            sampler_options={"filter": "shipped"},
            gen_length=32,
            block_length=16,
        )


def test_adaptive_block_is_refused_before_any_work(model):
    with pytest.raises(ValueError, match="block-causal"):
        dlm_decode.generate(model, PROMPTS, sampler="adaptive_block", gen_length=32, block_length=16)


def test_parallelbench_runner_and_cli_take_the_family(tmp_path, capsys):
    """The runner loads a LLaDA2 checkpoint, decodes open-ended with the preset and the default exact cache."""
    if not (SHARED_DATA / "waiting_line").exists():
        pytest.skip("official ParallelBench data not present")
    path = write_llada2(tmp_path / "m", seed=5)
    write_tokenizer(path)
    argv = ["parallelbench", "--model", str(path), "--data", str(SHARED_DATA), "--tasks", "waiting_line/copy"]
    assert main(argv + ["--limit", "2", "--preset", "llada2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    (entry,) = out["tasks"]
    assert entry["n"] == 2 and entry["sampler"]["name"] == "llada2" and entry["cache"]["name"] == "prefix"
    assert entry["nfe"] >= 1
    assert out["decoding"]["cache"] == "prefix"  # the default the run used, not the request's null
    assert main(argv + ["--limit", "1", "--preset", "llada2", "--cache", "none", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["decoding"]["cache"] == "none"
    # one token per step with no cache named is not the oracle's uncached reference decode here: it runs the default
    for cache, want in ((None, "prefix"), ("none", "none")):
        extra = [] if cache is None else ["--cache", cache]
        assert main(argv + ["--limit", "1", "--sampler", "low_confidence", *extra, "--json"]) == 0
        (entry,) = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["tasks"]
        assert entry["cache"]["name"] == want


def test_oracle_bound_on_an_open_ended_decode(tmp_path):
    """Learn2PD's oracle on a block-causal model: the reference decode stops after the block holding EOS (MASK past
    it); the oracle pass reproduces it token for token in no more forwards, and its records label real proposals."""
    from dlm_decode.decode.oracle import oracle_generate

    m = load_model(write_llada2(tmp_path / "m", seed=1, eos_scale=3.0))[0]
    prompts = [[1, 2, 3], list(range(3, 23)), [7] * 21]  # rows 0 and 1 end at slot 4 (EOS), row 2 runs to the cap
    ref, orc, (conf, label) = oracle_generate(m, prompts, gen_length=64, block_length=16, record=True)
    assert [r.generated_ids.index(EOS) if EOS in r.generated_ids else None for r in ref.rows] == [4, 4, None]
    for r, o in zip(ref.rows, orc.rows, strict=True):
        assert o.generated_ids == r.generated_ids
    assert orc.nfe <= ref.nfe
    assert conf.shape == label.shape and conf.shape[1] == 16 and conf.shape[0] > 0
    assert 0 < float(label.mean()) <= 1
    # the first step's records are each row's grid block: its prompt slots (3, 4 and 5 of 16) read confidence 1
    for row, fixed in enumerate((3, 4, 5)):
        assert conf[row, :fixed].tolist() == [1.0] * fixed and bool(label[row, :fixed].all())
        assert float(conf[row, fixed:].max()) < 1.0


def test_learned_filter_reads_each_rows_grid_block(model, tmp_path):
    """A filter that accepts every slot commits each row's whole block in one forward, in a batch whose rows' grid
    blocks end at different slots (prompts of 3 and 20 on a grid of 16: each row's block is its own 16 slots, not
    the 16 after the batch's shared block start): one forward per block."""
    import torch

    from dlm_decode.samplers.learned_filter import FilterMLP, save_filter

    f = FilterMLP(16)
    with torch.no_grad():
        for p in f.parameters():
            p.zero_()
        f.net[-1].bias.fill_(10.0)  # sigmoid(10) > accept: every slot
    path = save_filter(f, tmp_path / "all")
    prompts = [[1, 2, 3], list(range(3, 23))]
    kw = dict(gen_length=32, block_length=16, steps=32, cache="prefix")
    out = dlm_decode.generate(model, prompts, sampler="learned_filter", sampler_options={"filter": str(path)}, **kw)
    assert all(MASK not in r.generated_ids for r in out.rows)
    assert out.nfe == 3  # three grid blocks a row: row 0 [0,16) [16,32) [32,48), row 1 [16,32) [32,48) [48,64)
    one = dlm_decode.generate(model, prompts, sampler="llada2", sampler_options={"threshold": 0.0}, **kw)
    assert [r.generated_ids for r in out.rows] == [r.generated_ids for r in one.rows]
