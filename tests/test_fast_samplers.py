"""The fast samplers: token identity with Fast-dLLM's generate, each rule's boundaries on hand-built logits, EoTP
cuts, adaptive blocks, Prophet's all-in commit, bad hyperparameters and presets."""

from __future__ import annotations

import math

import pytest
import torch
from fake import ScriptedModel, peaked, step_filter, table_model
from reference_generate import fastdllm_generate

import dlm_decode
from dlm_decode.samplers import get_sampler
from dlm_decode.samplers.adaptive_block import delimiter_ids_from_tokenizer
from dlm_decode.samplers.entropy_threshold import entropy
from dlm_decode.samplers.factor import factor_counts
from dlm_decode.samplers.presets import PRESETS, get_preset

V, MASK, EOS = 16, 15, 1
PROMPTS = torch.tensor([[5, 9, 17, 3, 40, 22], [7, 7, 2, 33, 12, 4], [11, 30, 30, 8, 19, 60]])


def tied(token: int, k: int) -> torch.Tensor:
    """Logits whose float64 softmax is exactly 1/k on ``token`` (the first of k tied ids); the rest get 0."""
    out = torch.full((V,), -1e4)
    ids = [token] + list(range(token + 1, MASK))[: k - 1]  # token has the lowest id: argmax picks it
    out[ids] = 0.0
    return out


def slots(rows: list[torch.Tensor], prompt_len: int = 2):
    """A model returning the given logits rows for the generation slots, every step."""

    def fn(canvas, step):
        out = torch.zeros(canvas.shape[0], canvas.shape[1], V)
        for i, r in enumerate(rows):
            out[:, prompt_len + i] = r
        return out

    return ScriptedModel(fn, vocab=V, mask_id=MASK, eos_id=EOS)


def canvas_model(seed: int = 0):
    """A deterministic function of the canvas with a wide spread of confidences (for reference comparisons)."""
    g = torch.Generator().manual_seed(seed)
    pos, ctx, tok = torch.randn(64, V, generator=g), torch.randn(V, V, generator=g), torch.randn(V, V, generator=g)
    scale = 0.5 + 5 * torch.rand(64, 1, generator=g)

    def fn(canvas, step=0):
        t = canvas.shape[1]
        out = (pos[:t][None] + ctx[canvas].mean(1, keepdim=True) + 0.5 * tok[canvas]) * scale[:t][None]
        out[..., MASK] = -1e4  # the references would otherwise write MASK back
        return out

    return ScriptedModel(fn, vocab=V, mask_id=MASK, eos_id=EOS), fn


def _run(model, name, prompt=((3, 4),), **kw):
    kw.setdefault("trace", True)
    return dlm_decode.generate(model, [list(p) for p in prompt], sampler=name, **kw)


# --- Fast-dLLM: token identity and NFE --------------------------------------------------------------------------


def _shifted(model):
    return lambda ids: (lambda lg: torch.cat([lg[:, :1], lg[:, :-1]], 1))(model(ids).logits)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize(
    "gen,block,opts",
    [(16, 8, {"threshold": 0.9}), (24, 8, {"threshold": 0.3}), (16, 8, {"factor": 1.0}), (24, 24, {"factor": 3.0})],
)
def test_threshold_and_factor_match_fast_dllm(llada, dream, batch, gen, block, opts):
    name = "threshold" if "threshold" in opts else "factor"
    for model, ref_model in ((llada, lambda ids: llada(ids).logits), (dream, _shifted(dream))):
        ref, nfe = fastdllm_generate(ref_model, PROMPTS[:batch], gen, block, model.mask_token_id, **opts)
        out = dlm_decode.generate(model, PROMPTS[:batch], sampler=name, sampler_options=opts, gen_length=gen,
                                  block_length=block)  # fmt: skip
        assert torch.equal(out.sequences, ref), (model.config.model_type, opts)
        assert out.nfe == nfe


