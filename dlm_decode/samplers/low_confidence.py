"""LLaDA's fixed-budget low-confidence remasking (Nie et al. 2025, "Large Language Diffusion Models").

Reference: ``generate()`` in LLaDA's ``generate.py`` with ``remasking="low_confidence"``. ``steps`` forwards are split
evenly over the blocks; each step commits the scheduled number of masked in-block slots with the highest
confidence (softmax probability of the proposed token). At temperature 0 the tokens equal the reference on the
same checkpoint (fp32), batch of one and batch of equal-length prompts. Differences: confidences are float64
(Fast-dLLM's choice; equal to the reference in fp32), MASK is never proposed, and mixed-length batches use the
key-padding mask with shifted positions so each row decodes as it would alone. Ties: ``torch.topk``, as the
reference. ``cfg_scale`` (classifier-free guidance) is a ``DecodeConfig`` option applied by the loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from dlm_decode.core.frontier import MultiBlock
from dlm_decode.core.state import DecodeState
from dlm_decode.options import QUIET
from dlm_decode.samplers import multi_block
from dlm_decode.samplers.base import Sampler, SamplerTraits, Selection, candidates, top_k_per_row
from dlm_decode.samplers.schedule import llada_schedule


@dataclass(frozen=True)
class LowConfidence(Sampler):
    # several blocks in flight (D2F's per-block rule, ``samplers.multi_block``); unset: one block at a time
    block_add_threshold: float | None = field(default=None, metadata=QUIET)
    decoded_token_threshold: float | None = field(default=None, metadata=QUIET)
    early_stop: bool = field(default=False, metadata=QUIET)  # no block opens after an end id (D2F)

    name: ClassVar[str] = "low_confidence"
    traits: ClassVar[SamplerTraits] = SamplerTraits(fixed_budget=True, reads_candidates_only=True)

    def __post_init__(self) -> None:
        multi_block.check_fields(self.name, self)

    def multi_block(self) -> MultiBlock | None:
        return multi_block.rule_of(self, "per_block", self.early_stop)

    def begin_block(self, state: DecodeState) -> None:
        if state.cursor.frontier is not None:  # several blocks in flight: per-block schedules (``multi_block``)
            return
        sched = llada_schedule(state.block_masked().sum(1), self.steps_per_block(state))  # [B, S]
        state.scratch[self.name] = sched
        state.scratch[f"{self.name}/most"] = sched.max(0).values.tolist()  # [S] host: no sync inside a step

    def score(self, state: DecodeState, conf: torch.Tensor) -> torch.Tensor:
        return conf

    def select(self, state: DecodeState, logits: torch.Tensor, r0: int) -> Selection:
        cand = candidates(state, r0, r0 + logits.shape[1])
        x0, conf = self.proposals(state, logits, cand)
        if state.cursor.frontier is not None:  # several blocks in flight
            steps = self.steps_per_block(state)
            commit = multi_block.scheduled(state, f"{self.name}/block_steps", self.score(state, conf), cand, r0, steps)
            return Selection(commit=commit, tokens=x0)
        score = torch.where(cand, self.score(state, conf), float("-inf"))
        sched = state.scratch[self.name]
        col = min(state.block_step, sched.shape[1] - 1)
        k, kmax = sched[:, col], state.scratch[f"{self.name}/most"][col]
        return Selection(commit=top_k_per_row(score, k, kmax) & cand, tokens=x0)
