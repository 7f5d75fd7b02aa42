"""Token identity with the official generate functions (temperature 0, fp32), batch of one and equal lengths.

Dream's ``diffusion_generate`` samples with the checkpoint's effective defaults (config.json over transformers 4.x:
top-k 50 unless config.json says otherwise); the re-statement models that merge and our default decode follows it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

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
def test_dream_orderings_match_reference(dream, dream_dir, batch, alg, gen, steps):
    prompt = PROMPTS[:batch]
    config = json.loads((dream_dir / "config.json").read_text())
    ref = dream_sample(_raw(dream), prompt, gen, steps, dream.mask_token_id, alg=alg, config=config, temperature=0.0)
    out = dlm_decode.generate(dream, prompt, sampler=alg, gen_length=gen, steps=steps)
    assert torch.equal(out.sequences, ref)
    assert out.nfe == steps


# prompts and schedules where the top-k 50 filter changes the order slots are committed in on the tiny checkpoint
# (vocabulary 64; found by a search over random prompts: topk_margin never changed there)
FILTER_MATTERS = [("maskgit_plus", [9, 3, 36, 3, 17, 11], 32, 8), ("entropy", [5, 9, 17, 3, 40, 22], 16, 5)]


def _dream_variant(src: Path, dst: Path, config: dict | None = None, generation: dict | None = None) -> Path:
    """A copy of the tiny Dream checkpoint with keys added to config.json and/or a generation_config.json."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text()) | (config or {})
    (dst / "config.json").write_text(json.dumps(cfg))
    if generation is not None:
        (dst / "generation_config.json").write_text(json.dumps(generation))
    return dst


@pytest.mark.parametrize("alg, prompt, gen, steps", FILTER_MATTERS)
def test_dream_default_decode_uses_diffusion_generates_top_k_50(dream, dream_dir, alg, prompt, gen, steps):
    """No generation key in config.json: the reference samples with top-k 50 (transformers 4.x), so do we; the
    unfiltered decode (the old default, now ``top_k=0``) commits differently here."""
    ids, mask = torch.tensor([prompt]), dream.mask_token_id
    config = json.loads((dream_dir / "config.json").read_text())
    ref = dream_sample(_raw(dream), ids, gen, steps, mask, alg=alg, config=config, temperature=0.0)
    out = dlm_decode.generate(dream, ids, sampler=alg, gen_length=gen, steps=steps)
    assert torch.equal(out.sequences, ref)
    assert (out.config["top_k"], out.config["top_p"], out.sampler["eps"], out.sampler["alg_temp"]) == (
        50,
        1.0,
        1e-3,
        None,
    )
    assert torch.equal(
        dlm_decode.generate(dream, ids, sampler=alg, gen_length=gen, steps=steps, top_k=50).sequences, ref
    )
    off = dlm_decode.generate(dream, ids, sampler=alg, gen_length=gen, steps=steps, top_k=0)
    assert not torch.equal(off.sequences, ref)  # the filter matters for this prompt
    unfiltered = dream_sample(_raw(dream), ids, gen, steps, mask, alg=alg, config=config, temperature=0.0, top_k=None)
    assert torch.equal(off.sequences, unfiltered)  # explicit "no top-k" is the reference's explicit top_k=None


@pytest.mark.parametrize("alg, prompt, gen, steps", FILTER_MATTERS)
@pytest.mark.parametrize(
    "config_keys, generation, top_k",
    [
        ({"top_k": None}, None, None),  # null: dropped by from_model_config, so DreamGenerationConfig's None (off)
        ({"top_k": 5, "top_p": 0.9}, None, 5),
        ({"eps": 0.01}, None, 50),  # eps reaches the schedule
        ({}, {"top_k": 1, "top_p": 0.1, "eps": 0.5}, 50),  # generation_config.json: diffusion_generate never reads it
    ],
)
def test_dream_defaults_follow_the_checkpoint_config(
    dream_dir, tmp_path, alg, prompt, gen, steps, config_keys, generation, top_k
):
    path = _dream_variant(dream_dir, tmp_path / "dream", config_keys, generation)
    model = dlm_decode.load_model(path)[0]
    ids, config = torch.tensor([prompt]), json.loads((path / "config.json").read_text())
    ref = dream_sample(_raw(model), ids, gen, steps, model.mask_token_id, alg=alg, config=config, temperature=0.0)
    out = dlm_decode.generate(model, ids, sampler=alg, gen_length=gen, steps=steps)
    assert torch.equal(out.sequences, ref)
    assert out.config["top_k"] == top_k and out.sampler["eps"] == config.get("eps", 1e-3)
    # explicit options from the caller win over the checkpoint's
    explicit = dlm_decode.generate(
        model, ids, sampler=alg, sampler_options={"eps": 1e-3}, gen_length=gen, steps=steps, top_k=50, top_p=1.0
    )
    ref50 = dream_sample(
        _raw(model), ids, gen, steps, model.mask_token_id, alg=alg, temperature=0.0, top_k=50, top_p=1.0, eps=1e-3
    )
    assert torch.equal(explicit.sequences, ref50)


def test_llada_ignores_generation_settings_in_its_checkpoint(llada, llada_dir, tmp_path):
    """LLaDA's ``generate()`` takes every option from its caller: neither generation_config.json nor generation keys
    in config.json change a decode, not even with the Dream orderings (where a top-k 1 filter would)."""
    path = tmp_path / "llada"
    shutil.copytree(llada_dir, path)
    cfg = json.loads((path / "config.json").read_text()) | {"top_k": 1, "top_p": 0.1, "temperature": 0.9}
    (path / "config.json").write_text(json.dumps(cfg))
    (path / "generation_config.json").write_text(json.dumps({"top_k": 1, "top_p": 0.1, "temperature": 0.9}))
    model = dlm_decode.load_model(path)[0]
    assert model.sampling_defaults == {}
    outs = {}
    for sampler in ("low_confidence", "maskgit_plus"):
        kw = dict(sampler=sampler, gen_length=16, block_length=16, steps=8)
        outs[sampler] = out = dlm_decode.generate(model, PROMPTS, **kw)
        assert torch.equal(out.sequences, dlm_decode.generate(llada, PROMPTS, **kw).sequences)
        assert out.config["top_k"] is None and out.config["top_p"] is None and out.config["temperature"] == 0.0
    top1 = dlm_decode.generate(llada, PROMPTS, sampler="maskgit_plus", gen_length=16, block_length=16, steps=8, top_k=1)
    assert not torch.equal(top1.sequences, outs["maskgit_plus"].sequences)  # the settings would have mattered


def test_dream_orderings_also_run_on_llada_and_vice_versa(llada, dream):
    a = dlm_decode.generate(llada, PROMPTS[:1], sampler="maskgit_plus", gen_length=8, steps=8)
    b = dlm_decode.generate(dream, PROMPTS[:1], sampler="low_confidence", gen_length=8, steps=8)
    for out in (a, b):
        assert not (out.sequences == 63).any()
