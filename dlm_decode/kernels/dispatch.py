"""Backend choice for ``masked_attention``: Triton kernel or its PyTorch twin.

``"auto"`` takes the kernel for CUDA tensors when Triton imports and the inputs are ones it supports, the twin
(``reference.attention_reference``) otherwise; ``"triton"`` insists on the kernel and says why it can't run;
``"torch"`` always takes the twin. Triton is imported lazily, on the first call that wants it, so
``import dlm_decode`` works without it.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from types import ModuleType

import torch

from dlm_decode.kernels.reference import attention_reference

BACKENDS = ("auto", "torch", "triton")


@functools.cache
def _triton_module() -> ModuleType | None:
    """The kernel module, or None when Triton is not installed (or fails to import)."""
    try:
        from dlm_decode.kernels import triton_attention
    except ImportError:
        return None
    return triton_attention


def check_triton_backend(q: torch.Tensor, environ: Mapping[str, str] | None = None) -> ModuleType:
    """Return the kernel module if the Triton backend can run on ``q``'s device, else raise RuntimeError.

    ``environ`` defaults to ``os.environ``; tests pass their own to check the CPU rule without re-importing.
    """
    environ = os.environ if environ is None else environ
    module = _triton_module()
    if module is None:
        raise RuntimeError(
            "backend='triton' needs Triton: pip install 'dlm-decode[triton]' (or use backend='auto'/'torch')"
        )
    if q.is_cuda:
        return module
    if q.device.type == "cpu" and environ.get("TRITON_INTERPRET") == "1":
        return module
    raise RuntimeError(
        f"backend='triton' can't run on {q.device} tensors: use CUDA tensors, or CPU tensors with "
        "TRITON_INTERPRET=1 set before the kernel module is first imported (or use backend='auto'/'torch')"
    )


def masked_attention(
    q: torch.Tensor,  # [B, H, Q, D]
    k: torch.Tensor,  # [B, Hk, S, D]
    v: torch.Tensor,  # [B, Hk, S, D]
    *,
    key_mask: torch.Tensor | None = None,  # [B, S] or [B, W] bool, True = visible
    key_index: torch.Tensor | None = None,  # [B, W] long
    scale: float | None = None,
    backend: str = "auto",
) -> torch.Tensor:  # [B, H, Q, D]
    """Attention of q [B, H, Q, D] over keys k, v [B, Hk, S, D] (gathered by ``key_index`` [B, W] if given).

    backend: ``"auto"`` (Triton on CUDA when importable, else torch), ``"torch"`` or ``"triton"``. The Triton
    kernel is forward-only: when autograd needs the result (grad enabled and q, k or v requiring grad, i.e.
    training), ``"auto"`` takes the PyTorch path and ``"triton"`` is refused.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    kwargs = dict(key_mask=key_mask, key_index=key_index, scale=scale)
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if backend == "triton":
        if needs_grad:
            raise ValueError(
                "backend='triton': the Triton attention kernel has no backward; use backend='torch' or 'auto' "
                "when gradients are needed (training), or run under torch.no_grad()"
            )
        return check_triton_backend(q).masked_attention_triton(q, k, v, **kwargs)
    if backend == "auto" and q.is_cuda and not needs_grad:
        module = _triton_module()
        if module is not None and module.supported(q, k, v):
            return module.masked_attention_triton(q, k, v, **kwargs)
    return attention_reference(q, k, v, **kwargs)
