"""Anchor-guided local parallel decoding ("LocalLeap").

Rule (as specified in ALGORITHMS.md section 2; no public reference code was found to check it against): per step in
the current block, anchors are the masked slots with confidence ``>= kappa``; their neighbourhood is the union of
``[a - radius, a + radius]`` over anchors (canvas distance, so decoded slots count towards the radius). The step
commits the most confident masked slot, every masked slot in the neighbourhood with confidence ``>= tau_relaxed``
and every other masked slot with confidence ``>= kappa``. Without anchors this is the Fast-dLLM threshold rule at
``kappa``. Comparisons are ``>=`` like Fast-dLLM's threshold; confidences are float64 (``gumbel_proposals``).
Defaults kappa 0.9, tau_relaxed 0.75, radius 4, block 32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from dlm_decode.core.masks import dilate
from dlm_decode.core.state import DecodeState
from dlm_decode.options import check_probability, is_int
from dlm_decode.samplers.base import Sampler, SamplerTraits, Selection, candidates
from dlm_decode.samplers.threshold import top1


@dataclass(frozen=True)
class LocalLeap(Sampler):
    kappa: float = 0.9
    tau_relaxed: float = 0.75
    radius: int = 4

    name: ClassVar[str] = "local_leap"
    traits: ClassVar[SamplerTraits] = SamplerTraits(reads_candidates_only=True)

    def __post_init__(self) -> None:
        check_probability(self.name, "kappa", self.kappa)
        check_probability(self.name, "tau_relaxed", self.tau_relaxed)
        if self.tau_relaxed > self.kappa:
            raise ValueError(f"{self.name}: tau_relaxed ({self.tau_relaxed}) must be <= kappa ({self.kappa})")
        if not is_int(self.radius) or self.radius < 0:
            raise ValueError(f"{self.name}: radius must be an integer >= 0, got {self.radius!r}")

    def count_bounds(self, block: int, block_steps: int, gen_length: int) -> dict[str, tuple[int, str]]:
        return {"radius": (block - 1, "the block length - 1")}  # neighbours of an anchor inside its block

    def select(self, state: DecodeState, logits: torch.Tensor, r0: int) -> Selection:
        cand = candidates(state, r0, r0 + logits.shape[1])
        x0, conf = self.proposals(state, logits, cand)  # [B, R], [B, R] float64
        anchors = cand & (conf >= self.kappa)
        near = dilate(anchors, self.radius)  # [B, R] the anchors' neighbourhood
        passes = torch.where(near, conf >= self.tau_relaxed, conf >= self.kappa)
        return Selection(commit=top1(conf, cand) | (cand & passes), tokens=x0)
