"""Sampler invariants, run automatically for every registered sampler, and hand-built logits for each baseline rule."""

from __future__ import annotations

import pytest
import torch
from fake import table_model

import dlm_decode
from dlm_decode.samplers import SAMPLERS, get_sampler

PROMPTS = [[5, 9, 17, 3, 40, 22], [7, 2, 33], [11, 30, 30, 8, 19]]
# samplers whose reference may commit nothing in a step: the Dream orderings (a schedule count of 0 at low mask
# ratios) and lossless (a row that finished its block waits for the others); every other one commits >= 1 a step
# token_editing: a post step (no MASK left) that edits nothing ends the block
MAY_SKIP_A_STEP = {"origin", "maskgit_plus", "topk_margin", "entropy", "lossless", "token_editing"}
GREEDY_ONLY = {"lossless"}  # refuses temperature > 0: its promise (the static rule's output) holds only at 0


def _run(model, name, prompts=PROMPTS, **kw):
    kw.setdefault("gen_length", 16)
    kw.setdefault("block_length", 8 if get_sampler(name).traits.blockwise else None)
    return dlm_decode.generate(model, prompts, sampler=name, trace=True, **kw)


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_invariants(tiny_model, name):
    out = _run(tiny_model, name)
    p = out.sequences.shape[1] - 16
    mask = tiny_model.mask_token_id
    # prompts untouched (left padded), nothing left masked, a real token everywhere
    for i, pr in enumerate(PROMPTS):
        assert out.sequences[i, p - len(pr) : p].tolist() == pr
    assert not (out.sequences[:, p:] == mask).any()
    # commits only inside the current block: with block 8, steps that decode slot j of block k come in order
    trace = out.trace
    assert (trace >= 0).all()
    if get_sampler(name).traits.blockwise:
        assert (trace[:, :8].max(1).values < trace[:, 8:].min(1).values).all()
    # at least one commit per unfinished row per step (where the reference promises it), and a bounded loop
    per_step = torch.tensor(out.tokens_per_step)  # [steps, B]
    smp = get_sampler(name)
    if smp.traits.edits:  # token editing rewrites decoded slots too, and iterates past a block's last MASK
        assert (per_step.sum(0) >= 16).all()
        assert out.nfe <= 16 + 2 * (smp.max_post_steps + 1)
    else:
        assert per_step.sum(0).tolist() == [16] * len(PROMPTS)
    if name not in MAY_SKIP_A_STEP:
        rows_left = torch.tensor([[int((trace[b] >= s).any()) for b in range(3)] for s in range(out.nfe)])
        assert ((per_step > 0) | (rows_left == 0)).all()
    assert out.nfe <= 16 or smp.traits.edits
    # temperature 0 ignores the seed; same seed gives the same output at temperature > 0
    if name not in ("random", "origin"):
        assert torch.equal(out.sequences, _run(tiny_model, name, seed=99).sequences)
    if name in GREEDY_ONLY:  # refuses temperature > 0 before any work (tests/test_lossless.py)
        with pytest.raises(ValueError, match=f"{name}: temperature must be 0"):
            _run(tiny_model, name, temperature=0.8, seed=3)
        return
    a = _run(tiny_model, name, temperature=0.8, seed=3)
    b = _run(tiny_model, name, temperature=0.8, seed=3)
    assert torch.equal(a.sequences, b.sequences)


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_padded_rows_decode_as_alone(tiny_model, name):
    batch = _run(tiny_model, name, temperature=0.0)
    for i, pr in enumerate(PROMPTS):
        alone = _run(tiny_model, name, prompts=[pr])
        if name in ("random", "origin"):
            continue  # random draws depend on the batch shape; covered by the seed test
        assert alone.rows[0].generated_ids == batch.rows[i].generated_ids, (name, i)


def test_low_confidence_commits_scheduled_count_highest_first():
    confs = [0.5, 0.9, 0.3, 0.95, 0.6, 0.7, 0.2, 0.8]
    model = table_model(confs)
    out = dlm_decode.generate(
        model, [[3, 4]], sampler="low_confidence", gen_length=8, block_length=8, steps=3, trace=True
    )
    # 8 masks over 3 steps: 3, 3, 2 tokens; by descending confidence
    assert out.tokens_per_step == [[3], [3], [2]]
    assert out.trace[0].tolist() == [1, 0, 2, 0, 1, 1, 2, 0]


