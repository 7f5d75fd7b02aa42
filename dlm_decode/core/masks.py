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