@pytest.mark.parametrize("opts", [{"threshold": 0.9}, {"threshold": 0.6}, {"factor": 1.0}, {"factor": 2.5}])
def test_threshold_and_factor_match_fast_dllm_on_spread_confidences(opts):
    model, fn = canvas_model()
    prompt = torch.tensor([[3, 4, 5], [6, 7, 8], [9, 10, 11]])
    name = "threshold" if "threshold" in opts else "factor"
    for gen, block in ((24, 8), (32, 32)):
        ref, nfe = fastdllm_generate(fn, prompt, gen, block, MASK, **opts)
        out = dlm_decode.generate(model, prompt, sampler=name, sampler_options=opts, gen_length=gen, block_length=block)
        assert torch.equal(out.sequences, ref) and out.nfe == nfe
        assert max(max(s) for s in out.tokens_per_step) > 1  # the rule really decoded in parallel


def test_threshold_boundary_is_inclusive():
    rows = [tied(4, 2), tied(5, 1), tied(6, 3), tied(7, 2)]  # confidences 0.5, 1, 1/3, 0.5
    out = _run(slots(rows), "threshold", sampler_options={"threshold": 0.5}, gen_length=4, block_length=4)
    assert out.trace[0].tolist() == [0, 0, 1, 0]  # top-1 plus both slots exactly at 0.5
    out = _run(slots(rows), "threshold", sampler_options={"threshold": math.nextafter(0.5, 1)}, gen_length=4)
    assert out.tokens_per_step[0] == [1] and out.trace[0, 1] == 0  # just above 0.5: only the top-1
    assert out.rows[0].generated_ids == [4, 5, 6, 7]


def test_factor_walk_and_reference_quirk():
    def counts(confs, f=1.0):
        c = torch.tensor([confs], dtype=torch.float64)
        return int(factor_counts(c, torch.ones_like(c, dtype=torch.bool), f)[0])

    # f = 1: thresholds by rank j = 1, 2, 3, 4: -1, 2/3, 3/4, 4/5
    assert counts([0.99, 0.9, 0.7, 0.5, 0.4]) == 2  # j = 3 fails: commit two
    assert counts([0.99, 0.6, 0.95, 0.9, 0.4]) == 3  # sorted .99 .95 .9 .6 .4: j = 4 fails (.6 < .8)
    assert counts([0.99, 0.95, 0.9, 0.6]) == 4  # first failure at the last rank: the quirk commits all
    assert counts([0.99, 0.95, 0.9, 0.85]) == 4  # no failure: all
    assert counts([0.3]) == 1 and counts([0.3, 0.2]) == 2  # one or two masks: always all (quirk)
    assert counts([0.5, 0.5, 0.1, 0.1]) == 1  # j = 2 fails: only the first
    t2 = 1.0 - 1.0 / 3.0  # the rank-2 threshold, computed as the reference does
    assert counts([1.0, t2, 0.1, 0.1]) == 2 and counts([1.0, math.nextafter(t2, 0), 0.1, 0.1]) == 1  # c < t fails
    assert counts([0.99, 0.9, 0.7, 0.5, 0.4], f=0.1) == 1  # f = 0.1: j = 2 needs .967, 0.9 fails
    assert counts([0.99, 0.9, 0.7, 0.5, 0.4], f=2.0) == 3  # f = 2: -1, 1/3, 1/2, 3/5, 2/3: j = 4 fails
    # through the loop: table model, block of 5
    out = _run(table_model([0.99, 0.9, 0.7, 0.5, 0.4]), "factor", gen_length=5, block_length=5)
    assert out.tokens_per_step[0] == [2]


def test_factor_rejects_bad_values():
    for f in (0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="factor must be"):
            get_sampler("factor", {"factor": f})


# --- LocalLeap ---------------------------------------------------------------------------------------------------


