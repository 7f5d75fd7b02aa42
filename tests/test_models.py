"""Native models: official-format loading through the Auto classes and logits against straightforward references."""

from __future__ import annotations

import json

import pytest
import torch
from checkpoints import (
    MASK,
    dream_config,
    dream_state_dict,
    llada_config,
    llada_state_dict,
    reference_dream_logits,
    reference_llada_logits,
    write_checkpoint,
)
from transformers import AutoConfig, AutoModel

import dlm_decode
from dlm_decode.cache.store import KVStore
from dlm_decode.models import DreamModel, LLaDAModelLM

IDS = torch.tensor([[5, 9, 17, 3, 40, 22, MASK, MASK, 8, MASK], [7, 7, 2, 33, MASK, MASK, MASK, 12, 4, 1]])


@pytest.mark.parametrize("shards", [1, 3])
def test_auto_model_loads_llada_without_remote_code(tmp_path, shards):
    cfg = llada_config()
    sd = llada_state_dict(cfg, seed=1)
    path = write_checkpoint(tmp_path / "ck", cfg, sd, shards=shards)
    assert isinstance(AutoConfig.from_pretrained(path), dlm_decode.models.LLaDAConfig)
    model = AutoModel.from_pretrained(path, dtype=torch.float32)
    assert type(model) is LLaDAModelLM
    for k, v in sd.items():
        assert torch.equal(model.state_dict()[k], v), k
    got = model(IDS).logits
    assert got.shape == (2, IDS.shape[1], cfg["embedding_size"])
    torch.testing.assert_close(got, reference_llada_logits(sd, cfg, IDS), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shards", [1, 2])
def test_auto_model_loads_dream_without_remote_code(tmp_path, shards):
    cfg = dream_config()
    sd = dream_state_dict(cfg, seed=2)
    path = write_checkpoint(tmp_path / "ck", cfg, sd, shards=shards)
    model = AutoModel.from_pretrained(path, dtype=torch.float32)
    assert type(model) is DreamModel
    # logits reach |10| here, so fp32 rounding of two summation orders (SDPA against the reference's softmax) is
    # up to ~1.4e-5 on this machine's BLAS (seeds 0-11); 5e-5 is still 1e-6 of the scale, far below any real error
    torch.testing.assert_close(model(IDS).logits, reference_dream_logits(sd, cfg, IDS), atol=5e-5, rtol=1e-5)


def test_llada_key_padding_mask_matches_reference(llada_dir):
    cfg = json.loads((llada_dir / "config.json").read_text())
    sd = llada_state_dict(cfg)
    model = dlm_decode.load_model(llada_dir)[0]
    mask = torch.ones_like(IDS, dtype=torch.bool)
    mask[1, :3] = False
    got = model(IDS, attention_mask=mask).logits
    ref = reference_llada_logits(sd, cfg, IDS, keymask=mask)
    torch.testing.assert_close(got[mask], ref[mask], atol=1e-5, rtol=1e-5)


def test_dream_official_pairwise_mask_and_positions(dream_dir):
    """Dream's batched call: 4D mask m_i & m_j, positions cumsum(mask) - 1 (pads set to 1)."""
    cfg = json.loads((dream_dir / "config.json").read_text())
    sd = dream_state_dict(cfg)
    model = dlm_decode.load_model(dream_dir)[0]
    m = torch.ones_like(IDS)
    m[0, :2] = 0
    tok_idx = (m.cumsum(-1) - 1).masked_fill(m == 0, 1)
    pair = torch.logical_and(m[:, None, None, :].bool(), m[:, None, :, None].bool())
    got = model(IDS, attention_mask=pair, position_ids=tok_idx).logits
    ref = reference_dream_logits(sd, cfg, IDS, pos=tok_idx, keymask=m.bool())
    torch.testing.assert_close(got[m.bool()], ref[m.bool()], atol=1e-5, rtol=1e-5)


def test_denoise_aligns_dream_shift(dream, llada):
    pos = torch.arange(IDS.shape[1]).expand_as(IDS)
    raw = dream(IDS).logits
    aligned = dream.denoise(IDS, pos, region=(3, 9))
    torch.testing.assert_close(aligned, raw[:, 2:8])  # slot i is predicted by hidden state i-1
    torch.testing.assert_close(llada.denoise(IDS, pos, region=(3, 9)), llada(IDS).logits[:, 3:9])


@pytest.mark.parametrize("which", ["llada", "dream"])
def test_store_refresh_equals_fresh_forward_and_partial_step_reads_it(which, llada, dream):
    model = {"llada": llada, "dream": dream}[which]
    b, t = IDS.shape
    pos = torch.arange(t).expand(b, t)
    n_layers, n_kv, hd = model.kv_shape()
    store = KVStore(n_layers, b, n_kv, t, hd, dtype=torch.float32, device="cpu")
    full = model.denoise(IDS, pos, compute=slice(0, t), region=(1, t), store=store)
    torch.testing.assert_close(full, model.denoise(IDS, pos, region=(1, t)))
    # a later step recomputing only slots 4..8 against the stored K/V gives the full-forward logits there
    part = model.denoise(IDS, pos, compute=slice(3, 9), region=(4, 9), store=store)
    torch.testing.assert_close(part, full[:, 3:8], atol=1e-5, rtol=1e-5)
    # the same with an index tensor of slots (rows may differ)
    idx = torch.tensor([[3, 4, 5, 6, 7, 8], [3, 4, 5, 6, 7, 8]])
    torch.testing.assert_close(
        model.denoise(IDS, pos, compute=idx, region=(4, 9), store=store), full[:, 3:8], atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_forward_close_to_fp32(llada_dir, dream_dir, dtype):
    for path in (llada_dir, dream_dir):
        m32 = dlm_decode.load_model(path)[0]
        mlo = dlm_decode.load_model(path, dtype=dtype)[0]
        ref, got = m32(IDS).logits, mlo(IDS).logits
        assert got.dtype == getattr(torch, dtype)
        assert torch.isfinite(got).all()
        rel = (got.float() - ref).abs().max() / ref.abs().max()
        assert rel < 0.05, f"{path.name} {dtype}: relative error {rel:.3f}"


def test_loader_errors_are_specific(tmp_path, llada_dir):
    with pytest.raises(FileNotFoundError, match="neither a checkpoint directory"):
        dlm_decode.load_model(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        dlm_decode.load_model(tmp_path / "empty")
    binonly = tmp_path / "bin"
    binonly.mkdir()
    (binonly / "config.json").write_text((llada_dir / "config.json").read_text())
    (binonly / "pytorch_model.bin").write_bytes(b"\0")
    with pytest.raises(FileNotFoundError, match="safetensors only"):
        dlm_decode.load_model(binonly)
    other = write_checkpoint(tmp_path / "gpt", {"model_type": "gpt2"}, {"x": torch.zeros(1)})
    with pytest.raises(ValueError, match="model_type 'gpt2' is not supported"):
        dlm_decode.load_model(other)
    cfg = llada_config(alibi=True)
    bad = write_checkpoint(tmp_path / "alibi", cfg, llada_state_dict(llada_config()))
    with pytest.raises(ValueError, match="alibi"):
        dlm_decode.load_model(bad)
