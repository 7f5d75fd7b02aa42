"""Native SDAR and TraDo (JetLM/SDAR-1.7B / 4B / 8B-Chat and their b8..b64 variants, Gen-Verse/TraDo-4B / 8B;
``model_type`` "sdar"), a block-causal diffusion LM on Qwen3 layers that loads the official checkpoints.

Config keys and parameter names are the published ones (``model.embed_tokens``, ``model.layers.{i}.self_attn.
{q,k,v,o}_proj``, ``...self_attn.{q,k}_norm``, ``...mlp.{gate,up,down}_proj``, ``model.norm``, ``lm_head``; the
configuration and modeling files published with the checkpoints, copied in Gen-Verse/dLLM-RL ``models/sdar/``), so
``AutoModel.from_pretrained`` on an official directory returns this class without remote code once ``dlm_decode`` is
imported. TraDo is the same architecture and format (RL-trained SDAR); only the weights differ.

Reference: ``SDARForCausalLM.forward``: pre-RMSNorm Qwen3 layers; separate q / k / v projections (bias with
``attention_bias``), RMSNorm per head on q and k before RoPE, HF default RoPE over the whole head (fp32 tables cast to
the model dtype, rotation in the model dtype), GQA, scale ``head_dim ** -0.5``; SwiGLU MLP; unshifted logits
(``logits[i]`` predicts slot i); ``tie_word_embeddings`` shares the embedding table as the LM head (as Qwen3's 1.7B
and 4B bases do). The reference takes its block-causal mask from the caller (``generate.py``
passes ``tril(ones(nb, nb))`` repeated B times, 1 = visible); ``forward`` here takes that 4D mask or
``block_length``, and ``denoise`` the decode loop's block (the visibility rule and the key bookkeeping are LLaDA2's,
``models/llada2.py``: the same absolute grid).

The MASK id is ``mask_token_id`` of config.json (151669 on the official checkpoints), else the tokenizer's mask
token (what ``generate.py`` falls back to); EOS is config.json's ``eos_token_id``. Sliding-window keys are read but,
as in the reference's attention, never applied. ``sdar_moe`` (SDAR-30B-A3B) is this model with Qwen3-MoE
feed-forwards: ``models/sdar_moe.py``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import MaskedLMOutput

from dlm_decode.models.common import DiffusionLMMixin, RMSNorm, take_rows
from dlm_decode.models.llada2 import KeyView, adopt_tokenizer_ids, attention, partial_rope, rope_tables
from dlm_decode.models.moe import SwiGLU
from dlm_decode.models.schema import (
    ConfigSchema,
    Key,
    below,
    divides,
    flag,
    positive_int,
    positive_number,
    token_id,
)

#: the config.json keys this implementation reads (checked before any weight, ``models/schema.py``; official values:
#: SDAR-1.7B-Chat)
SDAR_SCHEMA = ConfigSchema(
    "SDAR",
    {
        "hidden_size": positive_int(required=True, official=2048),
        "num_hidden_layers": positive_int(required=True, official=28),
        "num_attention_heads": positive_int(required=True, official=16),
        "vocab_size": positive_int(required=True, official=151936),
        "intermediate_size": positive_int(required=True, official=6144),
        "num_key_value_heads": positive_int(nullable=True),
        "head_dim": positive_int(),  # absent: 128 (the reference class's default); null fails in the reference
        "hidden_act": Key("str", choices=("silu",)),
        "attention_bias": flag(),
        "tie_word_embeddings": flag(),
        "rms_norm_eps": positive_number(),
        "rope_theta": positive_number(),
        "rope_scaling": Key("object", nullable=True),
        "max_position_embeddings": positive_int(),
        "use_sliding_window": flag(),
        "sliding_window": positive_int(nullable=True),
        "mask_token_id": token_id(nullable=True),
        "pad_token_id": token_id(nullable=True),
        "bos_token_id": token_id(nullable=True),
        "eos_token_id": Key("ids", low=0, nullable=True),
    },
    rules=(divides("num_attention_heads", "num_key_value_heads"), below("mask_token_id", "vocab_size")),
)


class SDARConfig(PretrainedConfig):
    """The official config keys and the reference configuration class's defaults (``SDARConfig``)."""

    model_type = "sdar"
    config_schema = SDAR_SCHEMA

    def __init__(
        self,
        vocab_size: int = 151936,
        hidden_size: int = 4096,
        intermediate_size: int = 22016,
        num_hidden_layers: int = 32,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = 32,
        head_dim: int | None = 128,
        hidden_act: str = "silu",
        max_position_embeddings: int = 32768,
        rms_norm_eps: float = 1e-6,
        tie_word_embeddings: bool = False,
        rope_theta: float = 10000.0,
        rope_scaling: dict | None = None,
        attention_bias: bool = False,
        use_sliding_window: bool = False,
        sliding_window: int | None = 4096,
        mask_token_id: int | None = None,
        eos_token_id: int | list[int] | None = None,
        **kwargs: Any,
    ) -> None:
        self.vocab_size, self.hidden_size, self.intermediate_size = vocab_size, hidden_size, intermediate_size
        self.num_hidden_layers, self.num_attention_heads = num_hidden_layers, num_attention_heads
        self.num_key_value_heads = num_attention_heads if num_key_value_heads is None else num_key_value_heads
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.hidden_act, self.max_position_embeddings = hidden_act, max_position_embeddings
        self.rms_norm_eps, self.rope_theta, self.attention_bias = rms_norm_eps, rope_theta, attention_bias
        if rope_scaling is not None:
            kwargs["rope_scaling"] = rope_scaling
        self.use_sliding_window, self.sliding_window = use_sliding_window, sliding_window
        self.mask_token_id = mask_token_id
        super().__init__(eos_token_id=eos_token_id, tie_word_embeddings=tie_word_embeddings, **kwargs)

    def check_supported(self) -> None:
        """Raise ValueError, naming the key, for values this implementation (and the reference) does not cover."""
        bad = []
        if self.hidden_act != "silu":
            bad.append(f"hidden_act={self.hidden_act!r} (supported: 'silu')")
        scaling = getattr(self, "rope_scaling", None) or getattr(self, "rope_parameters", None) or {}
        if scaling.get("rope_type", scaling.get("type", "default")) != "default":
            bad.append(f"rope_scaling={scaling!r} (supported: null / default rope)")
        if self.num_attention_heads % self.num_key_value_heads:
            bad.append(
                f"num_key_value_heads={self.num_key_value_heads} (must divide "
                f"num_attention_heads={self.num_attention_heads})"
            )
        if self.head_dim % 2:
            bad.append(f"head_dim={self.head_dim} (RoPE needs an even head dim)")
        if bad:
            raise ValueError("unsupported sdar config: " + ", ".join(bad))


