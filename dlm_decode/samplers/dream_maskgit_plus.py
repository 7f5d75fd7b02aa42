"""Dream ``alg="maskgit_plus"``: commit the masks whose proposed token has the highest probability.

The probability is the softmax after the top-p / top-k filters, as in the reference's ``sample_tokens``; with the
options unset those are ``diffusion_generate``'s defaults for the checkpoint (top-k 50 on an official Dream
checkpoint, see ``dream_base``): the renormalised confidences, not the raw ones, decide the order even at
temperature 0.
"""

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
