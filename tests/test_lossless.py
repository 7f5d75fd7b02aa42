"""``lossless`` (FreeDave draft-and-verify): token identity with the static rule it follows, in fewer (never more)
sequential forwards; caches it keeps exact and those it refuses; what it refuses before any work."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import SHARED_DATA, load_script

import dlm_decode
from dlm_decode.parallelbench.runner import load_tasks, run_task

PROMPTS = [[5, 9, 17, 3, 40, 22, 8], [7, 2, 33], [11, 30, 30, 8, 19, 4, 4, 12, 6, 1]]  # mixed lengths
DREAM_RULES = ("maskgit_plus", "topk_margin", "entropy")


def _pair(model, rule, prompts, drafts, **kw):
    """(static rule's output, lossless output) under the same decoding options."""
    static = dlm_decode.generate(model, prompts, sampler=rule, **kw)
    fast = dlm_decode.generate(
        model, prompts, sampler="lossless", sampler_options={"drafts": drafts, "rule": rule}, **kw
    )
    return static, fast


def _assert_lossless(static, fast, drafts):
    assert torch.equal(fast.sequences, static.sequences)
    assert fast.nfe <= static.nfe
    for s, f in zip(static.rows, fast.rows, strict=True):
        assert f.nfe <= s.nfe
        assert f.accepted_steps == s.accepted_steps == s.nfe  # the same static steps, taken in fewer forwards
        assert f.accepted_steps >= f.nfe  # every call accepts at least one step
    assert fast.accepted_steps_per_call >= 1.0
    assert fast.accepted_steps_per_call <= drafts
    if drafts == 1:
        assert fast.nfe == static.nfe and fast.token_forwards == static.token_forwards


@pytest.mark.parametrize("drafts", [1, 2, 3, 5])
@pytest.mark.parametrize("block_length", [4, 8, 16])
def test_llada_identity(llada, drafts, block_length):
    if drafts > block_length:  # more static steps than a block has (gen 16, steps 16): refused, naming the bound
        with pytest.raises(
            ValueError, match=rf"drafts \({drafts}\) must be <= the steps of one block \({block_length}\)"
        ):
            _pair(llada, "low_confidence", PROMPTS, drafts, gen_length=16, block_length=block_length)
        return
    for prompts in (PROMPTS, PROMPTS[:1], PROMPTS[1:2]):
        static, fast = _pair(llada, "low_confidence", prompts, drafts, gen_length=16, block_length=block_length)
        _assert_lossless(static, fast, drafts)


@pytest.mark.parametrize("drafts", [1, 2, 4, 7])
@pytest.mark.parametrize("rule", DREAM_RULES)
def test_dream_identity(dream, rule, drafts):
    for prompts in (PROMPTS, PROMPTS[2:]):
        for block_length in (None, 8):  # Dream's one block, and its schedule per block
            static, fast = _pair(dream, rule, prompts, drafts, gen_length=16, block_length=block_length)
            _assert_lossless(static, fast, drafts)


def test_mixed_batch_rows_decode_as_alone(tiny_model):
    rule = "low_confidence" if tiny_model.config.model_type == "llada" else "maskgit_plus"
    opts = {"drafts": 4, "rule": rule}
    batch = dlm_decode.generate(tiny_model, PROMPTS, sampler="lossless", sampler_options=opts, gen_length=16)
    for i, p in enumerate(PROMPTS):
        alone = dlm_decode.generate(tiny_model, [p], sampler="lossless", sampler_options=opts, gen_length=16)
        assert alone.rows[0].generated_ids == batch.rows[i].generated_ids


@pytest.mark.parametrize(
    "kw",
    [
        dict(steps=8),  # two tokens per step: drafts are verified as sets
        dict(stop_at_eos=True),
        dict(cfg_scale=1.5),
        dict(top_k=3),
    ],
)
def test_llada_identity_with_options(llada, kw):
    static, fast = _pair(llada, "low_confidence", PROMPTS, 4, gen_length=16, block_length=8, **kw)
    _assert_lossless(static, fast, 4)


def test_stop_at_eos_identity_when_eos_is_likely(llada, monkeypatch):
    """A model that favours EOS: the static decode stops early; a run of accepted drafts must stop there too."""
    eos = llada.eos_token_ids[0]
    head = llada.output_logits

    def biased(hidden):
        out = head(hidden)
        out[..., eos] += 3.0
        return out

    monkeypatch.setattr(llada, "output_logits", biased)
    for drafts in (2, 4, 8):
        static, fast = _pair(llada, "low_confidence", PROMPTS, drafts, gen_length=16, block_length=8, stop_at_eos=True)
        assert (static.generated == eos).any()
        _assert_lossless(static, fast, drafts)


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_prefix_and_dual_match_the_same_cache(tiny_model, cache):
    """With ``prefix`` / ``dual`` the output is that cache's own one-token-per-step output."""
    rule = "low_confidence" if tiny_model.config.model_type == "llada" else "entropy"
    for drafts in (2, 4):
        static, fast = _pair(tiny_model, rule, PROMPTS, drafts, gen_length=16, block_length=8, cache=cache)
        _assert_lossless(static, fast, drafts)
        assert fast.refreshes == static.refreshes  # a full forward at each block start, as the static run


def test_cfg_with_dual_cache(llada):
    static, fast = _pair(
        llada, "low_confidence", PROMPTS, 3, gen_length=16, block_length=8, cache="dual", cfg_scale=1.0
    )
    _assert_lossless(static, fast, 3)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(temperature=0.7), "lossless: temperature must be 0"),
        (dict(cache="window"), "cache 'window' cannot be lossless"),
        (dict(cache="dkv_decode"), "cache 'dkv_decode' cannot be lossless"),
        (dict(cache="dual", cache_options={"refresh_interval": 2}), "'dual' with refresh_interval cannot be lossless"),
        (dict(sampler_options={"drafts": 0}), "drafts must be an integer >= 1"),
        (dict(sampler_options={"rule": "threshold"}), "rule must be one of low_confidence, maskgit_plus"),
        (dict(sampler_options={"rule": "maskgit_plus", "alg_temp": 0.5}), "alg_temp must be unset or 0"),
        (dict(steps=5), "multiple of the number of blocks"),
    ],
)
def test_refused_before_work(llada, kwargs, match):
    calls = []
    handle = llada.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(ValueError, match=match):
            dlm_decode.generate(llada, [[5, 6, 7]], sampler="lossless", gen_length=16, block_length=8, **kwargs)
    finally:
        handle.remove()
    assert not calls


