"""Native LLaDA (GSAI-ML/LLaDA-8B-Base / -Instruct / LLaDA-1.5) that loads the official checkpoints.

Config keys and parameter names are those of the published ``config.json`` / safetensors (``model.transformer.*``),
so ``AutoModel.from_pretrained`` on an official directory returns this class without remote code once
``dlm_decode`` is imported. ``forward`` reproduces the official ``LLaDAModelLM.forward`` (the hub file with the
key-padding bias, absolute positions 0..T-1). Decoding goes through ``denoise`` (``DiffusionLMMixin``), which takes
explicit positions, a subset of query slots and an external K/V store.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import MaskedLMOutput

from dlm_decode.models.common import (
    EAGER,
    DiffusionLMMixin,
    RMSNorm,
    forward_visibility,
    layer_forward,
    pairwise_mask,
    rope_cos_sin,
)
from dlm_decode.models.depth import run_program
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

#: the config.json keys this implementation reads (checked before any weight, ``models/schema.py``); ``choices`` are
#: the published options it covers
LLADA_SCHEMA = ConfigSchema(
    "LLaDA",
    {
        "d_model": positive_int(required=True, official=4096),
        "n_layers": positive_int(required=True, official=32),
        "n_heads": positive_int(required=True, official=32),
        "n_kv_heads": positive_int(nullable=True),
        "mlp_hidden_size": positive_int(nullable=True),
        "mlp_ratio": positive_int(),
        "vocab_size": positive_int(required=True, official=126464),
        "embedding_size": positive_int(nullable=True),
        "max_sequence_length": positive_int(),
        "rope": flag(choices=(True,)),
        "rope_theta": positive_number(),
        "rope_full_precision": flag(),
        "block_type": Key("str", choices=("llama",)),
        "layer_norm_type": Key("str", choices=("rms",)),
        "rms_norm_eps": positive_number(),
        "layer_norm_with_affine": flag(),
        "bias_for_layer_norm": flag(choices=(False,)),
        "include_bias": flag(choices=(False,)),
        "include_qkv_bias": flag(),
        "activation_type": Key("str", choices=("silu",)),
        "weight_tying": flag(),
        "scale_logits": flag(choices=(False,)),
        "input_emb_norm": flag(choices=(False,)),
        "attention_layer_norm": flag(choices=(False,)),
        "alibi": flag(choices=(False,)),
        "flash_attention": flag(),
        "mask_token_id": token_id(required=True, official=126336),
        "eos_token_id": Key("ids", low=0, nullable=True),
        "pad_token_id": token_id(nullable=True),
    },
    rules=(
        divides("d_model", "n_heads"),
        divides("n_heads", "n_kv_heads"),
        Rule(
            ("d_model", "n_heads"),
            lambda d, h: d // h % 2 == 0,
            "the head size d_model / n_heads ({d_model} / {n_heads}) must be even (rotary embeddings rotate pairs)",
        ),
        Rule(
            ("vocab_size", "embedding_size"),
            lambda v, e: v <= e,
            "vocab_size ({vocab_size}) must be <= embedding_size ({embedding_size})",
        ),
        below("mask_token_id", "vocab_size"),
    ),
)


#: config.json ``architectures`` that share ``model_type: llada`` with the dense model but are another one -> their
#: config class (filled by their modules: ``llada_moe``)
LLADA_VARIANTS: dict[str, type[PretrainedConfig]] = {}


def llada_variant(config: dict) -> type[PretrainedConfig] | None:
    """The config class a ``model_type: llada`` config.json names by its ``architectures``, or None (dense LLaDA)."""
    archs = config.get("architectures")
    return next((LLADA_VARIANTS[a] for a in archs if a in LLADA_VARIANTS), None) if isinstance(archs, list) else None


class LLaDAConfig(PretrainedConfig):
    model_type = "llada"
    config_schema = LLADA_SCHEMA

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs):
        """A LLaDA-MoE config.json (also ``model_type: llada``) becomes its own config class, so that
        ``AutoConfig`` / ``AutoModel.from_pretrained`` build that model."""
        variant = llada_variant(config_dict) if cls is LLaDAConfig else None
        if variant is not None:
            return variant.from_dict(config_dict, **kwargs)
        return super().from_dict(config_dict, **kwargs)

    def __init__(
        self,
        d_model: int = 4096,
        n_layers: int = 32,
        n_heads: int = 32,
        n_kv_heads: int | None = None,
        mlp_hidden_size: int | None = 12288,
        mlp_ratio: int = 4,
        vocab_size: int = 126464,
        embedding_size: int | None = 126464,
        max_sequence_length: int = 4096,
        rope: bool = True,
        rope_theta: float = 500000.0,
        rope_full_precision: bool = True,
        block_type: str = "llama",
        layer_norm_type: str = "rms",
        rms_norm_eps: float = 1e-5,
        layer_norm_with_affine: bool = True,
        bias_for_layer_norm: bool = False,
        include_bias: bool = False,
        include_qkv_bias: bool = False,
        activation_type: str = "silu",
        weight_tying: bool = False,
        scale_logits: bool = False,
        input_emb_norm: bool = False,
        attention_layer_norm: bool = False,
        alibi: bool = False,
        flash_attention: bool = False,
        mask_token_id: int = 126336,
        eos_token_id: int = 126081,
        pad_token_id: int = 126081,
        **kwargs,
    ) -> None:
        self.d_model, self.n_layers, self.n_heads = d_model, n_layers, n_heads
        self.n_kv_heads = n_kv_heads if n_kv_heads is not None else n_heads
        self.mlp_hidden_size, self.mlp_ratio = mlp_hidden_size, mlp_ratio
        self.vocab_size, self.embedding_size = vocab_size, embedding_size
        self.max_sequence_length = max_sequence_length
        self.rope, self.rope_theta, self.rope_full_precision = rope, rope_theta, rope_full_precision
        self.block_type, self.layer_norm_type, self.rms_norm_eps = block_type, layer_norm_type, rms_norm_eps
        self.layer_norm_with_affine, self.bias_for_layer_norm = layer_norm_with_affine, bias_for_layer_norm
        self.include_bias, self.include_qkv_bias = include_bias, include_qkv_bias
        self.activation_type, self.weight_tying, self.scale_logits = (
            activation_type,
            weight_tying,
            scale_logits,
        )
        self.input_emb_norm, self.attention_layer_norm = input_emb_norm, attention_layer_norm
        self.alibi, self.flash_attention = alibi, flash_attention
        self.mask_token_id = mask_token_id
        super().__init__(eos_token_id=eos_token_id, pad_token_id=pad_token_id, **kwargs)

    def check_supported(self) -> None:
        """Raise ValueError for the published options this implementation does not cover (the schema's choices)."""
        wrong = [
            f"{k}={getattr(self, k)!r} (supported: {', '.join(map(repr, key.choices))})"
            for k, key in LLADA_SCHEMA.keys.items()
            if key.choices is not None and getattr(self, k) not in key.choices
        ]
        if wrong:
            raise ValueError("unsupported LLaDA config options: " + ", ".join(wrong))


class LLaDABlock(nn.Module):
    """LLaDA's ``LLaDALlamaBlock``, checkpoint parameter names kept (q_proj, attn_out, ff_proj, up_proj, ff_out)."""

    def __init__(self, cfg: LLaDAConfig) -> None:
        super().__init__()
        d, hd = cfg.d_model, cfg.d_model // cfg.n_heads
        mlp = cfg.mlp_hidden_size or cfg.mlp_ratio * d
        qkv_bias = cfg.include_qkv_bias
        self.attn_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.ff_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.q_proj = nn.Linear(d, d, bias=qkv_bias)
        self.k_proj = nn.Linear(d, cfg.n_kv_heads * hd, bias=qkv_bias)
        self.v_proj = nn.Linear(d, cfg.n_kv_heads * hd, bias=qkv_bias)
        self.attn_out = nn.Linear(d, d, bias=False)
        self.ff_proj = nn.Linear(d, mlp, bias=False)
        self.up_proj = nn.Linear(d, mlp, bias=False)
        self.ff_out = nn.Linear(mlp, d, bias=False)
        self.shape = (cfg.n_heads, cfg.n_kv_heads, hd)
        self.rope_fp32 = cfg.rope_full_precision

    # the ``common.Layer`` interface
    def norm_attention(self, h: torch.Tensor) -> torch.Tensor:
        return self.attn_norm(h)

    def projections(self) -> tuple[nn.Linear, nn.Linear, nn.Linear, nn.Linear]:
        return self.q_proj, self.k_proj, self.v_proj, self.attn_out

    def norm_mlp(self, h: torch.Tensor) -> torch.Tensor:
        return self.ff_norm(h)

    def feed_forward(self, m: torch.Tensor) -> torch.Tensor:
        return self.ff_out(nn.functional.silu(self.ff_proj(m)) * self.up_proj(m))

    def forward(self, h, cos, sin, layer, kv, slots, key_mask, key_index, rows=None, pieces=EAGER, visible=None):
        """h [B, Q, d] -> [B, Q, d], or [B, N, d] for the query ``rows`` only (``common.take_rows``; K/V from every
        row); ``visible``: a per-query mask [B, 1, Q, S] in place of ``key_mask`` (``common.forward_visibility``)."""
        return layer_forward(self, h, cos, sin, layer, kv, slots, key_mask, key_index, rows, pieces, visible)


class LLaDAModel(nn.Module):
    def __init__(self, cfg: LLaDAConfig) -> None:
        super().__init__()
        emb = cfg.embedding_size or cfg.vocab_size
        modules = {
            "wte": nn.Embedding(emb, cfg.d_model),
            "blocks": nn.ModuleList(LLaDABlock(cfg) for _ in range(cfg.n_layers)),
            "ln_f": RMSNorm(cfg.d_model, cfg.rms_norm_eps),
        }
        if not cfg.weight_tying:
            modules["ff_out"] = nn.Linear(cfg.d_model, emb, bias=False)
        self.transformer = nn.ModuleDict(modules)


class LLaDAModelLM(DiffusionLMMixin, PreTrainedModel):
    """LLaDA with the official parameter names; ``forward`` returns the official (unshifted) logits."""

    config_class = LLaDAConfig
    base_model_prefix = "model"
    _no_split_modules = ["LLaDABlock"]
    logit_shift = 0

    def __init__(self, config: LLaDAConfig) -> None:
        super().__init__(config)
        config.check_supported()
        self.model = LLaDAModel(config)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.transformer.wte

    @property
    def max_sequence_length(self) -> int:
        return int(self.config.max_sequence_length)

    def kv_shape(self) -> tuple[int, int, int]:
        c = self.config
        return c.n_layers, c.n_kv_heads, c.d_model // c.n_heads

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
        layers=None,
        answer_blocks=None,
        visible=None,
    ):
        t = self.model.transformer
        hd = self.config.d_model // self.config.n_heads
        h = t.wte(input_ids)
        pieces = self.layer_pieces
        shape = tuple(input_ids.shape)
        mask = forward_visibility(answer_blocks, visible, layers, shape, slots, kv, key_mask, key_index, h.device)
        if layers is not None:  # Elastic-Cache's depth-aware loop (``depth.DepthProgram``)
            rope = partial(rope_cos_sin, head_dim=hd, theta=self.config.rope_theta)
            return t.ln_f(run_program(layers, t.blocks, h, rope, kv, slots, key_mask, rows, pieces))
        cos, sin = rope_cos_sin(positions, hd, self.config.rope_theta)
        last = len(t.blocks) - 1
        for i, block in enumerate(t.blocks):
            h = block(h, cos, sin, i, kv, slots, key_mask, key_index, rows if i == last else None, pieces, mask)
        return t.ln_f(h)

    def output_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        t = self.model.transformer
        if self.config.weight_tying:
            return nn.functional.linear(hidden, t.wte.weight)
        return t.ff_out(hidden)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        **_: object,
    ) -> MaskedLMOutput:
        """Official logits. ``attention_mask``: None (full attention), a [B, T] key-padding mask, or a 4D mask
        [B or 1, 1, T, T] (additive 0 / -inf, or bool; D2F's block mask, ``visibility``)."""
        b, t = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(t, device=input_ids.device).expand(b, t)
        if attention_mask is not None and attention_mask.dim() == 4:
            hid = self.hidden_states(input_ids, position_ids, visible=pairwise_mask(attention_mask, b, t))
            return MaskedLMOutput(logits=self.output_logits(hid))
        key_mask = None if attention_mask is None else attention_mask.bool()
        hid = self.hidden_states(input_ids, position_ids, key_mask=key_mask)
        return MaskedLMOutput(logits=self.output_logits(hid))
