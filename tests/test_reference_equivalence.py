"""Token identity with the official generate functions (temperature 0, fp32), batch of one and equal lengths."""

from __future__ import annotations

import pytest
import torch
from reference_generate import dream_sample, llada_generate

import dlm_decode

PROMPTS = torch.tensor([[5, 9, 17, 3, 40, 22], [7, 7, 2, 33, 12, 4], [11, 30, 30, 8, 19, 60]])


def _raw(model):
    return lambda ids: model(ids).logits


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("gen,block,steps", [(16, 16, 16), (16, 8, 8), (24, 8, 12), (32, 8, 32), (16, 4, 8)])
@pytest.mark.parametrize("remasking", ["low_confidence"])
def test_llada_low_confidence_matches_reference(llada, batch, gen, block, steps, remasking):
    prompt = PROMPTS[:batch]
    ref = llada_generate(_raw(llada), prompt, steps, gen, block, llada.mask_token_id, remasking)
    out = dlm_decode.generate(llada, prompt, sampler=remasking, gen_length=gen, block_length=block, steps=steps)
    assert torch.equal(out.sequences, ref)
    assert out.nfe == steps


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("alg", ["maskgit_plus", "topk_margin", "entropy"])
@pytest.mark.parametrize("gen,steps", [(16, 16), (16, 5), (24, 8)])
def test_dream_orderings_match_reference(dream, batch, alg, gen, steps):
    prompt = PROMPTS[:batch]
    ref = dream_sample(_raw(dream), prompt, gen, steps, dream.mask_token_id, alg=alg)
    out = dlm_decode.generate(dream, prompt, sampler=alg, gen_length=gen, steps=steps)
    assert torch.equal(out.sequences, ref)
    assert out.nfe == steps


def test_dream_orderings_also_run_on_llada_and_vice_versa(llada, dream):
    a = dlm_decode.generate(llada, PROMPTS[:1], sampler="maskgit_plus", gen_length=8, steps=8)
    b = dlm_decode.generate(dream, PROMPTS[:1], sampler="low_confidence", gen_length=8, steps=8)
    for out in (a, b):
        assert not (out.sequences == 63).any()
