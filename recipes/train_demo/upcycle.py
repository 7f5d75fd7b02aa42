"""A fresh ``llada2_moe`` model for the recipe, and its initialisation from a trained LLaDA checkpoint (upcycling).

The LLaDA2 model (``dlm_decode.models.llada2``) differs from LLaDA 1.x in four places the conversion has to bridge:

- attention: one fused ``query_key_value`` projection, split q | k | v by heads, so LLaDA's ``q_proj``, ``k_proj``,
  ``v_proj`` are stacked in that order; ``attn_out`` -> ``dense`` (bias-free: ``use_bias`` False);
- ``use_qk_norm``: RMSNorm per head on q and k. Its weights start at 1, but the normalisation itself is not the
  identity (it fixes every head's q and k to unit RMS), so with ``qk_norm`` the converted attention differs from
  LLaDA's; the logits are equal to LLaDA's only with ``qk_norm: false``;
- rotary: LLaDA rotates the whole head (rotate-half, fp32 tables); LLaDA2 the first ``partial_rotary_factor`` of it,
  so equality needs ``partial_rotary: 1.0``;
- the MLP: the first ``first_k_dense_replace`` layers keep LLaDA's SwiGLU (``ff_proj`` -> ``gate_proj``, ``up_proj``,
  ``ff_out`` -> ``down_proj``); later layers are MoE, "upcycled" (Komatsuzaki et al. 2023, "Sparse Upcycling") in
  its fine-grained form: the dense MLP's hidden units are cut into ``mlp_hidden / moe_hidden`` slices; the shared
  expert (width ``moe_hidden * num_shared_experts``, which must equal ``mlp_hidden``) is the whole dense MLP, and
  routed expert ``e`` is slice ``e mod slices`` with its ``down_proj`` at zero. The MoE then computes exactly the dense
  function at step 0 (the routed experts add zero whatever the router picks), and the routed experts start from
  distinct pieces of it, trained apart by the router from the first step on.

Embeddings, the final norm and the output projection (LLaDA's ``ff_out``, or ``wte`` when tied) copy over; the
router starts as the model's own init (normal 0.02, zero ``expert_bias``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from dlm_decode.models import load_model
from dlm_decode.models.llada2 import LLaDA2MoeConfig, LLaDA2MoeModelLM
from recipes.train_demo.config import ModelConfig


def llada2_config(m: ModelConfig, vocab: int, ids: dict[str, int], theta: float) -> LLaDA2MoeConfig:
    """The official config of a fresh llada2_moe model of ``m``'s sizes."""
    return LLaDA2MoeConfig(
        vocab_size=vocab,
        hidden_size=m.d_model,
        intermediate_size=m.mlp_hidden,
        num_hidden_layers=m.n_layers,
        num_attention_heads=m.n_heads,
        num_key_value_heads=m.kv_heads,
        use_qk_norm=m.qk_norm,
        use_bias=False,
        max_position_embeddings=m.max_len,
        rope_theta=theta,
        num_experts=m.n_experts,
        num_shared_experts=m.n_shared_experts,
        num_experts_per_tok=m.experts_per_tok,
        n_group=m.n_group,
        topk_group=m.topk_group,
        routed_scaling_factor=m.routed_scale,
        moe_intermediate_size=m.moe_hidden,
        first_k_dense_replace=m.first_dense,
        partial_rotary_factor=m.partial_rotary,
        **ids,
    )


def upcycled_llada2(m: ModelConfig, say: Any = print) -> LLaDA2MoeModelLM:
    """A llada2_moe model with ``m``'s MoE sizes and the weights of the LLaDA checkpoint ``m.upcycle``."""
    src, _ = load_model(m.upcycle, dtype=torch.float32, tokenizer=False)
    if type(src).__name__ != "LLaDAModelLM":
        raise ValueError(f"model.upcycle {m.upcycle} is not a LLaDA checkpoint (got {type(src).__name__})")
    c = src.config
    if m.moe_hidden * m.n_shared_experts != c.mlp_hidden_size or c.mlp_hidden_size % m.moe_hidden:
        raise ValueError(
            f"model.upcycle: moe_hidden ({m.moe_hidden}) must divide the LLaDA MLP width ({c.mlp_hidden_size}) and "
            f"moe_hidden * n_shared_experts must equal it (the shared expert is the whole dense MLP)"
        )
    sizes = dict(d_model=c.d_model, n_layers=c.n_layers, n_heads=c.n_heads, n_kv_heads=c.n_kv_heads)
    sizes |= dict(mlp_hidden=c.mlp_hidden_size, max_len=c.max_sequence_length)
    shaped = dataclasses.replace(m, **sizes)
    ids = dict(mask_token_id=src.mask_token_id, eos_token_id=c.eos_token_id, pad_token_id=c.pad_token_id)
    vocab = c.embedding_size or c.vocab_size
    theta = m.rope_theta if m.rope_theta is not None else c.rope_theta
    dst = LLaDA2MoeModelLM(llada2_config(shaped, vocab, ids, theta))
    copy_weights(src, dst)
    say(f"upcycled {m.upcycle} into llada2_moe ({m.n_experts} routed experts, first {m.first_dense} dense)")
    return dst


@torch.no_grad()
def copy_weights(src: Any, dst: LLaDA2MoeModelLM) -> None:
    """LLaDA ``src``'s weights into ``dst`` as the module docstring says (qk-norm weights and router untouched)."""
    t, d = src.model.transformer, dst.model
    d.word_embeddings.weight.copy_(t.wte.weight)
    d.norm.weight.copy_(t.ln_f.weight)
    dst.lm_head.weight.copy_(t.wte.weight if src.config.weight_tying else t.ff_out.weight)
    for blk, layer in zip(t.blocks, d.layers, strict=True):
        layer.input_layernorm.weight.copy_(blk.attn_norm.weight)
        layer.post_attention_layernorm.weight.copy_(blk.ff_norm.weight)
        qkv = torch.cat([blk.q_proj.weight, blk.k_proj.weight, blk.v_proj.weight], 0)  # [(H + 2 Hk) hd, d]
        layer.attention.query_key_value.weight.copy_(qkv)
        layer.attention.dense.weight.copy_(blk.attn_out.weight)
        if not hasattr(layer.mlp, "experts"):
            _copy_mlp(blk, layer.mlp)
            continue
        _copy_mlp(blk, layer.mlp.shared_experts)
        width = layer.mlp.experts[0].gate_proj.weight.shape[0]
        slices = blk.ff_proj.weight.shape[0] // width
        for e, expert in enumerate(layer.mlp.experts):
            part = slice((e % slices) * width, (e % slices + 1) * width)
            expert.gate_proj.weight.copy_(blk.ff_proj.weight[part])
            expert.up_proj.weight.copy_(blk.up_proj.weight[part])
            expert.down_proj.weight.zero_()


def _copy_mlp(blk: Any, mlp: Any) -> None:
    mlp.gate_proj.weight.copy_(blk.ff_proj.weight)
    mlp.up_proj.weight.copy_(blk.up_proj.weight)
    mlp.down_proj.weight.copy_(blk.ff_out.weight)
