"""Prefix KV cache (Wu et al. 2025, "Fast-dLLM: Training-free Acceleration of Diffusion LLM by Enabling KV Cache and
Parallel Decoding"), an approximate cache for block-wise decoding.

Reference: ``generate_with_prefix_cache`` in Fast-dLLM's ``llada/generate.py``. The first step of every block is a
full forward: its logits decide that step's commits and its K/V of the slots before the block become the cache.
Every later step of the block runs ``x[:, s:]`` (the block and everything after it) against the cached prefix; the
block's and the suffix's K/V are recomputed each step, never reused. At temperature 0 in fp32 the tokens equal the
reference for ``low_confidence`` (fixed schedule), ``threshold`` and ``factor``, batch of one and batch of equal-length
prompts (``tests/test_caches.py`` against ``tests/reference_cached_generate.py``).

Differences, on purpose: the loop's step bound finishes a block (never a MASK left, whatever ``steps``); with Dream's
shifted logits the slot before the block is recomputed too, because its hidden state predicts the block's first
slot (Fast-dLLM's Dream code instead shifts inside the recomputed window, so the block's first slot is predicted by
its own hidden state); rows whose blocks start at different slots (variable blocks) each compute from their own
start. ``refresh_interval`` (not in the reference; default off) adds full refreshes every that many steps of a block;
1 reproduces decoding without a cache.

On a block-causal model (LLaDA2) the same name is the **exact** cache of finished blocks (``plans.exact_block_plan``,
the default there): every step computes the current grid block against the stored earlier blocks, and a block's
first step also recomputes the previous block, so its final K/V are written without the extra forward per block
that dInfer's and SDAR's cached loops spend. Same tokens and no more forwards than the uncached reference.
With several blocks in flight (``core.frontier``), and on a bidirectional model under D2F's attention
(``DecodeConfig.attention``), it is exact the same way (``plans.exact_tracked_plan``): each step recomputes from
the first block whose K/V may still change to the end of the row's last open block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dlm_decode.cache.base import CachePolicy, StepPlan
from dlm_decode.cache.plans import (
    block_starts,
    compute_from_mask,
    exact_block_plan,
    exact_tracked_plan,
    full_plan,
    refresh_due,
    region_mask,
    slots,
    with_predecessors,
)
from dlm_decode.core.state import DecodeState
from dlm_decode.options import check_count


@dataclass(frozen=True)
class PrefixCache(CachePolicy):
    refresh_interval: int | None = None  # extra full refreshes every N steps of a block (None: block start only)

    name: ClassVar[str] = "prefix"
    block_causal_rule: ClassVar[bool] = True

    def __post_init__(self) -> None:
        check_count(f"cache {self.name!r}", "refresh_interval", self.refresh_interval, optional=True)

    def check(self, config, sampler, facts) -> None:
        super().check(config, sampler, facts)
        if self.refresh_interval is not None and facts is not None and facts.block_causal:
            raise ValueError(
                "cache 'prefix': refresh_interval does not apply to a block-causal model (its cache is exact)"
            )

    def plan(self, state: DecodeState, region: tuple[int, int]) -> StepPlan:
        if state.cursor.frontier is not None or state.inputs.answer_blocks is not None:
            return exact_tracked_plan(state, region)  # several blocks in flight, or D2F's attention: exact
        if state.inputs.block_causal:
            return exact_block_plan(state, region)
        if refresh_due(state, self.refresh_interval):
            return full_plan(state)
        starts = block_starts(state) - state.logit_shift  # [B]
        need = slots(state)[None, :] >= starts[:, None]  # [B, T]: the block and everything after it
        need = need | with_predecessors(region_mask(state, region) & state.is_masked(), state.logit_shift)
        return StepPlan(compute=compute_from_mask(need, state, region), key_mask=state.key_mask())