def test_local_leap_anchor_neighbourhood_and_radius_edges():
    # slot 3 is the anchor (conf 1); slots at distance 2 (the radius) and 3 have conf exactly 0.5
    rows = [tied(4, 4), tied(5, 2), tied(6, 3), tied(7, 1), tied(8, 4), tied(9, 2), tied(10, 2), tied(11, 4)]
    opts = {"kappa": 1.0, "tau_relaxed": 0.5, "radius": 2}
    out = _run(slots(rows), "local_leap", sampler_options=opts, gen_length=8, block_length=8)
    first = (out.trace[0] == 0).nonzero().flatten().tolist()
    assert first == [1, 3, 5]  # anchor, and the 0.5 slots at distance 2; slot 6 (distance 3) waits; 1/3, 1/4 wait
    # radius 3 reaches slot 6; radius 0 keeps only the anchor
    out = _run(slots(rows), "local_leap", sampler_options=opts | {"radius": 3}, gen_length=8, block_length=8)
    assert (out.trace[0] == 0).nonzero().flatten().tolist() == [1, 3, 5, 6]
    out = _run(slots(rows), "local_leap", sampler_options=opts | {"radius": 0}, gen_length=8, block_length=8)
    assert (out.trace[0] == 0).nonzero().flatten().tolist() == [3]
    # relaxed threshold just above 0.5: nothing but the anchor
    opts2 = opts | {"tau_relaxed": math.nextafter(0.5, 1)}
    out = _run(slots(rows), "local_leap", sampler_options=opts2, gen_length=8, block_length=8)
    assert (out.trace[0] == 0).nonzero().flatten().tolist() == [3]


def test_local_leap_without_anchor_is_plain_threshold(llada):
    a = _run(llada, "local_leap", prompt=PROMPTS.tolist(), gen_length=16, block_length=8)
    b = _run(llada, "threshold", prompt=PROMPTS.tolist(), gen_length=16, block_length=8)
    assert torch.equal(a.sequences, b.sequences)  # the tiny model never reaches kappa
    rows = [tied(4, 2), tied(5, 2), tied(6, 4)]  # 0.5, 0.5, 0.25 and no anchor at kappa 0.6
    out = _run(slots(rows), "local_leap", sampler_options={"kappa": 0.6, "tau_relaxed": 0.5}, gen_length=3)
    assert out.tokens_per_step[0] == [1]


@pytest.mark.parametrize(
    "opts,match",
    [
        ({"radius": -1}, "radius must be"),
        ({"kappa": 0.0}, "kappa must be in"),
        ({"kappa": 1.5}, "kappa must be in"),
        ({"tau_relaxed": 0.0}, "tau_relaxed must be in"),
        ({"kappa": 0.8, "tau_relaxed": 0.85}, "tau_relaxed .* must be <= kappa"),
    ],
)
def test_local_leap_rejects_bad_values(opts, match):
    with pytest.raises(ValueError, match=match):
        get_sampler("local_leap", opts)


# --- dParallel entropy threshold -----------------------------------------------------------------------------------


def test_entropy_threshold_boundary_and_lowest_entropy_first():
    rows = [tied(4, 3), tied(5, 2), tied(6, 4), tied(7, 2)]
    h2 = float(entropy(tied(5, 2)[None, None])[0, 0])  # about log 2
    out = _run(slots(rows), "entropy_threshold", sampler_options={"eta": h2}, gen_length=4, block_length=4)
    assert (out.trace[0] == 0).nonzero().flatten().tolist() == [1, 3]  # H <= eta commits (the code's comparison)
    out = _run(slots(rows), "entropy_threshold", sampler_options={"eta": math.nextafter(h2, 0)}, gen_length=4)
    assert out.tokens_per_step[0] == [1] and out.trace[0, 1] == 0  # just below: only the lowest-entropy slot
    assert out.rows[0].generated_ids == [4, 5, 6, 7]
    with pytest.raises(ValueError, match="eta must be"):
        get_sampler("entropy_threshold", {"eta": 0})


# --- Prophet early commit ------------------------------------------------------------------------------------------


def gap_model(gaps_by_step, watch=None, n=16, prompt_len=2):
    """Slot i predicts token 2 + i % 10; its top-1 / top-2 raw-logit gap is ``gaps_by_step(step)`` at watched slots
    (all slots if ``watch`` is None) and 0.1 elsewhere; confidences are low so the base rule goes one per step."""
    seen = []

    def fn(canvas, step):
        seen.append(canvas.clone())
        out = torch.zeros(canvas.shape[0], canvas.shape[1], V)
        for i in range(n):
            g = gaps_by_step(step) if watch is None or i in watch else 0.1
            out[:, prompt_len + i, 2 + i % 10] = g
        return out

    return ScriptedModel(fn, vocab=V, mask_id=MASK, eos_id=EOS), seen


