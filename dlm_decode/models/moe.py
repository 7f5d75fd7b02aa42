"""The mixture-of-experts feed-forward of LLaDA2.0 / LLaDA2.1 (``llada2_moe``; inclusionAI, "LLaDA2.0: Scaling Up
Diffusion Language Models to 100B", 2025), with the official parameter names.

Reference: ``LLaDA2MoeGate`` / ``LLaDA2MoeSparseMoeBlock`` of the HF modeling file (copied in ZHZisZZ/dllm
``dllm/pipelines/llada2/models/modeling_llada2_moe.py``). The router runs in fp32: scores = sigmoid(x W^T); experts are
*selected* on scores + ``expert_bias`` (a saved buffer) with group-limited top-k (a group scores the sum of its two
best biased scores; the ``topk_group`` best groups stay, then the top ``num_experts_per_tok`` experts among them);
the selected experts are *weighted* by their unbiased scores, divided by their sum (+1e-20) when more than one is
selected, times ``routed_scaling_factor``. The output is the weighted sum of the selected experts plus the shared
experts (one SwiGLU of width ``moe_intermediate_size * num_shared_experts``).

Two ways to run the routed experts, the same sums: ``_looped`` (the reference's order, expert after expert, one host
sync a layer; the default on a CPU and in float32, where logits equal the reference's) and ``_grouped`` (the default
for bf16 on CUDA): the routed pairs sorted by expert, group ends found on the device, three grouped matrix products
over the experts' weights stacked once (each expert's parameter becomes a view of its stack). No host sync and fixed
shapes for a fixed token count, so a CUDA graph can record a step; the products round differently from per-expert
ones (1e-5 relative in float32), which is why the CPU keeps the looped order.

Differences, on purpose: none in the arithmetic. The reference ignores ``norm_topk_prob`` (it always normalises when
top-k > 1) and so do we; the config check refuses the values the reference would silently mis-model
(``models/llada2.py``).
"""

from __future__ import annotations

