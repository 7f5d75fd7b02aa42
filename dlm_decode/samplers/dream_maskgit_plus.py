"""Dream ``alg="maskgit_plus"``: commit the masks whose proposed token has the highest probability."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from dlm_decode.samplers.dream_base import DreamOrdering


@dataclass(frozen=True)
class DreamMaskGitPlus(DreamOrdering):
    name: ClassVar[str] = "maskgit_plus"

    def score(self, probs: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
        return probs.gather(-1, x0[..., None]).squeeze(-1)
