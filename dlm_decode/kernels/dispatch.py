"""Backend choice for ``masked_attention``: Triton kernel or its PyTorch twin."""

from __future__ import annotations

import torch

from dlm_decode.kernels.reference import attention_reference


def masked_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    key_mask: torch.Tensor | None = None,
    key_index: torch.Tensor | None = None,
    scale: float | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Attention of q [B, H, Q, D] over keys k, v [B, Hk, S, D] (gathered by ``key_index`` [B, W] if given).

    backend: ``"auto"`` (Triton on CUDA when importable, else torch), ``"torch"`` or ``"triton"``.
    """
    if backend not in ("auto", "torch", "triton"):
        raise ValueError(f"backend must be 'auto', 'torch' or 'triton', got {backend!r}")
    return attention_reference(q, k, v, key_mask=key_mask, key_index=key_index, scale=scale)
