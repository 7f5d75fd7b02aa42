"""Native Dream (Dream-org/Dream-v0-Base-7B / -Instruct-7B; Qwen2.5 layout) that loads the official checkpoints.

Parameter names follow the published safetensors (``model.layers.{i}.self_attn.q_proj`` ...). ``forward`` returns
the official *unshifted* logits (hidden i scores token i+1), taking either a 2D key mask or the official 4D
pairwise mask. Decoding goes through ``denoise``, which applies Dream's shift (``logit_shift = 1``) so that
samplers always see ``logits[i]`` predicting slot ``i``. RoPE follows HF Qwen2: fp32 tables cast to the model
dtype, rotation in the model dtype.

``sampling_defaults`` is what the official ``diffusion_generate`` samples with when its caller leaves an option
unset. Its ``_prepare_generation_config`` builds ``DreamGenerationConfig.from_model_config(model.config)``: the
model's *config.json* (never ``generation_config.json``), read by transformers 4.x (which the reference needs), whose
``PretrainedConfig`` fills every absent generation key with its global default (``top_k`` 50, ``top_p`` 1.0,
``temperature`` 1.0); keys whose value is null are dropped, leaving ``DreamGenerationConfig``'s own defaults
(``top_k``/``top_p``/``alg_temp`` None, ``eps`` 1e-3). So an official checkpoint decodes with top-k 50 unless the
caller says otherwise. transformers 5 drops those keys from a config, so ``DreamConfig`` keeps them itself.
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
    end_ids,
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

DLM_PAD = "<|dlm_pad|>"  # DiffuCoder's answer padding


#: config.json keys the reference ``diffusion_generate`` takes as sampling defaults (``DreamGenerationConfig`` fields)
REFERENCE_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "alg_temp", "eps")
#: what a transformers 4.x ``PretrainedConfig`` holds for those keys when config.json leaves them out
TRANSFORMERS4_CONFIG_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": 50}

#: the config.json keys this implementation reads (checked before any weight, ``models/schema.py``)
DREAM_SCHEMA = ConfigSchema(
    "Dream",
    {
        "hidden_size": positive_int(required=True, official=3584),
        "intermediate_size": positive_int(required=True, official=18944),
        "num_hidden_layers": positive_int(required=True, official=28),
        "num_attention_heads": positive_int(required=True, official=28),
        "num_key_value_heads": positive_int(nullable=True),
        "hidden_act": Key("str", choices=("silu",)),
        "max_position_embeddings": positive_int(),
        "rms_norm_eps": positive_number(),
        "rope_theta": positive_number(),
        "rope_scaling": Key("object", nullable=True),
        "tie_word_embeddings": flag(),
        "vocab_size": positive_int(required=True, official=152064),
        "mask_token_id": token_id(required=True, official=151666),
        "pad_token_id": token_id(nullable=True),
        "bos_token_id": token_id(nullable=True),
        "eos_token_id": Key("ids", low=0, nullable=True),
        "attention_dropout": Key("number", low=0, high=1),
        # the reference sampling defaults (module docstring); their ranges are the samplers' to check
        "temperature": Key("number", low=0, nullable=True),
        "top_p": Key("number", nullable=True),
        "top_k": Key("int", nullable=True),
        "alg_temp": Key("number", nullable=True),
        "eps": Key("number", nullable=True),
    },
    rules=(
        divides("hidden_size", "num_attention_heads"),
        divides("num_attention_heads", "num_key_value_heads"),
        Rule(
            ("hidden_size", "num_attention_heads"),
            lambda d, h: d // h % 2 == 0,
            "the head size hidden_size / num_attention_heads ({hidden_size} / {num_attention_heads}) must be even "
            "(rotary embeddings rotate pairs)",
        ),
        below("mask_token_id", "vocab_size"),
    ),
)


class DreamConfig(PretrainedConfig):
    model_type = "Dream"
    config_schema = DREAM_SCHEMA

    def __init__(
        self,
        vocab_size: int = 152064,
        hidden_size: int = 3584,
        intermediate_size: int = 18944,
        num_hidden_layers: int = 28,
        num_attention_heads: int = 28,
        num_key_value_heads: int = 4,
        hidden_act: str = "silu",
        max_position_embeddings: int = 131072,
        rms_norm_eps: float = 1e-6,
        rope_theta: float = 1000000.0,
        rope_scaling: dict | None = None,
        tie_word_embeddings: bool = False,
        mask_token_id: int = 151666,
        pad_token_id: int = 151643,
        bos_token_id: int = 151643,
        eos_token_id: int = 151643,
        attention_dropout: float = 0.0,
        **kwargs,
    ) -> None:
        self.vocab_size, self.hidden_size, self.intermediate_size = vocab_size, hidden_size, intermediate_size
        self.num_hidden_layers, self.num_attention_heads = num_hidden_layers, num_attention_heads
        self.num_key_value_heads = num_key_value_heads if num_key_value_heads is not None else num_attention_heads
        self.hidden_act, self.max_position_embeddings = hidden_act, max_position_embeddings
        self.rms_norm_eps, self.rope_theta = rms_norm_eps, rope_theta
        if rope_scaling is not None:
            kwargs["rope_scaling"] = rope_scaling
        self.mask_token_id, self.attention_dropout = mask_token_id, attention_dropout
        # as written in config.json (transformers 5 would drop them); ``to_dict`` writes them back unchanged
        self.reference_sampling = {k: kwargs.pop(k) for k in REFERENCE_SAMPLING_KEYS if k in kwargs}
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out.update(out.pop("reference_sampling", None) or {})  # back under their own config.json names
        return out

    def sampling_defaults(self) -> dict[str, Any]:
        """The options ``diffusion_generate`` fills in for a caller that leaves them unset (see the module
        docstring): ``top_k``, ``top_p`` and, where config.json sets them, ``alg_temp`` and ``eps``; None means the
        reference's own default (no filter; the sampler's ``eps``). ``temperature`` is left out on purpose:
        dlm_decode's temperature is never unset (default 0, greedy), while the reference's would be 1.0 here."""
        given = TRANSFORMERS4_CONFIG_DEFAULTS | self.reference_sampling
        return {k: v for k, v in given.items() if k != "temperature"}

    def check_supported(self) -> None:
        wrong = []
        if self.hidden_act not in DREAM_SCHEMA.keys["hidden_act"].choices:
            wrong.append(f"hidden_act={self.hidden_act!r} (supported: 'silu')")
        scaling = getattr(self, "rope_scaling", None) or getattr(self, "rope_parameters", None) or {}
        if scaling.get("rope_type", scaling.get("type", "default")) != "default":
            wrong.append(f"rope_scaling={scaling!r} (supported: null / default rope)")
        if wrong:
            raise ValueError("unsupported Dream config options: " + ", ".join(wrong))


class DreamAttention(nn.Module):
    def __init__(self, cfg: DreamConfig) -> None:
        super().__init__()
        d, h, hk = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads
        hd = d // h
        self.q_proj = nn.Linear(d, h * hd, bias=True)
        self.k_proj = nn.Linear(d, hk * hd, bias=True)
        self.v_proj = nn.Linear(d, hk * hd, bias=True)
        self.o_proj = nn.Linear(h * hd, d, bias=False)
        self.shape = (h, hk, hd)


class DreamMLP(nn.Module):
    def __init__(self, cfg: DreamConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class DreamLayer(nn.Module):
    def __init__(self, cfg: DreamConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DreamAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = DreamMLP(cfg)
        self.shape = self.self_attn.shape
        self.rope_fp32 = False  # HF Qwen2: fp32 tables cast to the model dtype, rotation in the model dtype

    # the ``common.Layer`` interface
    def norm_attention(self, h: torch.Tensor) -> torch.Tensor:
        return self.input_layernorm(h)

    def projections(self) -> tuple[nn.Linear, nn.Linear, nn.Linear, nn.Linear]:
        a = self.self_attn
        return a.q_proj, a.k_proj, a.v_proj, a.o_proj

    def norm_mlp(self, h: torch.Tensor) -> torch.Tensor:
        return self.post_attention_layernorm(h)

    def feed_forward(self, m: torch.Tensor) -> torch.Tensor:
        return self.mlp(m)

    def forward(self, h, cos, sin, layer, kv, slots, key_mask, key_index, rows=None, pieces=EAGER, visible=None):
        """h [B, Q, d] -> [B, Q, d], or [B, N, d] for the query ``rows`` only (``common.take_rows``; K/V from every
        row); ``visible``: a per-query mask [B, 1, Q, S] in place of ``key_mask`` (``common.forward_visibility``)."""
        return layer_forward(self, h, cos, sin, layer, kv, slots, key_mask, key_index, rows, pieces, visible)


class DreamBaseModel(nn.Module):
    def __init__(self, cfg: DreamConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DreamLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class DreamModel(DiffusionLMMixin, PreTrainedModel):
    """Dream with the official parameter names; ``forward`` returns the official unshifted logits."""

    config_class = DreamConfig
    base_model_prefix = "model"
    _no_split_modules = ["DreamLayer"]
    logit_shift = 1

    def __init__(self, config: DreamConfig) -> None:
        super().__init__(config)
        config.check_supported()
        self.model = DreamBaseModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    @property
    def max_sequence_length(self) -> int:
        return int(self.config.max_position_embeddings)

    @property
    def sampling_defaults(self) -> dict[str, Any]:
        return self.config.sampling_defaults()

    def adopt_tokenizer_ids(self, tokenizer: Any | None) -> None:
        """DiffuCoder (Dream's format) fills an answer's tail with ``<|dlm_pad|>``, and its README cuts the text at
        the first one: where its tokenizer has that token, it ends an answer as EOS does (``eos_token_ids``)."""
        end_ids(self.config, tokenizer, DLM_PAD)

    def kv_shape(self) -> tuple[int, int, int]:
        c = self.config
        return c.num_hidden_layers, c.num_key_value_heads, c.hidden_size // c.num_attention_heads

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
        hd = c.hidden_size // c.num_attention_heads
        h = self.model.embed_tokens(input_ids)
        pieces = self.layer_pieces
        shape = tuple(input_ids.shape)
        mask = forward_visibility(answer_blocks, visible, layers, shape, slots, kv, key_mask, key_index, h.device)
        if layers is not None:  # Elastic-Cache's depth-aware loop (``depth.DepthProgram``)
            rope = partial(rope_cos_sin, head_dim=hd, theta=c.rope_theta)
            return self.model.norm(run_program(layers, self.model.layers, h, rope, kv, slots, key_mask, rows, pieces))
        cos, sin = rope_cos_sin(positions, hd, c.rope_theta)
        last = len(self.model.layers) - 1
        for i, layer in enumerate(self.model.layers):
            h = layer(h, cos, sin, i, kv, slots, key_mask, key_index, rows if i == last else None, pieces, mask)
        return self.model.norm(h)

    def output_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | str | None = None,
        position_ids: torch.Tensor | None = None,
        **_: object,
    ) -> MaskedLMOutput:
        """Official semantics: ``attention_mask`` None/"full", a [B, T] key mask, or a 4D mask [B or 1, 1, T, T] (bool,
        as the official pairwise m_i & m_j, or additive 0 / -inf, as D2F's block mask), applied per query. A query
        that sees no key (a padded row of the pairwise mask, never read) gets a zero attention output, not NaN."""
        b, t = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(t, device=input_ids.device).expand(b, t)
        if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 4:
            hid = self.hidden_states(input_ids, position_ids, visible=pairwise_mask(attention_mask, b, t))
            return MaskedLMOutput(logits=self.lm_head(hid))
        key_mask = attention_mask.bool() if isinstance(attention_mask, torch.Tensor) else None
        hid = self.hidden_states(input_ids, position_ids, key_mask=key_mask)
        return MaskedLMOutput(logits=self.lm_head(hid))