def test_statistics(llada):
    static, fast = _pair(llada, "low_confidence", PROMPTS, 4, gen_length=16, block_length=8)
    js = fast.to_json()
    assert js["sequential_forwards"] == fast.nfe == len(fast.tokens_per_step)
    assert js["accepted_steps_per_call"] == pytest.approx(fast.accepted_steps_per_call)
    assert [r["accepted_steps"] for r in js["rows"]] == [16, 16, 16]
    assert static.accepted_steps_per_call == 1.0
    # token-forwards count every canvas of every verification forward: at least the static run's per forward
    assert fast.token_forwards >= fast.nfe * static.token_forwards // static.nfe


# ---------------------------------------------------------------------------------------------- the demo models

needs_data = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="official ParallelBench data not present")
DEMO_TASKS = ["waiting_line/copy", "waiting_line/reverse", "puzzle/latin_square_n4"]


@pytest.fixture(scope="module")
def demo_tasks():
    return load_tasks(SHARED_DATA, DEMO_TASKS, limit=2)


@needs_data
@pytest.mark.parametrize("name,rule", [("demo-llada", "low_confidence"), ("demo-dream", "maskgit_plus")])
def test_demo_models_on_parallelbench(name, rule, demo_tasks):
    model, tok = dlm_decode.load_model(name)
    for task in demo_tasks:
        chats = [task.messages(i) for i in range(len(task))]
        gen = 32 if task.name.startswith("waiting_line") else 64
        kw = dict(tokenizer=tok, chat=True, gen_length=gen, block_length=32 if rule == "low_confidence" else None)
        static, fast = _pair(model, rule, chats, 4, **kw)
        _assert_lossless(static, fast, 4)
        assert fast.nfe < static.nfe  # a trained model's drafts are accepted often
        if task.name.startswith("waiting_line"):
            assert fast.accepted_steps_per_call > 1.5


@needs_data
def test_runner_reports_lossless_statistics(demo_tasks):
    model, tok = dlm_decode.load_model("demo-llada")
    task = demo_tasks[0]
    res = run_task(model, tok, task, {"sampler": "lossless", "block_length": 32}, batch_size=2)
    ref = run_task(model, tok, task, {"sampler": "low_confidence", "block_length": 32}, batch_size=2)
    assert [o["text"] for o in res.outputs] == [o["text"] for o in ref.outputs]
    assert res.nfe < ref.nfe
    assert res.accepted_steps_per_call > 1.0 and ref.accepted_steps_per_call == 1.0
    assert res.token_forwards > ref.token_forwards / 2
    row = res.to_json()
    assert {"token_forwards", "accepted_steps_per_call"} <= set(row)


