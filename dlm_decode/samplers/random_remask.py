"""LLaDA's fixed-budget random remasking (``generate()`` with ``remasking="random"``).

Same schedule as ``low_confidence``; the committed slots are those with the highest uniform random score, drawn
from the call's ``torch.Generator`` (float32 uniforms over the region, as the reference draws ``torch.rand`` over
the canvas; samples therefore match the reference only in distribution).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from dlm_decode.core.state import DecodeState
from dlm_decode.samplers.low_confidence import LowConfidence


@dataclass(frozen=True)
class RandomRemask(LowConfidence):
    name: ClassVar[str] = "random"

    def score(self, state: DecodeState, conf: torch.Tensor) -> torch.Tensor:
        return torch.rand(conf.shape, device=conf.device, generator=state.generator).to(conf.dtype)
