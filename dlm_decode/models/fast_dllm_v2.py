"""Native Fast-dLLM v2 (Wu et al. 2025, "Fast-dLLM v2: Efficient Block-Diffusion LLM"; Efficient-Large-Model/
Fast_dLLM_v2_7B and _1.5B, ``model_type`` "Fast_dLLM_Qwen"), a block-causal diffusion LM on Qwen2.5 layers that
loads the official checkpoints.

Config keys and parameter names are the published ones (Qwen2's: ``model.embed_tokens``, ``model.layers.{i}.
self_attn.{q,k,v,o}_proj`` with biases on q / k / v only, ``...mlp.{gate,up,down}_proj``, ``model.norm``,
``lm_head``; plus ``bd_size``, the training block), so ``AutoModel.from_pretrained`` on an official directory returns
this class without remote code once ``dlm_decode`` is imported.

Reference: the hub's ``modeling.py`` (``Fast_dLLM_QwenForCausalLM``) at inference: pre-RMSNorm Qwen2 layers, HF
default RoPE over the whole head at the absolute positions, GQA, scale ``head_dim ** -0.5``, no qk-norm, SwiGLU MLP;
attention through its ``eval_mask``: a query at absolute position i sees key j iff ``i // B >= j // B`` (block-causal
on the grid from position 0, bidirectional inside a block). ``forward`` returns the reference's unshifted logits;
decoding applies its shift (``logit_shift = 1``: slot i is predicted by hidden state i - 1, the reference's
``cat([l[:, :1], l[:, :-1]])``), so a block's first slot is predicted by the previous block's last hidden state, which
does not see the block: it is fixed once the previous block is (``samplers/fast_dllm_v2.py``).

The block-causal machinery (the visibility rule on the absolute grid, the K/V bookkeeping, RoPE) is SDAR's and
LLaDA2's (``models/sdar.py``, ``models/llada2.py``); only the attention projections differ. The MASK id is config.json's
``mask_token_id`` when present, else the tokenizer's mask token, else the reference's default 151665 (the published
config.json has none); EOS is config.json's ``eos_token_id`` (151645, the reference's ``stop_token``, on the official
checkpoints). Sliding-window keys are read but, as in the reference's eval path, never applied.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from dlm_decode.models.common import RMSNorm
from dlm_decode.models.llada2 import partial_rope
from dlm_decode.models.moe import SwiGLU
from dlm_decode.models.schema import ConfigSchema, Key, below, divides, flag, positive_int, positive_number, token_id
from dlm_decode.models.sdar import SDARConfig, SDARForCausalLM, SDARLayer

#: the reference's ``mask_id`` default (``batch_sample`` / ``generate``), used when neither config.json nor the
#: tokenizer names a MASK id
REFERENCE_MASK_ID = 151665

#: the config.json keys this implementation reads (checked before any weight, ``models/schema.py``; official values:
#: Fast_dLLM_v2_7B)
FAST_DLLM_V2_SCHEMA = ConfigSchema(
    "Fast_dLLM_Qwen",
    {
        "hidden_size": positive_int(required=True, official=3584),
        "num_hidden_layers": positive_int(required=True, official=28),
        "num_attention_heads": positive_int(required=True, official=28),
        "vocab_size": positive_int(required=True, official=152064),
        "intermediate_size": positive_int(required=True, official=18944),
        "num_key_value_heads": positive_int(nullable=True),
        "bd_size": positive_int(),
        "hidden_act": Key("str", choices=("silu",)),
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


class FastDLLMV2Config(SDARConfig):
    """The official config keys and the reference configuration class's defaults (``Fast_dLLM_QwenConfig``, Qwen2's
    plus ``bd_size``). ``head_dim`` is always ``hidden_size // num_attention_heads`` (Qwen2 has no such key)."""

    model_type = "Fast_dLLM_Qwen"
    config_schema = FAST_DLLM_V2_SCHEMA

    def __init__(
        self,
        vocab_size: int = 151936,
        hidden_size: int = 4096,
        intermediate_size: int = 22016,
        num_hidden_layers: int = 32,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = 32,
        bd_size: int = 32,
        rope_theta: float = 10000.0,
        **kwargs: Any,
    ) -> None:
        kwargs.pop("head_dim", None)
        kwargs.pop("attention_bias", None)
        self.bd_size = bd_size
        super().__init__(
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            intermediate_size=intermediate_size,
            num_hidden_layers=num_hidden_layers,
            num_attention_heads=num_attention_heads,
            num_key_value_heads=num_key_value_heads,
            head_dim=hidden_size // num_attention_heads,
            rope_theta=rope_theta,
            **kwargs,
        )

    def check_supported(self) -> None:
        super().check_supported()
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"unsupported Fast_dLLM_Qwen config: hidden_size={self.hidden_size} must be a multiple of "
                f"num_attention_heads={self.num_attention_heads}"
            )