def test_early_commit_gap_boundary_and_all_in_commit():
    model, _ = gap_model(lambda s: 7.5)
    out = _run(model, "early_commit", gen_length=16, block_length=8, steps=16)
    assert out.nfe == 1 and out.tokens_per_step == [[16]]  # every mask of the canvas, not just the block
    assert out.rows[0].generated_ids == [2 + i % 10 for i in range(16)]
    assert out.trace[0].tolist() == [0] * 16
    model, _ = gap_model(lambda s: 7.4999)  # just below in float32 logits
    out = _run(model, "early_commit", gen_length=16, block_length=8, steps=16)
    assert out.nfe > 1 and out.tokens_per_step[0] == [1]


def test_early_commit_phases_follow_progress():
    # budget 16: progress s/16 < 0.33 for s <= 5, < 0.67 for s <= 10, late from s = 11
    for gap, nfe in ((5.0, 6), (4.9999, 11), (2.5, 11), (2.4999, 16)):
        model, _ = gap_model(lambda s, g=gap: g)
        out = _run(model, "early_commit", gen_length=16, block_length=8, steps=16)
        assert out.nfe == nfe, gap
        assert sum(out.tokens_per_step[-1]) == 16 - (nfe - 1) or nfe == 16
    model, _ = gap_model(lambda s: 8.0)
    out = _run(model, "early_commit", sampler_options={"thresholds": (8.5, 8.0, 3.5)}, gen_length=16, steps=16)
    assert out.nfe == 6


def test_early_commit_answer_region_and_forced_prefix():
    watch = {12, 13, 14, 15}  # generation offsets 12..15 = answer region after a 2-token prefix at 10, 11
    model, seen = gap_model(lambda s: 9.0, watch=watch)
    opts = {"prefix_ids": (7, 8), "prefix_offset": 10, "answer_length": 4}
    out = _run(model, "early_commit", sampler_options=opts, gen_length=16, block_length=8, steps=16)
    assert seen[0][0, 12:14].tolist() == [7, 8]  # the forced words are context from the first forward on
    assert out.nfe == 1 and out.rows[0].generated_ids[10:12] == [7, 8]
    assert out.trace[0, 10:12].tolist() == [-1, -1]  # forced, never decoded
    # a confident region elsewhere does not trigger
    model, _ = gap_model(lambda s: 9.0, watch={0, 1, 2, 3, 4, 5, 6, 7})
    out = _run(model, "early_commit", sampler_options=opts, gen_length=16, block_length=8, steps=16)
    assert out.nfe > 1
    with pytest.raises(ValueError, match="answer region \\[14, 19\\) lies outside the generation window"):
        _run(model, "early_commit", sampler_options={"answer_offset": 14}, gen_length=16, steps=16)
    with pytest.raises(ValueError, match="forced prefix"):
        _run(model, "early_commit", sampler_options={"prefix_ids": (7, 8), "prefix_offset": 15, "answer_offset": 0},
             gen_length=16, steps=16)  # fmt: skip


def test_early_commit_without_exit_is_its_base(llada):
    for base, extra in (("low_confidence", {"steps": 16}), ("threshold", {})):
        a = _run(llada, "early_commit", PROMPTS.tolist(), sampler_options={"base": base}, gen_length=16, **extra)
        b = _run(llada, base, PROMPTS.tolist(), gen_length=16, **extra)
        assert torch.equal(a.sequences, b.sequences) and a.nfe == b.nfe


def test_early_commit_stacked_on_threshold_stops_rows_independently():
    model, _ = gap_model(lambda s: 3.0)  # fires only in the late phase
    out = _run(model, "early_commit", sampler_options={"base": "threshold"}, gen_length=16, block_length=8, steps=16)
    assert out.nfe == 11 and out.tokens_per_step[-1] == [6]
    with pytest.raises(ValueError, match="base must be one of"):
        get_sampler("early_commit", {"base": "random"})
    with pytest.raises(ValueError, match="thresholds must be three"):
        get_sampler("early_commit", {"thresholds": "7,5"})


