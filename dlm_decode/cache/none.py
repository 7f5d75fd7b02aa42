"""No cache: recompute the whole canvas every step (the references' default)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dlm_decode.cache.base import CachePolicy, StepPlan
from dlm_decode.cache.plans import block_causal_window, full_plan
from dlm_decode.core.state import DecodeState


@dataclass(frozen=True)
class NoCache(CachePolicy):
    """Every step is a refresh: every slot recomputed, nothing stored."""

    name: ClassVar[str] = "none"
    uses_store: ClassVar[bool] = False
    block_causal_rule: ClassVar[bool] = True

    def plan(self, state: DecodeState, region: tuple[int, int]) -> StepPlan:
        if state.inputs.block_causal or state.inputs.answer_blocks is not None:  # later blocks are invisible: the
            return block_causal_window(state, region)  # window up to the block's end, as the references
        return full_plan(state)
