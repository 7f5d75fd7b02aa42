"""Token proposals and confidences shared by samplers: what each reference does before its ordering rule.

Two families, each faithful to its reference:

* ``gumbel`` (LLaDA ``generate`` and Fast-dLLM): ``x0 = argmax(logits)`` or, at temperature T > 0, Gumbel-max
  ``argmax(exp(logits) / (-log U)^T)`` with U uniform float64; the confidence is the float64 softmax of the
  *un-noised* logits at ``x0`` (Fast-dLLM; LLaDA's own file now uses the model dtype; both agree in fp32).
* ``categorical`` (Dream ``sample_tokens``): logits / T, then top-p and top-k filtering, softmax in the logits
  dtype; greedy takes ``probs.max``, T > 0 samples from the categorical.

Difference from both references, on purpose: the MASK id is never proposed (it is excluded from the argmax /
sampling, not from the softmax), so a model that predicts MASK cannot write MASK back into the canvas. Wherever
the reference's argmax is not MASK the tokens and confidences are identical.
"""

from __future__ import annotations

import torch


def top_k_filter(logits: torch.Tensor, k: int | None) -> torch.Tensor:
    """Keep the ``k`` highest logits (ties at the k-th kept, as Dream's ``top_k_logits``); None or 0: all."""
    if not k or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float | None) -> torch.Tensor:
    """Keep the smallest set of tokens whose cumulative probability reaches ``p`` (Dream's ``top_p_logits``)."""
    if p is None or p >= 1.0:
        return logits
    sorted_logits, sorted_idx = torch.sort(logits, descending=True, dim=-1)
    cum = torch.cumsum(torch.softmax(sorted_logits, dim=-1), dim=-1)
    remove = cum > p
    remove[..., 1:] = remove[..., :-1].clone()  # keep the token that crosses p
    remove[..., 0] = False
    mask = torch.zeros_like(remove).scatter(-1, sorted_idx, remove)
    return logits.masked_fill(mask, float("-inf"))


def _no_mask(logits: torch.Tensor, mask_id: int) -> torch.Tensor:
    if mask_id < logits.shape[-1]:
        logits = logits.clone()
        logits[..., mask_id] = float("-inf")
    return logits


def gumbel_proposals(
    logits: torch.Tensor,  # [B, R, V]
    *,
    mask_id: int,
    temperature: float,
    top_p: float | None = None,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
    only: torch.Tensor | None = None,  # [B, R] bool: the slots whose proposals are read
) -> tuple[torch.Tensor, torch.Tensor]:  # x0 [B, R] long, confidence [B, R] float64
    if only is not None and temperature == 0 and logits.device.type == "cpu":
        return _greedy_at(logits, only, mask_id=mask_id, top_p=top_p, top_k=top_k)
    pick = top_p_filter(top_k_filter(logits, top_k), top_p)
    pick = _no_mask(pick, mask_id)
    if temperature > 0:
        pick = pick.to(torch.float64)
        u = torch.rand(pick.shape, dtype=torch.float64, device=pick.device, generator=generator)
        pick = pick.exp() / (-torch.log(u)) ** temperature
    x0 = pick.argmax(-1)
    p = torch.softmax(logits.to(torch.float64), dim=-1)
    conf = p.gather(-1, x0[..., None]).squeeze(-1)
    return x0, conf


def _greedy_at(
    logits: torch.Tensor, only: torch.Tensor, *, mask_id: int, top_p: float | None, top_k: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``gumbel_proposals`` at temperature 0 computed at the ``only`` slots alone (the others read x0 0 and
    confidence 0, which a sampler reading only those slots never sees). Every operation is row-wise (filters,
    argmax, float64 softmax), so the slots computed get exactly the values of the whole-region call; on the CPU
    the float64 softmax over the vocabulary is most of a sampler's work, and a step's candidates are often a
    fraction of its region. Not on a GPU, where the whole region is one kernel and listing the slots would sync."""
    b, r, v = logits.shape
    idx = only.reshape(-1).nonzero().squeeze(1)  # [n]
    sub = logits.reshape(b * r, v).index_select(0, idx)  # [n, V], a copy
    conf_all = torch.softmax(sub.to(torch.float64), dim=-1)
    pick = top_p_filter(top_k_filter(sub, top_k), top_p)
    if mask_id < v:
        pick[:, mask_id] = float("-inf")  # a copy already (index_select, or a filter's masked_fill)
    x0s = pick.argmax(-1)  # [n]
    conf_s = conf_all.gather(-1, x0s[:, None]).squeeze(-1)
    x0 = torch.zeros(b * r, dtype=torch.long).index_copy_(0, idx, x0s).view(b, r)
    conf = torch.zeros(b * r, dtype=torch.float64).index_copy_(0, idx, conf_s).view(b, r)
    return x0, conf


def categorical_proposals(
    logits: torch.Tensor,  # [B, R, V]
    *,
    mask_id: int,
    temperature: float,
    top_p: float | None = None,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # x0 [B, R], probs [B, R, V] (for confidence rules)
    if temperature > 0:
        logits = logits / temperature
    logits = top_k_filter(top_p_filter(logits, top_p), top_k)
    probs = torch.softmax(logits, dim=-1)
    if temperature > 0:
        w = probs.float().clone()
        if mask_id < w.shape[-1]:
            w[..., mask_id] = 0.0
        flat = w.reshape(-1, w.shape[-1])
        x0 = torch.multinomial(flat, 1, generator=generator).view(probs.shape[:-1])
    else:
        x0 = _no_mask(probs, mask_id).argmax(-1) if mask_id < probs.shape[-1] else probs.argmax(-1)
    return x0, probs
