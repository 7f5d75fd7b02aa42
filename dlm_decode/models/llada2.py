"""Native LLaDA2.0 / LLaDA2.1 (inclusionAI/LLaDA2.0-mini, -flash, LLaDA2.1; ``model_type`` "llada2_moe"), a
block-causal mixture-of-experts diffusion LM that loads the official checkpoints.

Config keys and parameter names are the published ones (``model.word_embeddings``, ``model.layers.{i}.attention.
query_key_value``, ``...mlp.gate.expert_bias``, ``lm_head``; ``../shared/docs/MODELS.md``), so ``AutoModel.
from_pretrained`` on an official directory returns this class without remote code once ``dlm_decode`` is imported.
LLaDA2.1 has the same architecture and checkpoint format; only its decoding differs (``samplers/token_editing.py``).

Reference: ``LLaDA2MoeModelLM.forward`` of the HF modeling file (ZHZisZZ/dllm ``dllm/pipelines/llada2/models/``):
pre-RMSNorm layers; attention from one fused ``query_key_value`` projection split q | k | v by heads, RMSNorm per
head on q and k (``use_qk_norm``), RoPE on the first ``head_dim * partial_rotary_factor`` dims (rotate-half on that
slice, fp32 tables cast to the model dtype), GQA, scale hd^-0.5; SwiGLU dense MLP in the first
``first_k_dense_replace`` layers and ``moe.SparseMoE`` after; unshifted logits (``logits[i]`` predicts slot i).

Attention is **block-causal** when decoding: with blocks of ``block_length`` on the absolute position grid, a query
at position p sees the keys at positions < (p // B + 1) * B (its own block and every earlier one). ``denoise`` takes
``block_length`` for that (the decode loop passes the call's block); the key positions of the store's slots are the
row's slot offset applied to the slot ids (left padding shifts a row's slots, never its positions). ``forward``
takes the reference's 4D mask (additive or bool) or ``block_length``, for tests against the reference.

Mask and EOS ids, in this order: ``mask_token_id`` / ``eos_token_id`` of config.json; else the tokenizer's
``mask_token_id`` / ``eos_token_id`` (``adopt_tokenizer_ids``, called by ``loading.load_model`` and ``model_facts``);
else the reference ``generate()`` defaults 156895 / 156892. Every one of them is checked against the vocabulary before
any weight is read (``core.special_ids``): a MASK id outside it is an error; the fallback EOS outside it (a small
model) is dropped, and the model decodes to the gen length with one notice.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import MaskedLMOutput

from dlm_decode.core.special_ids import usable_ids
from dlm_decode.models.common import DiffusionLMMixin, RMSNorm, take_rows
from dlm_decode.models.moe import Router, SparseMoE, SwiGLU
from dlm_decode.models.schema import (
    ConfigSchema,
    Key,
    Rule,
    below,
    divides,
    flag,
    positive_int,
    positive_number,
    token_id,
)

#: the config.json keys this implementation reads (checked before any weight, ``models/schema.py``; official values:
#: LLaDA2.0-mini). The MASK and EOS ids are generate() arguments in the reference, not required config keys.
LLADA2_SCHEMA = ConfigSchema(
    "LLaDA2",
    {
        "hidden_size": positive_int(required=True, official=2048),
        "num_hidden_layers": positive_int(required=True, official=20),
        "num_attention_heads": positive_int(required=True, official=16),
        "vocab_size": positive_int(required=True, official=157184),
        "num_key_value_heads": Key("int", low=0),
        "head_dim": positive_int(nullable=True),
        "intermediate_size": positive_int(nullable=True),
        "moe_intermediate_size": positive_int(nullable=True),
        "num_experts": positive_int(nullable=True),
        "num_shared_experts": Key("int", low=0, nullable=True),
        "num_experts_per_tok": positive_int(),
        "n_group": positive_int(),
        "topk_group": positive_int(),
        "routed_scaling_factor": positive_number(),
        "first_k_dense_replace": Key("int", low=0),
        "partial_rotary_factor": Key("number", low=0, above=True, high=1),
        "hidden_act": Key("str", choices=("silu",)),
        "score_function": Key("str", choices=("sigmoid",)),
        "use_qkv_bias": flag(),
        "use_qk_norm": flag(),
        "use_bias": flag(),
        "norm_head": flag(),
        "tie_word_embeddings": flag(),
        "rms_norm_eps": positive_number(),
        "rope_theta": positive_number(),
        "rope_scaling": Key("object", nullable=True),
        "max_position_embeddings": positive_int(),
        "mask_token_id": token_id(nullable=True),
        "pad_token_id": token_id(nullable=True),
        "eos_token_id": Key("ids", low=0, nullable=True),
    },
    rules=(
        divides("num_experts", "n_group"),
        Rule(
            ("num_attention_heads", "num_key_value_heads"),
            lambda h, k: k == 0 or h % k == 0,
            "num_attention_heads ({num_attention_heads}) must be a multiple of num_key_value_heads "
            "({num_key_value_heads})",
        ),
        Rule(
            ("topk_group", "n_group"),
            lambda t, n: t <= n,
            "topk_group ({topk_group}) must be <= n_group ({n_group})",
        ),
        Rule(
            ("num_experts_per_tok", "num_experts"),
            lambda k, e: k <= e,
            "num_experts_per_tok ({num_experts_per_tok}) must be <= num_experts ({num_experts})",
        ),
        below("mask_token_id", "vocab_size"),
    ),
)

REFERENCE_MASK_ID = 156895  # LLaDA2 ``generate(mask_id=...)`` default
REFERENCE_EOS_ID = 156892  # LLaDA2 ``generate(eos_id=...)`` default (also the official pad_token_id)


class LLaDA2MoeConfig(PretrainedConfig):
    """The official config keys and the reference configuration class's defaults."""

    model_type = "llada2_moe"
    config_schema = LLADA2_SCHEMA

    def __init__(
        self,
        vocab_size: int = 30592,
        hidden_size: int = 1024,
        intermediate_size: int | None = None,
        num_hidden_layers: int = 24,
        num_attention_heads: int = 16,
        num_key_value_heads: int = 0,
        hidden_act: str = "silu",
        use_qkv_bias: bool = False,
        use_qk_norm: bool = True,
        use_bias: bool = True,
        rms_norm_eps: float = 1e-05,
        norm_head: bool = False,
        tie_word_embeddings: bool = False,
        max_position_embeddings: int = 16384,
        rope_theta: float = 10000.0,
        rope_scaling: dict | None = None,
        pad_token_id: int = 126081,
        num_experts: int | None = 16,
        num_shared_experts: int | None = 0,
        num_experts_per_tok: int = 2,
        n_group: int = 8,
        topk_group: int = 4,
        routed_scaling_factor: float = 2.5,
        moe_intermediate_size: int | None = None,
        first_k_dense_replace: int = 0,
        head_dim: int | None = None,
        partial_rotary_factor: float = 0.5,
        mask_token_id: int | None = None,
        eos_token_id: int | None = None,
        **kwargs: Any,
    ) -> None:
        self.vocab_size, self.hidden_size, self.intermediate_size = vocab_size, hidden_size, intermediate_size
        self.num_hidden_layers, self.num_attention_heads = num_hidden_layers, num_attention_heads
        self.num_key_value_heads, self.hidden_act = num_key_value_heads, hidden_act
        self.use_qkv_bias, self.use_qk_norm, self.use_bias, self.norm_head = (
            use_qkv_bias,
            use_qk_norm,
            use_bias,
            norm_head,
        )
        self.rms_norm_eps, self.max_position_embeddings = rms_norm_eps, max_position_embeddings
        self.rope_theta = rope_theta
        if rope_scaling is not None:
            kwargs["rope_scaling"] = rope_scaling
        self.num_experts, self.num_shared_experts, self.num_experts_per_tok = (
            num_experts,
            num_shared_experts,
            num_experts_per_tok,
        )
        self.n_group, self.topk_group, self.routed_scaling_factor = n_group, topk_group, routed_scaling_factor
        self.moe_intermediate_size, self.first_k_dense_replace = moe_intermediate_size, first_k_dense_replace
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.partial_rotary_factor = partial_rotary_factor
        self.mask_token_id = mask_token_id
        super().__init__(
            pad_token_id=pad_token_id, eos_token_id=eos_token_id, tie_word_embeddings=tie_word_embeddings, **kwargs
        )

    def check_supported(self) -> None:
        """Raise ValueError, naming the key, for values this implementation (and the reference) does not cover."""
        bad = []
        if self.hidden_act != "silu":
            bad.append(f"hidden_act={self.hidden_act!r} (supported: 'silu')")
        if self.norm_head:
            bad.append("norm_head=True (supported: False)")
        scaling = getattr(self, "rope_scaling", None) or getattr(self, "rope_parameters", None) or {}
        if scaling.get("rope_type", scaling.get("type", "default")) != "default":
            bad.append(f"rope_scaling={scaling!r} (supported: null / default rope)")
        score = getattr(self, "score_function", "sigmoid")
        if score != "sigmoid":
            bad.append(f"score_function={score!r} (the reference router is sigmoid only)")
        kv = self.num_key_value_heads
        if not kv or self.num_attention_heads % kv:
            bad.append(f"num_key_value_heads={kv!r} (must divide num_attention_heads={self.num_attention_heads})")
        rope = int(self.head_dim * self.partial_rotary_factor)
        if not 0 < rope <= self.head_dim or rope % 2:
            bad.append(f"partial_rotary_factor={self.partial_rotary_factor!r} (head_dim * it must be even, > 0)")
        if self.num_experts is not None:
            bad += self._moe_problems()
        if self.num_experts is None or self.first_k_dense_replace > 0:
            if not self.intermediate_size:
                bad.append(f"intermediate_size={self.intermediate_size!r} (dense layers need a width)")
        if bad:
            raise ValueError("unsupported llada2_moe config: " + ", ".join(bad))

    def _moe_problems(self) -> list[str]:
        e, g = self.num_experts, self.n_group
        out = []
        if not self.moe_intermediate_size:
            out.append(f"moe_intermediate_size={self.moe_intermediate_size!r} (MoE layers need a width)")
        if not g or e % g or e // g < 2:
            out.append(f"n_group={g!r} (must divide num_experts={e} into groups of >= 2 experts)")
        elif not 0 < self.topk_group <= g:
            out.append(f"topk_group={self.topk_group!r} (must be in 1..n_group={g})")
        elif not 0 < self.num_experts_per_tok <= self.topk_group * (e // g):
            out.append(f"num_experts_per_tok={self.num_experts_per_tok!r} (1..experts in the kept groups)")
        return out


def block_visible(
    q_pos: torch.Tensor,  # [B, N] positions of the queries
    k_slots: torch.Tensor,  # [B or 1, S] slot ids of the keys
    offset: torch.Tensor,  # [B] slot of position 0 in each row
    block_length: int,
) -> torch.Tensor:  # [B, 1, N, S] bool
    """Block-causal visibility on the absolute grid: key position // B <= query position // B."""
    k_pos = k_slots - offset[:, None]
    q_blk = torch.div(q_pos.clamp(min=0), block_length, rounding_mode="floor")
    k_blk = torch.div(k_pos, block_length, rounding_mode="floor")
    return (k_blk[:, None, :] <= q_blk[:, :, None])[:, None]


class LLaDA2Attention(nn.Module):
    """Official names: ``query_key_value``, ``query_layernorm``, ``key_layernorm``, ``dense``."""

    def __init__(self, cfg: LLaDA2MoeConfig) -> None:
        super().__init__()
        h, kv, hd, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size
        self.query_key_value = nn.Linear(d, (h + 2 * kv) * hd, bias=cfg.use_qkv_bias)
        if cfg.use_qk_norm:
            self.query_layernorm = RMSNorm(hd, cfg.rms_norm_eps)
            self.key_layernorm = RMSNorm(hd, cfg.rms_norm_eps)
        self.dense = nn.Linear(h * hd, d, bias=cfg.use_bias)
        self.shape = (h, kv, hd)
        self.qk_norm = cfg.use_qk_norm

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x [B, Q, d] -> q [B, H, Q, hd], k and v [B, Hk, Q, hd], normed per head and rotated."""
        h, kv, hd = self.shape
        b, n, _ = x.shape
        q, k, v = self.query_key_value(x).view(b, n, h + 2 * kv, hd).split([h, kv, kv], dim=2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.qk_norm:
            q, k = self.query_layernorm(q), self.key_layernorm(k)
        return partial_rope(q, cos, sin), partial_rope(k, cos, sin), v


def rope_tables(positions: torch.Tensor, rope_dim: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """[B, Q] positions -> cos, sin [B, 1, Q, rope_dim] (HF default rope: fp32 tables cast to the model dtype)."""
    inv = 1.0 / (theta ** (torch.arange(0, rope_dim, 2, dtype=torch.int64, device=positions.device).float() / rope_dim))
    freqs = positions.float()[..., None] * inv  # [B, Q, rope_dim / 2]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]


def partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on the first ``cos.shape[-1]`` dims of x [B, H, Q, hd]; the rest passes through."""
    r = cos.shape[-1]
    rot, rest = x[..., :r], x[..., r:]
    half = torch.cat([-rot[..., r // 2 :], rot[..., : r // 2]], dim=-1)
    return torch.cat([rot * cos + half * sin, rest], dim=-1)


def attention(
    q: torch.Tensor,  # [B, H, N, hd]
    k: torch.Tensor,  # [B, Hk, S, hd]
    v: torch.Tensor,
    visible: torch.Tensor | None,  # [B, 1, N, S] or [B, 1, 1, S] bool, None: all
) -> torch.Tensor:  # [B, N, H * hd]
    """Masked GQA attention (PyTorch SDPA, its own GQA broadcast: the numbers of ``repeat_interleave``'d K/V without
    the copies), heads concatenated."""
    gqa = q.shape[1] != k.shape[1]
    out = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=visible, enable_gqa=gqa)
    b, h, n, hd = out.shape
    return out.transpose(1, 2).reshape(b, n, h * hd)


class LLaDA2Layer(nn.Module):
    """Official names: ``input_layernorm``, ``attention``, ``post_attention_layernorm``, ``mlp``."""

    def __init__(self, cfg: LLaDA2MoeConfig, index: int) -> None:
        super().__init__()
        d = cfg.hidden_size
        self.input_layernorm = RMSNorm(d, cfg.rms_norm_eps)
        self.attention = LLaDA2Attention(cfg)
        self.post_attention_layernorm = RMSNorm(d, cfg.rms_norm_eps)
        moe = cfg.num_experts is not None and index >= cfg.first_k_dense_replace
        self.mlp = SparseMoE(cfg) if moe else SwiGLU(d, cfg.intermediate_size)

    def forward(self, h, cos, sin, layer, keys, rows=None):  # h [B, Q, d] -> [B, Q or N, d]
        """``keys``: a ``KeyView`` (the store, the slots written, the visibility); ``rows``: the query rows whose
        output is wanted (K/V still come from every row)."""
        q, k, v = self.attention.qkv(self.input_layernorm(h), cos, sin)
        q = take_rows(q, rows, 2)
        k, v, visible, q = keys.resolve(layer, k, v, q, rows)
        attn = keys.own(attention(q, k, v, visible))
        h = take_rows(h, rows) + self.attention.dense(attn)
        return h + self.mlp(self.post_attention_layernorm(h))


class KeyView:
    """Where a forward's keys come from and which a query sees: the computed slots alone (no store) or the store's
    whole canvas (through the forward's ``KVAccess``), with the key-padding mask and, given a block length, the
    block-causal rule."""

    def __init__(self, store, slots, key_mask, key_index, positions, block_length) -> None:
        if isinstance(key_index, torch.Tensor):
            raise ValueError(
                "llada2_moe: gathered keys (key_index) are not supported; caches that prune keys "
                "(dKV, window) do not apply to a block-causal model"
            )
        self.store, self.slots, self.key_mask, self.key_run = store, slots, key_mask, key_index
        self.positions, self.block_length = positions, block_length  # [B, Q] of the computed slots

    def _slot_ids(self, b: int, q: int, device: torch.device) -> torch.Tensor:  # [B or 1, Q] computed slot ids
        if self.slots is None:
            return torch.arange(q, device=device)[None]
        if isinstance(self.slots, slice):
            return torch.arange(self.slots.start or 0, (self.slots.start or 0) + q, device=device)[None]
        return self.slots

    def resolve(self, layer, k, v, q, rows):
        """-> keys, values, visibility [B, 1, N, S] (or None) and the queries, over the store's batch."""
        b, _, n_q, _ = k.shape
        computed = self._slot_ids(b, n_q, k.device)  # [B or 1, Q]
        q_pos = take_rows(self.positions, rows)
        key_mask, key_slots = self.key_mask, computed
        if self.store is None and key_mask is not None and key_mask.shape[1] != n_q:  # [B, T] -> the computed slots
            key_mask = key_mask.gather(1, computed.expand(b, -1))
        if self.store is not None:
            k, v = self.store.update(layer, self.slots, k, v)  # [B of the store, Hk, T, hd]
            key_slots = torch.arange(k.shape[2], device=k.device)[None]
        visible = None if key_mask is None else key_mask[:, None, None, :]
        if self.block_length is not None:
            offset = (computed - self.positions)[:, -1].expand(b)  # the last computed slot is always a real token
            blk = block_visible(q_pos, key_slots, offset, self.block_length)
            visible = blk if visible is None else visible & blk
        if self.key_run is not None:  # one run of slots shared by every row
            k, v = k[:, :, self.key_run], v[:, :, self.key_run]
            visible = None if visible is None else visible[..., self.key_run]
        if self.store is not None and self.store.rows is not None:
            q = self.store.spread(q)
            visible = None if visible is None else self.store.spread(visible, True)
        return k, v, visible, q

    def own(self, out: torch.Tensor) -> torch.Tensor:
        return out if self.store is None else self.store.own_rows(out)


class LLaDA2MoeModel(nn.Module):
    def __init__(self, cfg: LLaDA2MoeConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LLaDA2Layer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LLaDA2MoeModelLM(DiffusionLMMixin, PreTrainedModel):
    """LLaDA2.x with the official parameter names; ``forward`` returns the official (unshifted) logits."""

    config_class = LLaDA2MoeConfig
    base_model_prefix = "model"
    _no_split_modules = ["LLaDA2Layer"]
    logit_shift = 0
    block_causal = True  # decoded block by block on the absolute grid (``decode`` reads it)

    def __init__(self, config: LLaDA2MoeConfig) -> None:
        super().__init__(config)
        config.check_supported()
        self.model = LLaDA2MoeModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.word_embeddings

    def _init_weights(self, module: nn.Module) -> None:
        """The mixin's init, plus the router: normal(0.02) weights and a zero selection bias."""
        super()._init_weights(module)
        if isinstance(module, Router):
            nn.init.normal_(module.weight, std=0.02)
            nn.init.zeros_(module.expert_bias)

    @property
    def mask_token_id(self) -> int:
        mid = self.config.mask_token_id
        return REFERENCE_MASK_ID if mid is None else int(mid)

    @property
    def eos_token_ids(self) -> list[int]:
        ids = self.config.eos_token_id
        if ids is None:  # the reference default, where the vocabulary has it (else no EOS: ``no_eos_notice``)
            return usable_ids(REFERENCE_EOS_ID, self.config.vocab_size)
        return sorted(set([ids] if isinstance(ids, int) else ids))

    def adopt_tokenizer_ids(self, tokenizer: Any | None) -> None:
        """Fill the mask / EOS ids config.json leaves out from the tokenizer (the second place in the order)."""
        adopt_tokenizer_ids(self.config, tokenizer)

    @property
    def max_sequence_length(self) -> int:
        return int(self.config.max_position_embeddings)

    def kv_shape(self) -> tuple[int, int, int]:
        c = self.config
        return c.num_hidden_layers, c.num_key_value_heads, c.head_dim

    def hidden_states(
        self,
        input_ids,
        positions,
        *,
        kv=None,
        slots=None,
        key_mask=None,
        key_index=None,
        rows=None,
        block_length=None,
    ):
        c = self.config
        h = self.model.word_embeddings(input_ids)
        cos, sin = rope_tables(positions, int(c.head_dim * c.partial_rotary_factor), c.rope_theta, h.dtype)
        keys = KeyView(kv, slots, key_mask, key_index, positions, block_length)
        last = len(self.model.layers) - 1
        for i, layer in enumerate(self.model.layers):
            h = layer(h, cos, sin, i, keys, rows if i == last else None)
        return self.model.norm(h)

    def output_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        block_length: int | None = None,
        **_: object,
    ) -> MaskedLMOutput:
        """Official logits. ``attention_mask``: the reference's 4D mask [B, 1, T, T] (additive: 0 / -inf, or
        bool), or a 2D key mask [B, T]; ``block_length``: the block-causal mask built here instead."""
        b, t = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(t, device=input_ids.device).expand(b, t)
        if attention_mask is not None and attention_mask.dim() == 4:
            return MaskedLMOutput(logits=self._forward_4d(input_ids, position_ids, attention_mask))
        key_mask = None if attention_mask is None else attention_mask.bool()
        hid = self.hidden_states(input_ids, position_ids, key_mask=key_mask, block_length=block_length)
        return MaskedLMOutput(logits=self.output_logits(hid))

    def _forward_4d(self, input_ids, positions, mask4d):
        visible = mask4d if mask4d.dtype == torch.bool else mask4d > float("-inf")
        return self.output_logits(self.hidden_states_4d(input_ids, positions, visible))

    def hidden_states_4d(self, input_ids, positions, visible):  # visible [B, 1, Q, Q] bool -> [B, Q, d] normed
        """Hidden states under an arbitrary attention pattern (the reference's 4D mask; the block-causal ELBO's
        clean-plus-noisy canvas, ``eval.likelihood``)."""
        c = self.config
        h = self.model.word_embeddings(input_ids)
        cos, sin = rope_tables(positions, int(c.head_dim * c.partial_rotary_factor), c.rope_theta, h.dtype)
        for layer in self.model.layers:
            q, k, v = layer.attention.qkv(layer.input_layernorm(h), cos, sin)
            h = h + layer.attention.dense(attention(q, k, v, visible))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.model.norm(h)


def adopt_tokenizer_ids(config: LLaDA2MoeConfig, tokenizer: Any | None) -> None:
    """config.json first, then the tokenizer's ``mask_token_id`` / ``eos_token_id`` (the reference defaults apply
    last, in ``LLaDA2MoeModelLM.mask_token_id`` / ``eos_token_ids``)."""
    if tokenizer is None:
        return
    if config.mask_token_id is None and isinstance(getattr(tokenizer, "mask_token_id", None), int):
        config.mask_token_id = tokenizer.mask_token_id
    if config.eos_token_id is None and isinstance(getattr(tokenizer, "eos_token_id", None), int):
        config.eos_token_id = tokenizer.eos_token_id