# --- AdaBlock ------------------------------------------------------------------------------------------------------


def delim_model(delims: dict[int, float], n: int, prompt_len: int = 2, token: int = 9):
    """Slot i predicts 2 + i % 7 with decreasing confidence (one commit per step at threshold 0.9), except the
    slots in ``delims``, which predict the delimiter ``token`` with the given confidence."""

    def fn(canvas, step):
        out = torch.zeros(canvas.shape[0], canvas.shape[1], V)
        for i in range(n):
            tok, c = (token, delims[i]) if i in delims else (2 + i % 7, 0.6 - 0.004 * i)
            out[:, prompt_len + i] = peaked(tok, c)
        return out

    return ScriptedModel(fn, vocab=V, mask_id=MASK, eos_id=EOS)


def test_adaptive_block_ends_on_confident_delimiter():
    opts = {"delimiter_ids": (9,), "delimiter_threshold": 0.5}
    # gen 32, B0 8, window 8: delimiters at 3 (0.55) and 5 (0.7): the block ends on 5
    out = _run(
        delim_model({3: 0.55, 5: 0.7}, 32), "adaptive_block", sampler_options=opts, gen_length=32, block_length=8
    )
    sizes = [s[0] for s in out.scratch["adaptive_block"]]
    assert sizes[0] == 6 and sum(sizes) == 32
    tr = out.trace[0]
    assert tr[:6].max() < tr[6:].min()  # the first block is slots 0..5
    # below the threshold (0.45 < 0.5): the default block of B0 = 8
    out = _run(delim_model({5: 0.45}, 32), "adaptive_block", sampler_options=opts, gen_length=32, block_length=8)
    assert [s[0] for s in out.scratch["adaptive_block"]] == [8, 8, 8, 8]
    # beyond the window (slot 8 >= 0.25 * 32 after the start): ignored; a delimiter of the next window counts
    out = _run(delim_model({9: 0.9}, 32), "adaptive_block", sampler_options=opts, gen_length=32, block_length=8)
    assert [s[0] for s in out.scratch["adaptive_block"]][:2] == [8, 2]


def test_adaptive_block_window_can_exceed_the_default_block():
    opts = {"delimiter_ids": (9,), "delimiter_threshold": 0.5}
    out = _run(delim_model({13: 0.8}, 64), "adaptive_block", sampler_options=opts, gen_length=64, block_length=8)
    sizes = [s[0] for s in out.scratch["adaptive_block"]]
    assert sizes[0] == 14 and sum(sizes) == 64  # window 16 > B0 8
    assert out.trace[0, :14].max() < out.trace[0, 14:].min()


def test_adaptive_block_with_infinite_threshold_is_threshold(llada, dream):
    for model in (llada, dream):
        a = _run(model, "adaptive_block", PROMPTS.tolist(), sampler_options={"delimiter_threshold": "inf"},
                 gen_length=16, block_length=8)  # fmt: skip
        b = _run(model, "threshold", PROMPTS.tolist(), gen_length=16, block_length=8)
        assert torch.equal(a.sequences, b.sequences) and a.nfe == b.nfe


def test_adaptive_block_rows_keep_their_own_blocks():
    def fn(canvas, step):
        out = torch.zeros(canvas.shape[0], canvas.shape[1], V)
        for b, d in enumerate((3, 6)):  # row 0 ends its first block on slot 3, row 1 on slot 6
            for i in range(32):
                out[b, 2 + i] = peaked(9, 0.8) if i == d else peaked(2 + i % 7, 0.6 - 0.01 * i)
        return out

    opts = {"delimiter_ids": (9,), "delimiter_threshold": 0.5}
    model = ScriptedModel(fn, vocab=V, mask_id=MASK, eos_id=EOS)
    out = _run(model, "adaptive_block", prompt=((3, 4), (3, 4)), sampler_options=opts, gen_length=32, block_length=4)
    sizes = out.scratch["adaptive_block"]
    assert sizes[0] == [4, 7]  # window 8
    assert sum(s[0] for s in sizes if s[0] > 0) == 32 and sum(s[1] for s in sizes if s[1] > 0) == 32
    assert out.trace[0, :4].max() < out.trace[0, 4:].min() and out.trace[1, :7].max() < out.trace[1, 7:].min()


