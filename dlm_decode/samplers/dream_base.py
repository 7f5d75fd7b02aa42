"""Shared machinery of Dream's ``diffusion_generate`` orderings (Ye et al. 2025, "Dream 7B").

Reference: ``DreamGenerationMixin._sample``. ``steps`` forwards over the generation (one block by default, as
the reference has no blocks; with ``block_length`` < ``gen_length`` the same schedule runs per block with
``steps / num_blocks`` forwards each). Tokens come from Dream's ``sample_tokens`` (temperature, top-p, top-k,
softmax in the logits dtype); the ordering score is the subclass's; the count per step follows Dream's linear
schedule (``schedule.dream_count``). ``alg_temp`` > 0 draws the committed slots from ``softmax(score / alg_temp)``
without replacement instead of taking the top ones. Like the reference, a step may commit nothing (early steps of
long generations), so these samplers do not promise one commit per step; the last step of a block commits every
remaining mask. Differences: MASK is never proposed; per-row mask counts (see ``schedule``); the call's
``torch.Generator`` replaces the global RNG.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from dlm_decode.core.proposals import categorical_proposals
from dlm_decode.core.state import DecodeState
from dlm_decode.samplers.base import Sampler, Selection, candidates, top_k_per_row
from dlm_decode.samplers.schedule import dream_count


@dataclass(frozen=True)
class DreamOrdering(Sampler):
    alg_temp: float | None = None
    eps: float = 1e-3

    blockwise: ClassVar[bool] = False
    fixed_budget: ClassVar[bool] = True
    commits_every_step: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if self.alg_temp is not None and (not math.isfinite(self.alg_temp) or self.alg_temp < 0):
            raise ValueError(f"{self.name}: alg_temp must be >= 0 or None, got {self.alg_temp!r}")
        if not 0.0 < self.eps < 1.0:
            raise ValueError(f"{self.name}: eps must be in (0, 1), got {self.eps!r}")

    def score(self, probs: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:  # [B, R]
        raise NotImplementedError

    def select(self, state: DecodeState, logits: torch.Tensor, r0: int) -> Selection:
        c = state.config
        x0, probs = categorical_proposals(
            logits,
            mask_id=state.mask_id,
            temperature=c.temperature,
            top_p=c.top_p,
            top_k=c.top_k,
            generator=state.generator,
        )
        cand = candidates(state, r0, r0 + logits.shape[1])
        k = dream_count(cand.sum(1), state.block_step, self.steps_per_block(state), self.eps)
        score = torch.where(cand, self.score(probs, x0).to(logits.dtype), float("-inf"))
        if not self.alg_temp:
            return Selection(commit=top_k_per_row(score, k) & cand, tokens=x0)
        # sample k slots per row without replacement from softmax(score / alg_temp)
        w = torch.softmax(score.float() / self.alg_temp, dim=-1).nan_to_num(0.0)
        kmax = int(k.max())
        commit = torch.zeros_like(cand)
        if kmax > 0:
            idx = torch.multinomial(w.clamp(min=1e-30) * cand, kmax, generator=state.generator)
            keep = torch.arange(kmax, device=w.device)[None, :] < k[:, None]
            commit = commit.scatter(1, idx, keep)
        return Selection(commit=commit & cand, tokens=x0)
