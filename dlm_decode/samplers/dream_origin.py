"""Dream ``alg="origin"``: each mask is revealed independently with probability ``1 - s/t`` (all at the last step).

Random by construction (the reference draws ``torch.rand`` per mask even at temperature 0); reproducible here
through the call's ``torch.Generator``, matching the reference in distribution. Unset ``top_k`` / ``top_p`` /
``eps`` / ``alg_temp`` take the checkpoint's ``diffusion_generate`` defaults (top-k 50 on an official Dream
checkpoint; see ``dream_base``); the top-k filter only matters here at temperature > 0, where it shapes the draw.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from dlm_decode.core.proposals import categorical_proposals
from dlm_decode.core.state import DecodeState
from dlm_decode.samplers.base import Selection, candidates
from dlm_decode.samplers.dream_base import DreamOrdering


@dataclass(frozen=True)
class DreamOrigin(DreamOrdering):
    name: ClassVar[str] = "origin"

    def select(self, state: DecodeState, logits: torch.Tensor, r0: int) -> Selection:
        c = state.config
        cand = candidates(state, r0, r0 + logits.shape[1])
        steps, i = self.steps_per_block(state), state.block_step
        if i >= steps - 1:
            p = 1.0
        else:
            t = torch.linspace(1, self.schedule_eps, steps + 1, device=logits.device)
            p = float(1 - t[i + 1] / t[i])
        draw = torch.rand(cand.shape, device=logits.device, generator=state.generator) < p
        x0, _ = categorical_proposals(
            logits,
            mask_id=state.mask_id,
            temperature=c.temperature,
            top_p=c.top_p,
            top_k=c.top_k,
            generator=state.generator,
        )
        return Selection(commit=draw & cand, tokens=x0)