def test_variable_blocks_keep_rows_independent_and_caches_exact(llada):
    # many delimiters and a low threshold: every row gets its own sequence of block sizes
    opts = {"delimiter_ids": tuple(range(0, 64, 3)), "delimiter_threshold": 0.02}
    prompts = [[5, 9, 17, 3, 40, 22], [7, 2, 33], [11, 30, 30, 8, 19]]
    batch = _run(llada, "adaptive_block", prompts, sampler_options=opts, gen_length=24, block_length=8)
    sizes = batch.scratch["adaptive_block"]
    assert len({tuple(s) for s in sizes}) > 1 and any(len(set(s) - {-1}) > 1 for s in sizes)
    for i, p in enumerate(prompts):
        alone = _run(llada, "adaptive_block", [p], sampler_options=opts, gen_length=24, block_length=8)
        assert alone.rows[0].generated_ids == batch.rows[i].generated_ids
        assert [s[0] for s in alone.scratch["adaptive_block"]] == [s[i] for s in sizes if s[i] > 0]
    for cache in ("prefix", "dual"):
        out = _run(llada, "adaptive_block", prompts, sampler_options=opts, gen_length=24, block_length=8, cache=cache,
                   cache_options={"refresh_interval": 1})  # fmt: skip
        assert torch.equal(out.sequences, batch.sequences), cache


def test_delimiter_ids_from_tokenizer():
    class Tok:
        def get_vocab(self):
            return {"a": 0, "\n": 1, "b\n\n": 2, "c": 3, "\r": 4}

        def decode(self, ids):
            return {v: k for k, v in self.get_vocab().items()}[ids[0]]

    assert delimiter_ids_from_tokenizer(Tok()) == (1, 2)
    with pytest.raises(ValueError, match="window_fraction"):
        get_sampler("adaptive_block", {"window_fraction": 0})
    with pytest.raises(ValueError, match="threshold must be in"):
        get_sampler("adaptive_block", {"threshold": 1.2})


# --- Learn2PD filter and EoTP --------------------------------------------------------------------------------------


def test_learned_filter_commits_accepted_plus_scheduled(tmp_path):
    path = step_filter(tmp_path / "f", 4)
    model = table_model([0.3, 0.9, 0.2, 0.6])
    out = _run(model, "learned_filter", sampler_options={"filter": path}, gen_length=4, block_length=4, steps=4)
    # step 0: filter accepts 0.9 and 0.6 (the top-1 is among them); then one per step by confidence
    assert out.tokens_per_step == [[2], [1], [1]]
    assert out.trace[0].tolist() == [1, 0, 2, 0]
    # without a filter: the plain low-confidence schedule
    plain = _run(model, "learned_filter", gen_length=4, block_length=4, steps=4)
    low = _run(model, "low_confidence", gen_length=4, block_length=4, steps=4)
    assert plain.tokens_per_step == [[1]] * 4 and torch.equal(plain.trace, low.trace)


def test_learned_filter_refuses_other_block_length(tmp_path):
    path = step_filter(tmp_path / "f", 8)
    with pytest.raises(ValueError, match="trained for block length 8, but decoding uses block length 4"):
        _run(table_model([0.5] * 8), "learned_filter", sampler_options={"filter": path}, gen_length=8, block_length=4)
    with pytest.raises(ValueError, match="learned filter not found"):
        _run(table_model([0.5] * 8), "learned_filter", sampler_options={"filter": str(tmp_path / "nope")}, gen_length=8)
    with pytest.raises(ValueError, match="accept must be"):
        get_sampler("learned_filter", {"accept": 1.0})


