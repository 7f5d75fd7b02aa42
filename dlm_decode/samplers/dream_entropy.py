"""Dream ``alg="entropy"``: score = negative entropy ``sum p log(p + 1e-10)`` (the reference's epsilon)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from dlm_decode.samplers.dream_base import DreamOrdering


@dataclass(frozen=True)
class DreamEntropy(DreamOrdering):
    name: ClassVar[str] = "entropy"

    def score(self, probs: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
        return (probs * torch.log(probs + 1e-10)).sum(-1)