import torch
from torch import nn


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))`` (official names ``gate_proj``, ``up_proj``, ``down_proj``)."""

    def __init__(self, hidden: int, inner: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class Router(nn.Module):
    """The sigmoid router with its selection bias (official names ``weight`` and the buffer ``expert_bias``)."""

    def __init__(self, hidden: int, n_experts: int, top_k: int, n_group: int, topk_group: int, scale: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_experts, hidden))
        self.register_buffer("expert_bias", torch.zeros(n_experts))
        self.top_k, self.n_group, self.topk_group, self.scale = top_k, n_group, topk_group, scale

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # x [N, d] -> ids, weights [N, k]
        scores = torch.sigmoid(nn.functional.linear(x.float(), self.weight.float()))  # [N, E] fp32
        biased = scores + self.expert_bias.float()
        n, e = biased.shape
        groups = biased.view(n, self.n_group, e // self.n_group).topk(2, dim=-1).values.sum(-1)  # [N, G]
        keep = torch.zeros_like(groups).scatter_(1, groups.topk(self.topk_group, dim=-1, sorted=False).indices, 1.0)
        allowed = keep.bool()[..., None].expand(n, self.n_group, e // self.n_group).reshape(n, e)
        ids = biased.masked_fill(~allowed, float("-inf")).topk(self.top_k, dim=-1).indices  # [N, k]
        w = scores.gather(1, ids)
        if self.top_k > 1:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        return ids, w * self.scale


class SparseMoE(nn.Module):
    """Routed experts plus shared experts (official names ``gate``, ``experts.{e}``, ``shared_experts``)."""

    def __init__(self, cfg) -> None:  # a ``LLaDA2MoeConfig``
        super().__init__()
        d, inner = cfg.hidden_size, cfg.moe_intermediate_size
        self.experts = nn.ModuleList(SwiGLU(d, inner) for _ in range(cfg.num_experts))
        self.gate = Router(
            d, cfg.num_experts, cfg.num_experts_per_tok, cfg.n_group, cfg.topk_group, cfg.routed_scaling_factor
        )
        # the reference builds the shared experts whenever the key is not None (0 gives a zero-width SwiGLU)
        self.shared_experts = SwiGLU(d, inner * cfg.num_shared_experts) if cfg.num_shared_experts is not None else None
        #: the routed experts' path: None picks the grouped one for bf16 on CUDA, the looped one elsewhere
        self.grouped: bool | None = None
        self._packed: tuple[torch.Tensor, ...] | None = None
        self._ids: torch.Tensor | None = None

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # [B, Q, d]
        shape = h.shape
        x = h.reshape(-1, shape[-1])  # [N, d]
        ids, w = self.route(x)  # [N, k]
        out = self._grouped(x, ids, w) if self.runs_grouped(x.device, x.dtype) else self._looped(x, ids, w)  # [N, d]
        y = out.to(h.dtype).view(shape)
        if self.shared_experts is not None:
            y = y + self.shared_experts(h)
        return y

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # x [N, d] -> expert ids, weights [N, k]
        """The router's choice (LLaDA2's sigmoid router; ``llada_moe`` overrides it with its softmax router)."""
        return self.gate(x)

    def runs_grouped(self, device: torch.device, dtype: torch.dtype) -> bool:
        """Which expert path a forward on ``device`` in ``dtype`` takes: ``grouped`` when set, else grouped for bf16
        on CUDA only."""
        if self.grouped is not None:
            return self.grouped
        return torch.device(device).type == "cuda" and dtype == torch.bfloat16

    def _looped(self, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """The reference's order: expert after expert over the tokens routed to it (one host sync a layer)."""
        out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)  # [N, d]
        flat = ids.reshape(-1)
        order = flat.argsort(stable=True)
        counts = torch.bincount(flat, minlength=len(self.experts)).tolist()  # one host sync per layer
        token = order // ids.shape[1]  # [N * k] the token of each (sorted) routed pair
        weight = w.reshape(-1)[order]
        start = 0
        for e, n in enumerate(counts):
            if n == 0:
                continue
            rows = token[start : start + n]
            y = self.experts[e](x[rows])  # [n, d] in the model dtype, as the reference
            out.index_add_(0, rows, y.float() * weight[start : start + n, None])
            start += n
        return out

    def _grouped(self, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """Every routed pair in three grouped products over the stacked experts: no host sync, no loop over
        experts, fixed shapes for a fixed token count (a CUDA graph can record it). The same sums as ``_looped``
        up to the products' rounding."""
        gate_w, up_w, down_w = self._stacked()  # [E, inner, d], [E, inner, d], [E, d, inner]
        flat = ids.reshape(-1)  # [N * k]
        expert, order = flat.sort(stable=True)
        ends = torch.searchsorted(expert, self._expert_ids(x.device), right=True, out_int32=True)  # [E] group ends
        token = order // ids.shape[1]  # [N * k]
        xs = x[token]  # [N * k, d] the pairs' inputs, grouped by expert
        a = nn.functional.silu(_grouped_mm(xs, gate_w, ends)) * _grouped_mm(xs, up_w, ends)  # [N * k, inner]
        y = _grouped_mm(a, down_w, ends)  # [N * k, d]
        out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)
        return out.index_add_(0, token, y.float() * w.reshape(-1)[order, None])

    def _expert_ids(self, device: torch.device) -> torch.Tensor:  # [E] 0..E-1, made once per device
        if self._ids is None or self._ids.device != device:
            self._ids = torch.arange(len(self.experts), device=device)
        return self._ids

    def _stacked(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The experts' weights as three [E, ...] tensors. Packed once: each expert's weight then becomes a view
        of its stack (no second copy); packed again if the parameters were moved or re-cast since."""
        first = self.experts[0].gate_proj.weight
        if self._packed is None or self._packed[0].data_ptr() != first.data_ptr():
            stacks = []
            for name in ("gate_proj", "up_proj", "down_proj"):
                stack = torch.stack([getattr(e, name).weight.detach() for e in self.experts])
                for i, e in enumerate(self.experts):
                    getattr(e, name).weight.data = stack[i]
                stacks.append(stack)
            self._packed = tuple(stacks)
        return self._packed


def _grouped_mm(a: torch.Tensor, weights: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """Rows ``[ends[e-1], ends[e])`` of a [M, K] times ``weights[e].T`` ([E, N, K] Linear weights) -> [M, N]."""
    mm = getattr(nn.functional, "grouped_mm", None) or torch._grouped_mm  # public from torch 2.10
    return mm(a, weights.transpose(-2, -1), offs=ends)
