"""``benchmarks/bench_block_diffusion.py``'s GPU pieces (issue 48), checked on the CPU: the random model built in place
at LLaDA2.0-mini's widths, and the roofline's bytes a forward, counted from the experts the forwards reach, on a
model whose routing is forced so the count is known."""

from __future__ import annotations

import sys
from argparse import Namespace
from pathlib import Path

import pytest
import torch
from llada2_reference import EOS, MASK, write_llada2

from dlm_decode.models.loading import load_model
from dlm_decode.models.moe import Router, SparseMoE

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_block_diffusion as bench  # noqa: E402

pytestmark = [pytest.mark.usefixtures("one_thread")]


def _args(**over) -> Namespace:
    base = dict(threshold=0.95, gen=32, block=16, steps=16, prompt=16, device="cpu", dtype="float32", peak_gbps=None)
    return Namespace(**(base | over))


@torch.no_grad()
def test_forward_bytes_counts_the_experts_reached(tmp_path):
    """Selection bias on experts 0-2 (two of the four groups, top 3 of the 4 experts they allow): every token of
    every forward reaches exactly those three in each of the two routed layers."""
    model, _ = load_model(write_llada2(tmp_path / "m", seed=1))
    for r in model.modules():
        if isinstance(r, Router):
            r.expert_bias[:3] = 100.0
    moes = [m for m in model.modules() if isinstance(m, SparseMoE)]
    assert len(moes) == 2 and len(moes[0].experts) == 8
    emb = model.get_input_embeddings().weight
    routed = {id(p) for m in moes for p in m.experts.parameters()}
    fixed = sum(p.numel() * 4 for p in model.parameters() if p is not emb and id(p) not in routed)
    expert = sum(p.numel() * 4 for p in moes[0].experts[0].parameters())
    n_layers, heads, hd = model.kv_shape()
    prompts = [list(range(5, 21))]
    args = _args()
    kv = 2 * n_layers * heads * 48 * hd * 4  # the store's 48 slots (prompt 16 + gen 32), K and V, batch 1
    assert bench.forward_bytes(model, "ours", prompts, args, (MASK, EOS)) == fixed + kv + 2 * 3 * expert
    assert bench.forward_bytes(model, "reference", prompts, args, (MASK, EOS)) == fixed + 2 * 3 * expert
    for r in model.modules():
        if isinstance(r, Router):
            r.expert_bias.zero_()  # free routing reaches more of them
    assert bench.forward_bytes(model, "reference", prompts, args, (MASK, EOS)) > fixed + 2 * 3 * expert


def test_mini_model_has_the_published_widths():
    """Two layers of LLaDA2.0-mini with 16 experts, built in place (no checkpoint), MASK's lm_head row zeroed; on a CPU
    in float32 the looped expert path is the one measured."""
    args = _args(layers=2, experts=16, block=32)
    model = bench.mini_model(args)
    c = model.config
    assert (c.hidden_size, c.vocab_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (
        2048, 157184, 16, 4, 128,
    )  # fmt: skip
    assert (c.num_experts, c.num_experts_per_tok, c.n_group, c.topk_group, c.moe_intermediate_size) == (
        16,
        8,
        8,
        4,
        512,
    )
    moe = model.model.layers[1].mlp
    assert (
        isinstance(moe, SparseMoE)
        and moe.shared_experts is not None
        and not isinstance(model.model.layers[0].mlp, SparseMoE)
    )
    assert model.lm_head.weight[model.mask_token_id].abs().sum() == 0 and model.lm_head.weight.std() > 0.01
    assert args.expert_path == "looped"
    with torch.no_grad():
        logits = model(torch.arange(8)[None], block_length=32).logits
    assert logits.shape == (1, 8, 157184) and torch.isfinite(logits).all()
