"""Native LLaDA-MoE (inclusionAI/LLaDA-MoE-7B-A1B-Base / -Instruct / -Instruct-TD; Zhu et al., "LLaDA-MoE: A Sparse
MoE Diffusion Language Model", 2025), a bidirectional mixture-of-experts diffusion LM that loads the official
checkpoints.

Reference: ``LLaDAMoEModelLM`` of the hub modeling file, copied in ZHZisZZ/dllm
``dllm/pipelines/llada/models/modeling_lladamoe.py`` (an OLMoE decoder with the causal mask removed). Its
``config.json`` says ``model_type: llada``, as the dense LLaDA's does: ``architectures: ["LLaDAMoEModelLM"]`` tells
them apart (``llada.LLaDAConfig.from_dict`` hands such a config to ``LLaDAMoEConfig``; a config saved by dllm's
class, ``model_type: lladamoe``, loads too). Config keys and parameter names are the published ones
(``model.embed_tokens``, ``model.layers.{i}.self_attn.{q,k,v,o}_proj``, ``...self_attn.{q,k}_norm``,
``...mlp.gate``, ``...mlp.experts.{e}.{gate,up,down}_proj``, ``...shared_expert``, ``model.norm``, ``lm_head``).

The forward, as the reference's: pre-RMSNorm layers; q / k / v projections (bias: ``attention_bias``), with
``qk_layernorm`` an RMSNorm per head on q and k before RoPE; HF RoPE (fp32 tables cast to the model dtype, rotation
in the model dtype) on the first ``head_dim * partial_rotary_factor`` dims; GQA; full bidirectional attention with an
optional key-padding mask; MLP: a SwiGLU (``dense_intermediate_size``) where ``moe_layer_freq[i]`` is 0, else the
sparse block: router logits ``gate(x)`` in the model dtype, softmax in fp32, plus ``expert_bias`` when
``moe_router_enable_expert_bias``; the top ``num_experts_per_tok`` of those *biased* probabilities are both the
choice and the weights (never renormalised: the reference hard-codes ``norm_topk_prob = False``), cast to the model
dtype; the output is the weighted sum of the chosen experts, plus ``shared_expert(x)`` of the same normed input when
``shared_expert_intermediate_size`` is set. Unshifted logits (``logits[i]`` predicts slot i), as LLaDA.

Keys the reference reads but ignores are ignored here too (``norm_topk_prob``, ``routed_scaling_factor``,
``moe_router_score_function``, ``router_num_group``, ``router_topk_group``): their values do not change the
reference's logits, so they do not change ours. Values the reference cannot run, or that it would run to another
model than the keys say, are refused before any weight is read (``clip_qkv`` other than null, tied embeddings, RoPE
scaling, a ``moe_layer_freq`` shorter than the layers).

Differences, on purpose: in bf16 the routed experts' weighted sum accumulates in fp32 (the reference: in the model
dtype), as for LLaDA2 (``moe.SparseMoE``); in fp32 the logits are the reference's.

MASK id: ``mask_token_id`` of config.json when present (the official one has none); else the tokenizer's id of
``<|mask|>`` (the reference sets ``tokenizer.mask_token = "<|mask|>"`` for this family: 156895 in the official
vocabulary); else the tokenizer's own ``mask_token_id``; else a ValueError naming config.json and the tokenizer,
raised by ``models.loading`` before any weight is read.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import MaskedLMOutput

from dlm_decode.models.common import (
    EAGER,
    DiffusionLMMixin,
    RMSNorm,
    attend,
    end_ids,
    forward_visibility,
    layer_forward,
    layer_output,
    pairwise_mask,
    query_rows,
    rope_cos_sin,
)
from dlm_decode.models.depth import run_program
from dlm_decode.models.llada import LLADA_VARIANTS
from dlm_decode.models.moe import SparseMoE, SwiGLU
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

ARCHITECTURE = "LLaDAMoEModelLM"
MASK_TOKEN = "<|mask|>"  # what the reference makes the tokenizer's mask token for LLaDA-MoE (dllm utils/models.py)
ROLE_END = "<|role_end|>"  # the end of an Instruct turn (the reference's eot_token)

#: the config.json keys this implementation reads (checked before any weight, ``models/schema.py``; official values:
#: LLaDA-MoE-7B-A1B). Keys the reference's configuration class defaults to -1 are required.
LLADA_MOE_SCHEMA = ConfigSchema(
    "LLaDA-MoE",
    {
        "vocab_size": positive_int(required=True, official=157184),
        "hidden_size": positive_int(required=True, official=2048),
        "num_hidden_layers": positive_int(required=True, official=16),
        "num_attention_heads": positive_int(required=True, official=16),
        "num_key_value_heads": positive_int(nullable=True),
        "dense_intermediate_size": Key("int", nullable=True),
        "expert_intermediate_size": positive_int(required=True, official=1024),
        "shared_expert_intermediate_size": positive_int(required=True, nullable=True, official="null"),
        "num_experts": positive_int(required=True, official=64),
        "num_experts_per_tok": positive_int(required=True, official=8),
        "moe_layer_freq": Key("int_list", required=True, low=0, official="[1] * 16"),
        "moe_router_enable_expert_bias": flag(nullable=True),
        "qk_layernorm": flag(nullable=True),
        "attention_bias": flag(),
        "clip_qkv": Key("number", nullable=True, choices=(None,)),
        "hidden_act": Key("str", choices=("silu",)),
        "max_position_embeddings": positive_int(),
        "rms_norm_eps": positive_number(),
        "rope_theta": positive_number(required=True, official=50000),
        "partial_rotary_factor": Key("number", required=True, low=0, above=True, high=1, official=1.0),
        "rope_scaling": Key("object", nullable=True),
        "tie_word_embeddings": flag(choices=(False,)),
        "mask_token_id": token_id(nullable=True),
        "pad_token_id": token_id(nullable=True),
        "bos_token_id": token_id(nullable=True),
        "eos_token_id": Key("ids", low=0, nullable=True),
    },
    rules=(
        divides("hidden_size", "num_attention_heads"),
        divides("num_attention_heads", "num_key_value_heads"),
        Rule(
            ("num_experts_per_tok", "num_experts"),
            lambda k, e: k <= e,
            "num_experts_per_tok ({num_experts_per_tok}) must be <= num_experts ({num_experts})",
        ),
        Rule(
            ("hidden_size", "num_attention_heads", "partial_rotary_factor"),
            lambda d, h, f: int(d // h * f) > 0 and int(d // h * f) % 2 == 0,
            "the rotary width head_dim * partial_rotary_factor ({hidden_size} / {num_attention_heads} * "
            "{partial_rotary_factor}) must be a positive even number (rotary embeddings rotate pairs)",
        ),
        below("mask_token_id", "vocab_size"),
    ),
)


class LLaDAMoEConfig(PretrainedConfig):
    """The official config keys with the reference configuration class's defaults (its -1 placeholders are required
    keys here). Registered as ``lladamoe`` (dllm's name); written back to config.json as ``llada``, the hub's."""

    model_type = "lladamoe"
    config_schema = LLADA_MOE_SCHEMA

    def __init__(
        self,
        vocab_size: int = 157184,
        hidden_size: int = 2048,
        dense_intermediate_size: int | None = None,
        expert_intermediate_size: int = 1024,
        shared_expert_intermediate_size: int | None = None,
        num_hidden_layers: int = 16,
        num_attention_heads: int = 16,
        num_key_value_heads: int | None = None,
        hidden_act: str = "silu",
        max_position_embeddings: int = 4096,
        rms_norm_eps: float = 1e-05,
        tie_word_embeddings: bool = False,
        rope_theta: float = 50000.0,
        partial_rotary_factor: float = 1.0,
        rope_scaling: dict | None = None,
        attention_bias: bool = False,
        clip_qkv: float | None = None,
        num_experts_per_tok: int = 8,
        num_experts: int = 64,
        qk_layernorm: bool | None = None,
        moe_layer_freq: list[int] | None = None,
        moe_router_enable_expert_bias: bool | None = None,
        mask_token_id: int | None = None,
        pad_token_id: int | None = 1,
        bos_token_id: int | None = None,
        eos_token_id: int | list[int] | None = 50279,
        **kwargs: Any,
    ) -> None:
        self.vocab_size, self.hidden_size = vocab_size, hidden_size
        self.dense_intermediate_size, self.expert_intermediate_size = dense_intermediate_size, expert_intermediate_size
        self.shared_expert_intermediate_size = shared_expert_intermediate_size
        self.num_hidden_layers, self.num_attention_heads = num_hidden_layers, num_attention_heads
        self.num_key_value_heads = num_attention_heads if num_key_value_heads is None else num_key_value_heads
        self.hidden_act, self.max_position_embeddings = hidden_act, max_position_embeddings
        self.rms_norm_eps, self.rope_theta, self.partial_rotary_factor = rms_norm_eps, rope_theta, partial_rotary_factor
        if rope_scaling is not None:
            kwargs["rope_scaling"] = rope_scaling
        self.attention_bias, self.clip_qkv, self.qk_layernorm = attention_bias, clip_qkv, qk_layernorm
        self.num_experts_per_tok, self.num_experts = num_experts_per_tok, num_experts
        self.moe_layer_freq = [1] * num_hidden_layers if moe_layer_freq is None else list(moe_layer_freq)
        self.moe_router_enable_expert_bias = moe_router_enable_expert_bias
        self.mask_token_id = mask_token_id
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["model_type"] = "llada"  # the hub's config.json; ``architectures`` tells it from the dense LLaDA
        if not out.get("architectures"):  # without it the file would read as the dense LLaDA's
            out["architectures"] = [ARCHITECTURE]
        return out

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def rotary_dim(self) -> int:
        """HF default RoPE: ``int(head_dim * partial_rotary_factor)`` dims rotate."""
        return int(self.head_dim * self.partial_rotary_factor)

    def check_supported(self) -> None:
        """Raise ValueError, naming the key, for values the reference cannot run or runs to another model."""
        bad = []
        if self.hidden_act != "silu":
            bad.append(f"hidden_act={self.hidden_act!r} (supported: 'silu')")
        if self.clip_qkv is not None:
            bad.append(f"clip_qkv={self.clip_qkv!r} (supported: null)")
        if self.tie_word_embeddings:
            bad.append("tie_word_embeddings=True (supported: false)")
        scaling = getattr(self, "rope_scaling", None) or getattr(self, "rope_parameters", None) or {}
        if scaling.get("rope_type", scaling.get("type", "default")) != "default":
            bad.append(f"rope_scaling={scaling!r} (supported: null / default rope)")
        n = self.num_hidden_layers
        if len(self.moe_layer_freq) < n:
            bad.append(f"moe_layer_freq has {len(self.moe_layer_freq)} entries (one per layer: {n})")
        elif any(f == 0 for f in self.moe_layer_freq[:n]) and not (self.dense_intermediate_size or 0) > 0:
            bad.append(
                f"dense_intermediate_size={self.dense_intermediate_size!r} (moe_layer_freq has dense layers (0): "
                "they need a positive width)"
            )
        if bad:
            raise ValueError("unsupported LLaDA-MoE config: " + ", ".join(bad))


class LLaDAMoESparseBlock(SparseMoE):
    """The reference's ``LLaDAMoESparseMoeBlock`` (official names ``gate``, ``experts.{e}``, the buffer
    ``expert_bias``): its softmax router, ``moe.SparseMoE``'s expert paths (looped in the reference's order on a
    CPU and in fp32; grouped for bf16 on CUDA). The shared expert sits beside it in the layer, as in the reference."""

    def __init__(self, cfg: LLaDAMoEConfig) -> None:
        nn.Module.__init__(self)  # ``SparseMoE``'s fields, built from this family's keys
        d, n = cfg.hidden_size, cfg.num_experts
        self.experts = nn.ModuleList(SwiGLU(d, cfg.expert_intermediate_size) for _ in range(n))
        self.gate = nn.Linear(d, n, bias=False)
        if cfg.moe_router_enable_expert_bias:
            self.register_buffer("expert_bias", torch.zeros(n))
        else:
            self.expert_bias = None
        self.top_k = cfg.num_experts_per_tok
        self.shared_experts = None
        self.grouped: bool | None = None
        self._packed: tuple[torch.Tensor, ...] | None = None
        self._ids: torch.Tensor | None = None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # x [N, d] -> ids, weights [N, k]
        probs = nn.functional.softmax(self.gate(x), dim=1, dtype=torch.float32)  # [N, E]
        if self.expert_bias is not None:
            probs = probs + self.expert_bias
        w, ids = torch.topk(probs, self.top_k, dim=-1)
        return ids, w.to(x.dtype)


class LLaDAMoEAttention(nn.Module):
    """Official names: ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``, and with ``qk_layernorm`` ``q_norm``,
    ``k_norm`` (RMSNorm over one head's dims)."""

    def __init__(self, cfg: LLaDAMoEConfig) -> None:
        super().__init__()
        d, h, hk, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(d, h * hd, bias=bias)
        self.k_proj = nn.Linear(d, hk * hd, bias=bias)
        self.v_proj = nn.Linear(d, hk * hd, bias=bias)
        self.o_proj = nn.Linear(h * hd, d, bias=bias)
        if cfg.qk_layernorm:
            self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.shape = (h, hk, hd)


class LLaDAMoELayer(nn.Module):
    """Official names: ``input_layernorm``, ``self_attn``, ``post_attention_layernorm``, ``mlp``, ``shared_expert``.
    The ``common.Layer`` interface, with ``norm_heads`` for the qk-norm."""

    def __init__(self, cfg: LLaDAMoEConfig, index: int) -> None:
        super().__init__()
        d = cfg.hidden_size
        self.input_layernorm = RMSNorm(d, cfg.rms_norm_eps)
        self.self_attn = LLaDAMoEAttention(cfg)
        self.post_attention_layernorm = RMSNorm(d, cfg.rms_norm_eps)
        moe = cfg.moe_layer_freq[index] != 0
        self.mlp = LLaDAMoESparseBlock(cfg) if moe else SwiGLU(d, cfg.dense_intermediate_size)
        if moe and cfg.shared_expert_intermediate_size is not None:
            self.shared_expert = SwiGLU(d, cfg.shared_expert_intermediate_size)
        self.shape = self.self_attn.shape
        self.rope_fp32 = False  # HF RoPE: fp32 tables cast to the model dtype, rotation in the model dtype
        self.qk_norm = bool(cfg.qk_layernorm)

    def norm_heads(self, x: torch.Tensor, which: str) -> torch.Tensor:  # [B, H, Q, hd], before RoPE
        if not self.qk_norm:
            return x
        a = self.self_attn
        return a.q_norm(x) if which == "q" else a.k_norm(x)

    def norm_attention(self, h: torch.Tensor) -> torch.Tensor:
        return self.input_layernorm(h)

    def projections(self) -> tuple[nn.Linear, nn.Linear, nn.Linear, nn.Linear]:
        a = self.self_attn
        return a.q_proj, a.k_proj, a.v_proj, a.o_proj

    def norm_mlp(self, h: torch.Tensor) -> torch.Tensor:
        return self.post_attention_layernorm(h)

    def feed_forward(self, m: torch.Tensor) -> torch.Tensor:
        out = self.mlp(m)
        if hasattr(self, "shared_expert"):
            out = out + self.shared_expert(m)
        return out

    def forward(self, h, cos, sin, layer, kv, slots, key_mask, key_index, rows=None, pieces=EAGER, visible=None):
        """h [B, Q, d] -> [B, Q, d], or [B, N, d] for the query ``rows`` only (``common.take_rows``; K/V from every
        row); ``visible``: a per-query mask [B, 1, Q, S] in place of ``key_mask``. ``common.layer_forward``, except
        that a sparse layer's output piece always runs eagerly: its routed experts count their tokens on the host
        (``moe.SparseMoE._looped``), which no compiled graph can hold."""
        if not isinstance(self.mlp, LLaDAMoESparseBlock):
            return layer_forward(self, h, cos, sin, layer, kv, slots, key_mask, key_index, rows, pieces, visible)
        q, k, v = pieces.input(self, h, cos, sin, rows)
        attn = attend(q, k, v, layer, kv, slots, key_mask, key_index, query_rows(visible, rows))
        return layer_output(self, attn, h, rows)


class LLaDAMoEModel(nn.Module):
    def __init__(self, cfg: LLaDAMoEConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LLaDAMoELayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LLaDAMoEModelLM(DiffusionLMMixin, PreTrainedModel):
    """LLaDA-MoE with the official parameter names; ``forward`` returns the official (unshifted) logits."""

    config_class = LLaDAMoEConfig
    base_model_prefix = "model"
    _no_split_modules = ["LLaDAMoELayer"]
    logit_shift = 0

    def __init__(self, config: LLaDAMoEConfig) -> None:
        super().__init__(config)
        config.check_supported()
        self.model = LLaDAMoEModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, LLaDAMoESparseBlock) and module.expert_bias is not None:
            nn.init.zeros_(module.expert_bias)

    @property
    def mask_token_id(self) -> int:
        mid = self.config.mask_token_id
        if mid is None:
            where = getattr(self.config, "_name_or_path", "") or "the checkpoint"
            raise ValueError(
                f"{where}: LLaDA-MoE has no MASK id: config.json has no mask_token_id and no tokenizer beside it "
                f"has the token {MASK_TOKEN!r} or a mask_token (the official tokenizer has {MASK_TOKEN!r} = 156895); "
                "ship the tokenizer files or set mask_token_id in config.json"
            )
        return int(mid)

    def adopt_tokenizer_ids(self, tokenizer: Any | None) -> None:
        """config.json's ``mask_token_id`` first, then the tokenizer's ``<|mask|>``, then its ``mask_token_id``;
        ``<|role_end|>`` (the end of an Instruct turn, the reference's ``eot_token``) ends an answer as EOS does."""
        end_ids(self.config, tokenizer, ROLE_END)
        if self.config.mask_token_id is not None or tokenizer is None:
            return
        vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
        mid = vocab.get(MASK_TOKEN, getattr(tokenizer, "mask_token_id", None))
        if isinstance(mid, int):
            self.config.mask_token_id = mid

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
        layers=None,
        answer_blocks=None,
        visible=None,
    ):
        c = self.config
        h = self.model.embed_tokens(input_ids)
        pieces = self.layer_pieces
        shape = tuple(input_ids.shape)
        mask = forward_visibility(answer_blocks, visible, layers, shape, slots, kv, key_mask, key_index, h.device)
        if layers is not None:  # Elastic-Cache's depth-aware loop (``depth.DepthProgram``)
            rope = partial(rope_cos_sin, head_dim=c.rotary_dim, theta=c.rope_theta)
            return self.model.norm(run_program(layers, self.model.layers, h, rope, kv, slots, key_mask, rows, pieces))
        cos, sin = rope_cos_sin(positions, c.rotary_dim, c.rope_theta)
        last = len(self.model.layers) - 1
        for i, layer in enumerate(self.model.layers):
            h = layer(h, cos, sin, i, kv, slots, key_mask, key_index, rows if i == last else None, pieces, mask)
        return self.model.norm(h)

    def output_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        **_: object,
    ) -> MaskedLMOutput:
        """Official semantics: ``attention_mask`` None (full attention) or a [B, T] key-padding mask; also a 4D mask
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


LLADA_VARIANTS[ARCHITECTURE] = LLaDAMoEConfig