def test_sweep_table_shows_steps_per_call_and_slots_per_forward():
    from dlm_decode.parallelbench.sweep import format_sweep

    def row(cid, label, method, nfe, tf, calls):
        return {
            "config_id": cid,
            "label": label,
            "method": method,
            "config": {"sampler": method},
            "task": "t",
            "score": 80.0,
            "score_strict": 80.0,
            "tokens_per_step": 32 / nfe,
            "nfe_ratio": None,
            "token_forwards": tf,
            "accepted_steps_per_call": calls,
            "n": 2,
            "gen_length": 32,
            "seconds": 1.0,
        }

    static = row("c1", "static", "low_confidence", 32, 32 * 32, 1.0)  # 32 forwards of a 32-slot block
    lossless = row("c2", "lossless d=4", "lossless", 8, 8 * 32 * 5, 4.0)  # 8 forwards of 5 x 32 slots
    lines = format_sweep([static, lossless]).splitlines()
    assert lines[0].split()[-2:] == ["steps/call", "slots/fwd"]
    cells = {ln.split()[0]: ln.split() for ln in lines[2:4]}
    assert cells["static"][-2:] == ["1.00", "32.0"] and cells["lossless"][-2:] == ["4.00", "160.0"]
    # without a draft-and-verify config the table keeps its usual columns
    assert "steps/call" not in format_sweep([static]).splitlines()[0]


@needs_data
def test_bench_lossless_with_a_cache_stays_exact_against_the_same_cache(capsys):
    bench = load_script("benchmarks/bench_lossless.py")
    argv = ["--models", "demo-llada", "--tasks", "waiting_line/reverse", "--limit", "2", "--drafts", "3"]
    assert bench.main([*argv, "--cache", "prefix", "--repeats", "1", "--warmup", "0", "--data", str(SHARED_DATA)]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["cache"] == "prefix"
    rows = {r["config"]: r for r in out["results"]}
    static, fast = rows["low_confidence (static)"], rows["lossless d=3"]
    assert static["cache"] == fast["cache"] == "prefix"
    assert fast["same_as_static"] == 1.0 and fast["forwards_vs_static"] > 1.5
    assert fast["token_forwards"] > static["token_forwards"]  # the drafts cost compute


def test_draft_ranking_breaks_ties_as_the_rules_successive_picks():
    """Exactly tied scores (a sure model's fp32 confidences of 1.0): the hint's ranking puts in step j the slots that
    the rule's own ``top_k_per_row`` picks from the scores left after steps 1 .. j - 1, step by step."""
    from dlm_decode.samplers.base import top_k_per_row
    from dlm_decode.samplers.lossless import Lossless

    gen = torch.Generator().manual_seed(3)
    for _ in range(20):
        score = torch.randint(0, 3, (3, 24), generator=gen).float() / 2  # values 0, 0.5, 1: ties everywhere
        cand = torch.rand(3, 24, generator=gen) < 0.8
        counts = torch.tensor([[1, 1, 1, 1], [2, 1, 2, 1], [1, 3, 1, 1]])  # slots per drafted step
        bound = torch.cat([torch.zeros(3, 1, dtype=torch.long), counts.cumsum(1)], 1)
        bound = torch.minimum(bound, cand.sum(1, keepdim=True))
        rank = Lossless._ranking(score, cand, bound)
        left = torch.where(cand, score, float("-inf"))
        for j in range(1, bound.shape[1]):
            picked = top_k_per_row(left, bound[:, j] - bound[:, j - 1])
            in_step = (rank >= bound[:, j - 1, None]) & (rank < bound[:, j, None])
            assert torch.equal(in_step, picked)
            left = left.masked_fill(picked, float("-inf"))
        assert (rank[~cand] == 24).all()  # slots off the canvas's masks are never drafted


@needs_data
def test_demo_dream_drafts_follow_its_tied_confidences(demo_tasks):
    """demo-dream is sure of most copy tokens (confidence exactly 1.0 in fp32); drafts ranked by the rule's own
    step-by-step tie order are accepted for more than two static steps per forward (1.8 with one ``topk``)."""
    model, tok = dlm_decode.load_model("demo-dream")
    task = next(t for t in demo_tasks if t.name == "waiting_line/copy")
    chats = [task.messages(i) for i in range(len(task))]
    static, fast = _pair(model, "maskgit_plus", chats, 4, tokenizer=tok, chat=True, gen_length=32)
    _assert_lossless(static, fast, 4)
    assert fast.accepted_steps_per_call > 2.0