class FastDLLMV2Attention(nn.Module):
    """Qwen2's: ``q_proj``, ``k_proj``, ``v_proj`` with biases, ``o_proj`` without; no qk-norm."""

    def __init__(self, cfg: FastDLLMV2Config) -> None:
        super().__init__()
        h, kv, hd, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size
        self.q_proj = nn.Linear(d, h * hd, bias=True)
        self.k_proj = nn.Linear(d, kv * hd, bias=True)
        self.v_proj = nn.Linear(d, kv * hd, bias=True)
        self.o_proj = nn.Linear(h * hd, d, bias=False)
        self.shape = (h, kv, hd)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x [B, Q, d] -> q [B, H, Q, hd], k and v [B, Hk, Q, hd]: q and k rotated."""
        h, kv, hd = self.shape
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, h, hd).transpose(1, 2)
        k = self.k_proj(x).view(b, n, kv, hd).transpose(1, 2)
        v = self.v_proj(x).view(b, n, kv, hd).transpose(1, 2)
        return partial_rope(q, cos, sin), partial_rope(k, cos, sin), v


class FastDLLMV2Layer(SDARLayer):
    """Official names: ``input_layernorm``, ``self_attn``, ``post_attention_layernorm``, ``mlp``; SDAR's forward."""

    def __init__(self, cfg: FastDLLMV2Config) -> None:
        nn.Module.__init__(self)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = FastDLLMV2Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)


class FastDLLMV2Model(nn.Module):
    def __init__(self, cfg: FastDLLMV2Config) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(FastDLLMV2Layer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class FastDLLMV2ForCausalLM(SDARForCausalLM):
    """Fast-dLLM v2 with the official parameter names; ``forward`` returns the reference's unshifted logits under
    its block-causal mask (``block_length`` defaults to config.json's ``bd_size``); decoding reads them shifted."""

    config_class = FastDLLMV2Config
    _no_split_modules = ["FastDLLMV2Layer"]
    logit_shift = 1
    block_causal = True

    def __init__(self, config: FastDLLMV2Config) -> None:
        super(SDARForCausalLM, self).__init__(config)
        config.check_supported()
        self.model = FastDLLMV2Model(config)
        self.tied = bool(config.tie_word_embeddings)
        if not self.tied:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    @property
    def mask_token_id(self) -> int:
        mid = self.config.mask_token_id
        if mid is None:
            if REFERENCE_MASK_ID >= self.config.vocab_size:
                raise ValueError(
                    "Fast_dLLM_Qwen: no mask_token_id in config.json or the tokenizer, and the reference's default "
                    f"{REFERENCE_MASK_ID} is outside vocab_size={self.config.vocab_size}; set mask_token_id"
                )
            return REFERENCE_MASK_ID
        return int(mid)

    def forward(self, input_ids: torch.Tensor, attention_mask=None, position_ids=None, block_length=None, **kw):
        """Official (unshifted) logits; with no 4D mask, the reference's ``eval_mask`` on ``block_length`` (default:
        ``bd_size``). See ``SDARForCausalLM.forward``."""
        if block_length is None and (attention_mask is None or attention_mask.dim() != 4):
            block_length = int(self.config.bd_size)
        return super().forward(input_ids, attention_mask, position_ids, block_length, **kw)
