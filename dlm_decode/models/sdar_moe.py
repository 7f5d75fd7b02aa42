"""Native SDAR-MoE (JetLM/SDAR-30B-A3B-Chat, -Sci; ``model_type`` "sdar_moe"): the SDAR model (``models/sdar.py``:
Qwen3 attention with qk-norm, block-causal on the absolute grid) with Qwen3-MoE feed-forwards.

Parameter names are Qwen3-MoE's, as the checkpoints store them: ``model.layers.{i}.mlp.gate.weight`` (the router,
[E, d], no bias) and ``model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight``; the attention, norms, embedding
and head are SDAR's. Reference: the Qwen3-MoE sparse block as the SDAR-MoE runtimes run it (JetEngine's
``SDARMoeSparseMoeBlock``, SGLang's ``models/sdar_moe.py``): router logits in the model dtype, softmax over the
experts in fp32, the top ``num_experts_per_tok`` experts, their weights renormalised to sum 1 when
``norm_topk_prob``, no shared experts; a layer is sparse when ``num_experts > 0``, ``(i + 1) % decoder_sparse_step ==
0`` and i is not in ``mlp_only_layers`` (Qwen3-MoE's rule; SGLang's runtime makes every layer sparse), else the
dense SwiGLU of width ``intermediate_size``.

The experts run through ``moe.SparseMoE``'s two paths (looped in the reference's order on a CPU and in float32,
grouped for bf16 on CUDA), with this router in place of LLaDA2's. The HF modeling file published with these
checkpoints was not available here: the tests check the routing against a re-statement of the rule above.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from dlm_decode.models.moe import SparseMoE
from dlm_decode.models.schema import ConfigSchema, Key, Rule, flag, positive_int
from dlm_decode.models.sdar import SDAR_SCHEMA, SDARConfig, SDARForCausalLM

#: SDAR's keys (``intermediate_size`` only for dense layers) plus the Qwen3-MoE ones (official: SDAR-30B-A3B-Chat)
SDAR_MOE_SCHEMA = ConfigSchema(
    "SDAR-MoE",
    {
        **SDAR_SCHEMA.keys,
        "intermediate_size": positive_int(nullable=True),
        "num_experts": positive_int(required=True, official=128),
        "num_experts_per_tok": positive_int(required=True, official=8),
        "moe_intermediate_size": positive_int(required=True, official=768),
        "norm_topk_prob": flag(required=True, official=True),
        "decoder_sparse_step": positive_int(),
        "mlp_only_layers": Key("ids", low=0, nullable=True),
    },
    rules=(
        *SDAR_SCHEMA.rules,
        Rule(
            ("num_experts_per_tok", "num_experts"),
            lambda k, e: k <= e,
            "num_experts_per_tok ({num_experts_per_tok}) must be <= num_experts ({num_experts})",
        ),
    ),
)


class SDARMoeConfig(SDARConfig):
    """SDAR's keys plus Qwen3-MoE's, with ``Qwen3MoeConfig``'s defaults for the MoE ones."""

    model_type = "sdar_moe"
    config_schema = SDAR_MOE_SCHEMA

    def __init__(
        self,
        num_experts: int = 128,
        num_experts_per_tok: int = 8,
        moe_intermediate_size: int = 768,
        norm_topk_prob: bool = False,
        decoder_sparse_step: int = 1,
        mlp_only_layers: list[int] | None = None,
        **kwargs: Any,
    ) -> None:
        self.num_experts, self.num_experts_per_tok = num_experts, num_experts_per_tok
        self.moe_intermediate_size, self.norm_topk_prob = moe_intermediate_size, norm_topk_prob
        self.decoder_sparse_step = decoder_sparse_step
        self.mlp_only_layers = [] if mlp_only_layers is None else list(mlp_only_layers)
        super().__init__(**kwargs)

    def sparse(self, index: int) -> bool:
        """Qwen3-MoE's rule: is layer ``index`` a mixture of experts (else the dense SwiGLU)."""
        step = self.decoder_sparse_step
        return index not in self.mlp_only_layers and self.num_experts > 0 and (index + 1) % step == 0

    def check_supported(self) -> None:
        super().check_supported()
        dense = [i for i in range(self.num_hidden_layers) if not self.sparse(i)]
        if dense and not self.intermediate_size:
            raise ValueError(
                f"unsupported sdar_moe config: intermediate_size={self.intermediate_size!r} (the dense layers "
                f"{dense[:3]} need a width)"
            )


class SoftmaxRouter(nn.Module):
    """Qwen3-MoE's router (official name ``gate``, one ``weight`` [E, d]): softmax over the experts in fp32, top-k,
    renormalised when ``normalize``."""

    def __init__(self, hidden: int, n_experts: int, top_k: int, normalize: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_experts, hidden))
        self.top_k, self.normalize = top_k, normalize

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # x [N, d] -> ids, weights [N, k]
        probs = torch.softmax(nn.functional.linear(x, self.weight), dim=-1, dtype=torch.float32)  # [N, E]
        w, ids = probs.topk(self.top_k, dim=-1)
        if self.normalize:
            w = w / w.sum(-1, keepdim=True)
        return ids, w.to(x.dtype)


class SoftmaxMoE(SparseMoE):
    """``SparseMoE``'s experts (and its looped / grouped paths) under the softmax router, no shared experts."""

    def __init__(self, cfg: SDARMoeConfig) -> None:
        d, e, k = cfg.hidden_size, cfg.num_experts, cfg.num_experts_per_tok
        shape = SimpleNamespace(  # SparseMoE's experts; its LLaDA2 router is replaced below
            hidden_size=d, moe_intermediate_size=cfg.moe_intermediate_size, num_experts=e, num_experts_per_tok=k
        )
        shape.n_group, shape.topk_group, shape.routed_scaling_factor, shape.num_shared_experts = 1, 1, 1.0, None
        super().__init__(shape)
        self.gate = SoftmaxRouter(d, e, k, cfg.norm_topk_prob)


class SDARMoeForCausalLM(SDARForCausalLM):
    """SDAR-MoE with the official parameter names; every decoding surface is SDAR's."""

    config_class = SDARMoeConfig

    def layer_mlp(self, config: SDARMoeConfig, index: int) -> nn.Module | None:
        return SoftmaxMoE(config) if config.sparse(index) else None

    def _init_weights(self, module: nn.Module) -> None:
        """The mixin's init, plus the router: normal(0.02)."""
        super()._init_weights(module)
        if isinstance(module, SoftmaxRouter):
            nn.init.normal_(module.weight, std=0.02)
