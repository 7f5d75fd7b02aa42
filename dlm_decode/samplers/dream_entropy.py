"""Dream ``alg="entropy"``: score = negative entropy ``sum p log(p + 1e-10)`` (the reference's epsilon).

``p`` is the softmax after the top-p / top-k filters, as in the reference's ``sample_tokens``; with the options
unset those are ``diffusion_generate``'s defaults for the checkpoint (top-k 50 on an official Dream checkpoint, see
``dream_base``), which renormalise ``p`` and so change the order slots are committed in, even at temperature 0.
"""

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
