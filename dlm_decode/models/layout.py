"""Where linear weights live in memory: the checkpoint's row-major [out, in], or column-major for CPU decoding.

``F.linear(x, W)`` computes ``x @ W.T``. With ``W`` row-major (as every checkpoint stores it, and as
``from_pretrained`` loads it) MKL's sgemm runs with its B operand transposed; with ``W`` stored column-major (the
same values, ``W.T`` contiguous) it runs untransposed, which on this project's CPU (AVX-512, MKL 2024.2, one thread)
is 1.1-1.6x faster for the few-row products of a cached decoding step (1-64 rows: a block of 32 slots, the masked
slots of the last layer) and equal at a full canvas (320 rows): record ``weight-layout-cpu.md``, commit 1f57091. Nothing
else changes: the parameter keeps its shape, name, values and gradient; ``state_dict`` and ``save_pretrained`` give
the official tensors (``save_pretrained`` writes contiguous copies). ``safetensors.torch.save_file`` refuses
non-contiguous tensors, so code that writes raw safetensors of a decoding-layout model calls ``.contiguous()`` first
(as ``save_pretrained`` does) or ``set_layout(model, "official")``.

The products are not always bitwise equal to the row-major ones: at 32 and more rows with ``in`` up to 768 they were
in every case tried; at 1-8 rows and at ``in`` = 1024 some differ in the last bits (a different blocking of the same
sums). Decoding is deterministic either way; only a float32 near-tie between two candidates can resolve differently.

``load_model(layout="auto")`` applies ``"decode"`` on CPU in float32 (where it was measured) and leaves other
devices and dtypes as loaded; CUDA's GEMMs take either layout at the same speed.
"""

from __future__ import annotations

import torch
from torch import nn

LAYOUTS = ("auto", "decode", "official")


def resolve_layout(layout: str, device: torch.device | str, dtype: torch.dtype) -> str:
    """``"auto"`` -> ``"decode"`` on CPU in float32, else ``"official"``; the others as given (checked)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if layout != "auto":
        return layout
    return "decode" if torch.device(device).type == "cpu" and dtype == torch.float32 else "official"


def set_layout(model: nn.Module, layout: str) -> int:
    """Store every ``nn.Linear`` weight of ``model`` column-major (``"decode"``) or row-major (``"official"``), in
    place, values unchanged (a weight tied to an embedding table stays as it is); ``"auto"`` decides from the model's
    first parameter. Returns how many weights moved."""
    if layout == "auto":
        first = next(model.parameters())
        layout = resolve_layout(layout, first.device, first.dtype)
    elif layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    moved = 0
    for module in _linears(model):
        w = module.weight
        if layout == "decode" and not is_column_major(w):
            module.weight.data = w.data.t().contiguous().t()  # [out, in] values, [in, out] memory
        elif layout == "official" and not w.is_contiguous():
            module.weight.data = w.data.contiguous()
        else:
            continue
        moved += 1
    return moved


def is_column_major(w: torch.Tensor) -> bool:
    """True when the 2-D ``w`` is stored as its transpose (``w.T`` contiguous), as ``"decode"`` leaves it."""
    return w.dim() == 2 and w.t().is_contiguous() and not (w.shape[0] > 1 and w.shape[1] > 1 and w.is_contiguous())


def layout_of(model: nn.Module) -> str:
    """``"decode"`` if every linear weight is column-major, ``"official"`` if every one is row-major, else
    ``"mixed"``."""
    kinds = {
        "decode" if is_column_major(m.weight) else "official" if m.weight.is_contiguous() else "mixed"
        for m in _linears(model)
    }
    return kinds.pop() if len(kinds) == 1 else "mixed"


def _linears(model: nn.Module) -> list[nn.Linear]:
    """The model's linear layers whose weight is their own: a weight tied to an embedding table (an LM head sharing
    the input embedding) keeps the row-major layout the table's row gathers want."""
    tables = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    return [m for m in model.modules() if isinstance(m, nn.Linear) and id(m.weight) not in tables]
