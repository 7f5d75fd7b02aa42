"""Dual KV cache (Wu et al. 2025, "Fast-dLLM: Training-free Acceleration of Diffusion LLM by Enabling KV Cache and
Parallel Decoding"): the prefix cache extended to the masked suffix after the block.

Reference: ``generate_with_dual_cache`` in Fast-dLLM's ``llada/generate.py``. The first step of every block is a
full forward whose logits decide that step's commits and whose K/V of every slot become the cache. Every later step
of the block runs only ``x[:, s:e]``; the block's fresh K/V replace its cached ones (``replace_position``) and the
queries attend over the cached prefix, the fresh block and the cached suffix. At temperature 0 in fp32 the tokens
equal the reference for ``low_confidence`` (fixed schedule), ``threshold`` and ``factor``, batch of one and batch of
equal-length prompts (``tests/test_caches.py`` against ``tests/reference_cached_generate.py``).

Differences, on purpose: the loop's step bound finishes a block (never a MASK left); with Dream's shifted logits
the slot before the block is recomputed as well (its hidden state predicts the block's first slot; Fast-dLLM's Dream
code shifts inside the block window instead); masked slots of a sampler region wider than the block are computed
too; rows with their own block bounds (variable blocks, cuts) each compute their own block. ``refresh_interval``
(not in the reference; default off) adds full refreshes inside a block; 1 reproduces decoding without a cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dlm_decode.cache.base import CachePolicy, StepPlan
from dlm_decode.cache.plans import (
    block_starts,
    compute_from_mask,
    full_plan,
    refresh_due,
    region_mask,
    slots,
    with_predecessors,
)
from dlm_decode.core.state import DecodeState
from dlm_decode.options import check_count


@dataclass(frozen=True)
class DualCache(CachePolicy):
    refresh_interval: int | None = None  # extra full refreshes every N steps of a block (None: block start only)

    name: ClassVar[str] = "dual"

    def __post_init__(self) -> None:
        check_count(f"cache {self.name!r}", "refresh_interval", self.refresh_interval, optional=True)

    def plan(self, state: DecodeState, region: tuple[int, int]) -> StepPlan:
        if refresh_due(state, self.refresh_interval):
            return full_plan(state)
        idx = slots(state)[None, :]
        block = (idx >= block_starts(state)[:, None]) & (idx < state.block_end[:, None])  # [B, T]
        need = with_predecessors(block | (region_mask(state, region) & state.is_masked()), state.logit_shift)
        return StepPlan(compute=compute_from_mask(need, state, region), key_mask=state.key_mask())
