"""PyTorch twin of the windowed attention kernel: the specification, and the fallback wherever Triton can't run.

Queries at a subset of canvas slots attend to a (possibly gathered) set of keys with a key mask:

    out[b, h, i] = sum_w softmax_w(q[b,h,i] . k[b, h//g, idx[b,w]] * scale + bias[b,w]) v[b, h//g, idx[b,w]]

``bias`` is 0 for visible keys and -inf for hidden ones; a query whose keys are all hidden returns zeros
(never NaN). GQA: query head ``h`` reads key/value head ``h // (H / Hk)`` (the layout of
``repeat_interleave``/HF ``repeat_kv``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def gather_keys(k: torch.Tensor, key_index: torch.Tensor) -> torch.Tensor:
    """k [B, Hk, S, D], key_index [B, W] -> [B, Hk, W, D]."""
    b, hk, _, d = k.shape
    idx = key_index[:, None, :, None].expand(b, hk, key_index.shape[1], d)
    return k.gather(2, idx)


def attention_reference(
    q: torch.Tensor,  # [B, H, Q, D]
    k: torch.Tensor,  # [B, Hk, S, D]
    v: torch.Tensor,  # [B, Hk, S, D]
    *,
    key_mask: torch.Tensor | None = None,  # [B, S] or [B, W] bool
    key_index: torch.Tensor | None = None,  # [B, W] long
    scale: float | None = None,
) -> torch.Tensor:  # [B, H, Q, D]
    if key_index is not None:
        k, v = gather_keys(k, key_index), gather_keys(v, key_index)
    gqa = q.shape[1] != k.shape[1]  # SDPA broadcasts the K/V heads itself (same numbers, no copies)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if key_mask is None:
        return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=gqa)
    mask = key_mask[:, None, None, :]  # [B, 1, 1, S]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)
    # SDPA returns NaN for a fully hidden row; such rows have no keys to read from.
    return torch.where(key_mask.any(-1)[:, None, None, None], out, torch.zeros_like(out))