def test_eotp_cuts_after_filter_accepted_eos(tmp_path):
    path = step_filter(tmp_path / "f", 4)
    # slot 1 predicts EOS confidently (the filter accepts it); slot 3 is the step's other accepted slot
    model = table_model([0.3, 0.9, 0.2, 0.8, 0.4, 0.4, 0.4, 0.4], tokens=[5, EOS, 6, 7, 8, 8, 8, 8])
    out = _run(model, "learned_filter", sampler_options={"filter": path, "eotp": True}, gen_length=8, block_length=4,
               steps=8)  # fmt: skip
    assert out.rows[0].generated_ids == [5, EOS] + [EOS] * 6  # slot 3 was committed, then cut away
    assert out.trace[0].tolist() == [1, 0, -1, -1, -1, -1, -1, -1]
    assert out.nfe == 2


def test_eotp_cuts_after_most_confident_masked_eos():
    # no filter; masked EOS predictions at slot 2 (0.3) and slot 6 (0.5, a later block): cut after slot 6
    model = table_model([0.9, 0.2, 0.3, 0.2, 0.2, 0.2, 0.5, 0.2], tokens=[5, 6, EOS, 7, 8, 9, EOS, 10])
    out = _run(model, "learned_filter", sampler_options={"eotp": True}, gen_length=8, block_length=4, steps=8)
    assert out.rows[0].generated_ids == [5, 6, EOS, 7, 8, 9, EOS, EOS]
    assert out.trace[0, 7] == -1 and out.trace[0, 6] >= 0  # slot 6 stays and is decoded later
    off = _run(model, "learned_filter", gen_length=8, block_length=4, steps=8)
    assert off.rows[0].generated_ids == [5, 6, EOS, 7, 8, 9, EOS, 10] and off.nfe == 8 and out.nfe == 7


# --- presets and bad values ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,opts,match",
    [
        ("threshold", {"threshold": 0.0}, "threshold must be in \\(0, 1\\]"),
        ("threshold", {"threshold": 1.5}, "threshold must be in"),
        ("threshold", {"threshold": "nan"}, "threshold must be in"),
        ("factor", {"factor": "0"}, "factor must be"),
        ("entropy_threshold", {"eta": "-1"}, "eta must be"),
        ("early_commit", {"phases": "0.7,0.3"}, "phases must be"),
        ("early_commit", {"answer_length": 0}, "answer_length"),
    ],
)
def test_bad_hyperparameters_fail_loudly(name, opts, match):
    with pytest.raises(ValueError, match=match):
        get_sampler(name, opts)


def test_presets_resolve(llada):
    from dlm_decode.core.config import DecodeConfig

    for p in PRESETS.values():
        smp = get_sampler(p.sampler, p.options)
        assert DecodeConfig(**p.config).gen_length >= 1 and smp.name == p.sampler
    with pytest.raises(ValueError, match="valid presets: .*fast_dllm_threshold.*prophet_gsm8k"):
        get_preset("fastest")
    kw = get_preset("prophet_gsm8k").generate_kwargs(gen_length=16, block_length=8, steps=16)
    assert kw["sampler_options"]["thresholds"] == (8.0, 5.0, 3.5)
    out = dlm_decode.generate(llada, PROMPTS[:1], **kw)
    assert out.nfe <= 16 and out.sampler["thresholds"] == [8.0, 5.0, 3.5]
    assert get_preset("adablock_dream").options["delimiter_threshold"] == 0.5


@pytest.mark.parametrize(
    "name,opts,kw",
    [("learned_filter", {"eotp": True}, {"steps": 32}), ("early_commit", {"thresholds": (0.6, 0.6, 0.6)}, {})],
)
def test_cuts_and_early_stops_keep_rows_independent(llada, name, opts, kw):
    prompts = [[5, 9, 17, 3, 40, 22], [7, 2, 33], [11, 30, 30, 8, 19]]
    batch = _run(llada, name, prompts, sampler_options=opts, gen_length=32, block_length=8, **kw)
    assert len({r.nfe for r in batch.rows}) > 1  # rows really stop at different steps
    for i, p in enumerate(prompts):
        alone = _run(llada, name, [p], sampler_options=opts, gen_length=32, block_length=8, **kw)
        assert alone.rows[0].generated_ids == batch.rows[i].generated_ids and alone.rows[0].nfe == batch.rows[i].nfe