def test_random_remasking_uses_schedule_and_seed():
    model = table_model([0.5] * 8)
    a = dlm_decode.generate(
        model, [[3, 4]], sampler="random", gen_length=8, block_length=8, steps=4, seed=1, trace=True
    )
    b = dlm_decode.generate(
        model, [[3, 4]], sampler="random", gen_length=8, block_length=8, steps=4, seed=2, trace=True
    )
    assert a.tokens_per_step == [[2]] * 4
    assert not torch.equal(a.trace, b.trace)


def test_dream_schedule_counts_follow_linear_timesteps():
    model = table_model([0.9 - 0.05 * i for i in range(8)])
    out = dlm_decode.generate(model, [[3, 4]], sampler="maskgit_plus", gen_length=8, steps=4, trace=True)
    t = torch.linspace(1, 1e-3, 5)
    left, expect = 8, []
    for i in range(4):
        k = int(torch.tensor(float(left)) * (1 - t[i + 1] / t[i])) if i < 3 else left
        expect.append(k)
        left -= k
    assert [s[0] for s in out.tokens_per_step] == expect
    # highest probability first: slot order follows the confidences
    order = out.trace[0].tolist()
    assert order == sorted(order)


def test_topk_margin_and_entropy_order_by_their_scores():
    # slot 0: top-1 0.6 but flat rest; slot 1: top-1 0.5 with a strong runner-up
    def fn(canvas, step):
        out = torch.full((canvas.shape[0], canvas.shape[1], 16), -20.0)
        out[:, 2, 2], out[:, 2, 3:14] = 0.6, 0.0
        out[:, 3, 4], out[:, 3, 5] = 2.0, 1.9
        return out

    from fake import ScriptedModel

    for name, first in (("topk_margin", 0), ("entropy", 1), ("maskgit_plus", 1)):
        out = dlm_decode.generate(ScriptedModel(fn), [[3, 4]], sampler=name, gen_length=4, steps=2, trace=True)
        assert out.trace[0].tolist().index(0) == first, name


def test_unknown_sampler_and_bad_options_fail_loudly():
    with pytest.raises(ValueError, match="valid samplers: .*low_confidence"):
        get_sampler("fastest")
    with pytest.raises(ValueError, match="has no option.*valid options"):
        get_sampler("maskgit_plus", {"alg_tmp": "0.1"})
    with pytest.raises(ValueError, match="expects a number"):
        get_sampler("maskgit_plus", {"alg_temp": "hot"})
    with pytest.raises(ValueError, match="alg_temp must be >= 0"):
        get_sampler("entropy", {"alg_temp": "-1"})


def test_capabilities_are_one_frozen_traits_dataclass():
    """A sampler's capabilities are one ``SamplerTraits`` (frozen, read-only option defaults); no loose class flags."""
    import dataclasses

    from dlm_decode.samplers import SamplerTraits
    from dlm_decode.samplers.base import Sampler

    flags = {"blockwise", "fixed_budget", "follows_model_defaults", "option_defaults", "reads_candidates_only", "edits"}
    assert {f.name for f in dataclasses.fields(SamplerTraits)} == flags
    loose = flags | {"commits_every_step", "greedy_only"}
    for name in SAMPLERS:
        smp = get_sampler(name)
        assert isinstance(smp.traits, SamplerTraits), name
        assert not loose & set(vars(type(smp))) and not loose & set(vars(Sampler)), name
    traits = get_sampler("origin").traits
    assert not traits.blockwise and traits.fixed_budget and traits.follows_model_defaults
    assert dict(traits.option_defaults) == {"eps": 1e-3}
    with pytest.raises(dataclasses.FrozenInstanceError):
        traits.blockwise = True
    with pytest.raises(TypeError):
        traits.option_defaults["eps"] = 0.5
    # per instance where the options decide: lossless follows its rule, early_commit its base rule's budget
    assert get_sampler("lossless", {"rule": "entropy"}).traits.follows_model_defaults
    assert get_sampler("lossless").traits == SamplerTraits(fixed_budget=True)
    assert not get_sampler("early_commit", {"base": "threshold"}).traits.fixed_budget
    assert get_sampler("early_commit").traits.fixed_budget
