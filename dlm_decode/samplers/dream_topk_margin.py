"""Dream ``alg="topk_margin"``: score = top-1 minus top-2 probability.

Over the softmax after the top-p / top-k filters, as in the reference's ``sample_tokens``; with the options unset
those are ``diffusion_generate``'s defaults for the checkpoint (top-k 50 on an official Dream checkpoint, see
``dream_base``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from dlm_decode.samplers.dream_base import DreamOrdering


@dataclass(frozen=True)
class DreamTopkMargin(DreamOrdering):
    name: ClassVar[str] = "topk_margin"

    def score(self, probs: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
        top2 = torch.topk(probs, 2, dim=-1).values
        return top2[..., 0] - top2[..., 1]
