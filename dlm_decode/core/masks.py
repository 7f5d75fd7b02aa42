"""Helpers on ``[B, N]`` bool masks over slots, shared by samplers and caches."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def dilate(mask: torch.Tensor, radius: int) -> torch.Tensor:
    """[B, N] bool -> [B, N] bool: slots within ``radius`` of a True slot (a 1-D dilation; radius 0: ``mask``)."""
    if radius == 0:
        return mask
    pooled = F.max_pool1d(mask[:, None].float(), kernel_size=2 * radius + 1, stride=1, padding=radius)
    return pooled[:, 0] > 0


def eos_settled(gen: torch.Tensor, mask_id: int, eos_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``gen`` [N, L] generation slots -> ([N] bool: the row's first EOS comes before its first MASK, so its answer is
    settled; [N] long: that EOS's offset, L when none). The EOS stop rule's test (``decode.commit.stop_at_eos``)."""
    n = gen.shape[1]
    masked = gen == mask_id
    first_mask = torch.where(masked.any(1), masked.float().argmax(1), n)
    is_eos = torch.isin(gen, eos_ids)
    first_eos = torch.where(is_eos.any(1), is_eos.float().argmax(1), n)
    return first_eos < first_mask, first_eos
