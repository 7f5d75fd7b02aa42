"""Dream ``alg="topk_margin"``: score = top-1 minus top-2 probability (over the full softmax, as the reference)."""

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
