"""The one cross-entropy read of both ELBO estimators (``likelihood.row_losses``, ``block_likelihood``): the LM head
on the hidden states that predict the masked continuation slots, ``head_chunk`` at a time, with LLaDA's
classifier-free guidance, summed per row and divided by the row's mask ratio."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def scored_losses(
    model: Any,
    hidden: torch.Tensor,  # [B or 2B, T, d]; with guidance the unconditional copies follow the B rows
    row: torch.Tensor,  # [N] row of each scored slot
    src: torch.Tensor,  # [N] the hidden state that predicts it
    target: torch.Tensor,  # [N] its clean token
    ratios: Sequence[float],  # [B] mask ratio per row
    cfg_scale: float = 0.0,
    head_chunk: int = 4096,
) -> torch.Tensor:  # [B] float64, on the CPU
    b = len(ratios)
    ce = torch.empty(row.shape[0], dtype=torch.float64, device=hidden.device)
    for s in range(0, row.shape[0], head_chunk):
        r, j = row[s : s + head_chunk], src[s : s + head_chunk]
        logits = model.output_logits(hidden[r, j]).float()  # [n, V]
        if cfg_scale > 0:
            un = model.output_logits(hidden[r + b, j]).float()
            logits = un + (cfg_scale + 1) * (logits - un)
        logp = torch.log_softmax(logits, -1)
        ce[s : s + head_chunk] = -logp.gather(-1, target[s : s + head_chunk, None]).squeeze(-1).double()
    totals = torch.zeros(b, dtype=torch.float64, device=hidden.device).index_add_(0, row, ce)
    ratio = torch.tensor([max(x, 1e-12) for x in ratios], dtype=torch.float64, device=hidden.device)
    return (totals / ratio).cpu()