class SDARAttention(nn.Module):
    """Official names: ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``, ``q_norm``, ``k_norm``."""

    def __init__(self, cfg: SDARConfig) -> None:
        super().__init__()
        h, kv, hd, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(d, h * hd, bias=bias)
        self.k_proj = nn.Linear(d, kv * hd, bias=bias)
        self.v_proj = nn.Linear(d, kv * hd, bias=bias)
        self.o_proj = nn.Linear(h * hd, d, bias=bias)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.shape = (h, kv, hd)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x [B, Q, d] -> q [B, H, Q, hd], k and v [B, Hk, Q, hd]: q and k normed per head, then rotated."""
        h, kv, hd = self.shape
        b, n, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, n, h, hd)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, n, kv, hd)).transpose(1, 2)
        v = self.v_proj(x).view(b, n, kv, hd).transpose(1, 2)
        return partial_rope(q, cos, sin), partial_rope(k, cos, sin), v


class SDARLayer(nn.Module):
    """Official names: ``input_layernorm``, ``self_attn``, ``post_attention_layernorm``, ``mlp`` (``mlp``: the dense
    SwiGLU, or the feed-forward the model gives, ``sdar_moe``'s experts)."""

    def __init__(self, cfg: SDARConfig, mlp: nn.Module | None = None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = SDARAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size) if mlp is None else mlp

    def forward(self, h, cos, sin, layer, keys, rows=None):  # h [B, Q, d] -> [B, Q or N, d]
        """``keys``: a ``llada2.KeyView`` (the store, the slots written, the visibility); ``rows``: the query rows
        whose output is wanted (K/V still come from every row)."""
        q, k, v = self.self_attn.qkv(self.input_layernorm(h), cos, sin)
        q = take_rows(q, rows, 2)
        k, v, visible, q = keys.resolve(layer, k, v, q, rows)
        h = take_rows(h, rows) + self.self_attn.o_proj(keys.own(attention(q, k, v, visible)))
        return h + self.mlp(self.post_attention_layernorm(h))


class SDARModel(nn.Module):
    def __init__(self, cfg: SDARConfig, mlps: list[nn.Module | None]) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(SDARLayer(cfg, mlp) for mlp in mlps)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class SDARForCausalLM(DiffusionLMMixin, PreTrainedModel):
    """SDAR / TraDo with the official parameter names; ``forward`` returns the official (unshifted) logits. With
    ``tie_word_embeddings`` there is no ``lm_head`` parameter (the checkpoints store none): the logits use the
    embedding table."""

    config_class = SDARConfig
    base_model_prefix = "model"
    _no_split_modules = ["SDARLayer"]
    logit_shift = 0
    block_causal = True  # decoded block by block on the absolute grid (``decode`` reads it)

    def __init__(self, config: SDARConfig) -> None:
        super().__init__(config)
        config.check_supported()
        self.model = SDARModel(config, [self.layer_mlp(config, i) for i in range(config.num_hidden_layers)])
        self.tied = bool(config.tie_word_embeddings)
        if not self.tied:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def layer_mlp(self, config: SDARConfig, index: int) -> nn.Module | None:
        """Layer ``index``'s feed-forward; None: the dense SwiGLU (``sdar_moe`` overrides it)."""
        return None

    def tie_weights(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to tie: a tied head reads the embedding table directly (``output_logits``)."""

    def adopt_tokenizer_ids(self, tokenizer: Any | None) -> None:
        """A MASK / EOS id config.json leaves out comes from the tokenizer (``generate.py`` reads the mask token
        there); called by ``loading.load_model`` and ``model_facts``."""
        adopt_tokenizer_ids(self.config, tokenizer)

    @property
    def max_sequence_length(self) -> int:
        return int(self.config.max_position_embeddings)

    def kv_shape(self) -> tuple[int, int, int]:
        c = self.config
        return c.num_hidden_layers, c.num_key_value_heads, c.head_dim

    def _embed(self, input_ids: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        c = self.config
        h = self.model.embed_tokens(input_ids)
        return (h, *rope_tables(positions, c.head_dim, c.rope_theta, h.dtype))

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
        h, cos, sin = self._embed(input_ids, positions)
        keys = KeyView(kv, slots, key_mask, key_index, positions, block_length)
        last = len(self.model.layers) - 1
        for i, layer in enumerate(self.model.layers):
            h = layer(h, cos, sin, i, keys, rows if i == last else None)
        return self.model.norm(h)

    def hidden_states_4d(self, input_ids, positions, visible):  # visible [B, 1, Q, Q] bool -> [B, Q, d] normed
        """Hidden states under an arbitrary attention pattern (the reference's 4D mask)."""
        h, cos, sin = self._embed(input_ids, positions)
        for layer in self.model.layers:
            q, k, v = layer.self_attn.qkv(layer.input_layernorm(h), cos, sin)
            h = h + layer.self_attn.o_proj(attention(q, k, v, visible))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.model.norm(h)

    def output_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.tied:
            return nn.functional.linear(hidden, self.model.embed_tokens.weight)
        return self.lm_head(hidden)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        block_length: int | None = None,
        **_: object,
    ) -> MaskedLMOutput:
        """Official logits. ``attention_mask``: the reference's 4D mask [B, 1, T, T] (``generate.py``'s 1 = visible,
        0 = hidden; or bool), or a 2D key mask [B, T]; ``block_length``: the block-causal mask built here instead."""
        b, t = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(t, device=input_ids.device).expand(b, t)
        if attention_mask is not None and attention_mask.dim() == 4:
            visible = attention_mask if attention_mask.dtype == torch.bool else attention_mask > 0
            return MaskedLMOutput(logits=self.output_logits(self.hidden_states_4d(input_ids, position_ids, visible)))
        key_mask = None if attention_mask is None else attention_mask.bool()
        hid = self.hidden_states(input_ids, position_ids, key_mask=key_mask, block_length=block_length)
        return MaskedLMOutput(logits=self.output_logits(hid))
