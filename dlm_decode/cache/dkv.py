"""dKV-Cache (Ma et al. 2025, "dKV-Cache: The Cache for Diffusion Language Models"): delayed caching of decoded tokens.

A token's K/V change a lot at the step that decodes it (MASK becomes a token) and little after, so a slot's K/V
enter the cache one step *after* it is decoded: every step recomputes the slots that were MASK when the previous
step began (all masks plus the tokens decoded last step) against the cached K/V of everything else, and writes the
fresh K/V back. Four variants, registered as caches:

* ``dkv_decode``: the above; a full refresh at each block start and every ``refresh_interval`` steps of a block
  (default 8 for LLaDA-style models, 4 for Dream-style shifted-logit models: the paper's settings).
* ``dkv_greedy``: recompute only the tokens decoded last step, ``window`` neighbours on each side of them, and the
  masked slots the sampler chooses from (its region, by default the current block); masks outside the region keep
  their cached K/V. Full refresh every 2 steps and at block start.
* ``dkv_prefill``: the prompt's K/V are computed by the call's first forward and never refreshed; every step
  recomputes the whole generation region.
* ``dkv_pd``: prefill + decode: the prompt as in ``dkv_prefill``; the generation region as in ``dkv_decode``, its
  periodic refresh recomputing the generation region only.

Reference: horseee/dKV-Cache (LLaDA ``generate`` with ``enable_cache`` / ``cache_reloading_step``, read from a
public copy of its ``llada_dkv_cache_decode.py``: per block, step 0 is a full forward, later steps run
``x[~prv_transfer_idx]`` -- everything not decoded before the previous step -- and block steps ``i % N == 0``
refresh), re-implemented from that behaviour and the paper. Compute sets differ per row, so they go to the model
as ``[B, Q]`` sorted slot ids (padding by duplicates, see ``plans``); at batch 1 that is one gather and one scatter
per layer, not the reference's token reordering, so the speedup does not need large batches.

Differences, on purpose: (1) the reference also runs a full forward at a block's second step (its delayed index is
not set up yet); we need not, the first step's snapshot suffices. (2) dKV-Cache-Greedy in the reference pairs with
random remasking, which picks the slots to decode *before* the forward, and recomputes just those; our samplers
choose after seeing logits, so every masked slot of the sampler's region is recomputed (at most a block) -- any
sampler works, random remasking is closest to the paper. (3) With Dream's shift, the slot before each masked slot of
the region is recomputed too (its hidden state predicts that slot). (4) Finished rows compute nothing. Each policy
has a setting that refreshes every step and so reproduces decoding without a cache (``refresh_interval=1``; for
``dkv_pd`` also ``prompt_refresh_interval=1``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from dlm_decode.cache.base import CachePolicy, StepPlan
from dlm_decode.cache.plans import (
    compute_from_mask,
    full_plan,
    refresh_due,
    region_mask,
    slots,
    with_predecessors,
)
from dlm_decode.core.masks import dilate
from dlm_decode.core.state import DecodeState
from dlm_decode.options import check_count

MAX_GREEDY_WINDOW = 3  # neighbours per side: the paper's window holds at most 6 neighbours


def default_interval(state: DecodeState) -> int:
    """The paper's refresh interval: 4 for Dream (shifted logits), 8 for LLaDA."""
    return 4 if state.logit_shift else 8


@dataclass(frozen=True)
class _Delayed(CachePolicy):
    """Shared bookkeeping: the MASK layout when the previous step began, kept in ``state.scratch``."""

    def _previous(self, state: DecodeState) -> torch.Tensor | None:
        return state.scratch.get(f"cache/{self.name}")

    def _remember(self, state: DecodeState, masked: torch.Tensor) -> None:
        prev = self._previous(state)
        if prev is None:
            state.scratch[f"cache/{self.name}"] = masked.clone()
        else:
            prev.copy_(masked)  # one [B, T] buffer per call: nothing grows

    def _delayed_plan(self, state: DecodeState, region: tuple[int, int], prev: torch.Tensor) -> StepPlan:
        """Recompute what was MASK when the last step began, plus the hidden states behind the region's masks."""
        masked = state.is_masked()
        need = prev | with_predecessors(region_mask(state, region) & masked, state.logit_shift)
        need = need & state.valid & ~state.finished[:, None]
        return StepPlan(compute=compute_from_mask(need, state, region), key_mask=state.key_mask())


@dataclass(frozen=True)
class DKVDecode(_Delayed):
    refresh_interval: int | None = None  # None: 8 (LLaDA) / 4 (Dream)

    name: ClassVar[str] = "dkv_decode"

    def __post_init__(self) -> None:
        check_count(f"cache {self.name!r}", "refresh_interval", self.refresh_interval, optional=True)

    def plan(self, state: DecodeState, region: tuple[int, int]) -> StepPlan:
        prev = self._previous(state)
        interval = self.refresh_interval or default_interval(state)
        if prev is None or refresh_due(state, interval):
            plan = full_plan(state)
        else:
            plan = self._delayed_plan(state, region, prev)
        self._remember(state, state.is_masked())
        return plan


@dataclass(frozen=True)
class DKVGreedy(_Delayed):
    refresh_interval: int = 2
    window: int = 2  # neighbours recomputed on each side of every token decoded last step (0..3)

    name: ClassVar[str] = "dkv_greedy"

    def __post_init__(self) -> None:
        check_count(f"cache {self.name!r}", "refresh_interval", self.refresh_interval, optional=True)
        w = self.window
        if isinstance(w, bool) or not isinstance(w, int) or not 0 <= w <= MAX_GREEDY_WINDOW:
            raise ValueError(f"cache {self.name!r}: window must be an integer in [0, {MAX_GREEDY_WINDOW}], got {w!r}")

    def plan(self, state: DecodeState, region: tuple[int, int]) -> StepPlan:
        prev = self._previous(state)
        masked = state.is_masked()
        if prev is None or refresh_due(state, self.refresh_interval):
            plan = full_plan(state)
        else:
            decoded = prev & ~masked  # decoded (or filled) during the last step: their delayed K/V
            targets = region_mask(state, region) & masked  # what the sampler may commit now
            need = dilate(decoded, self.window) | with_predecessors(targets, state.logit_shift)
            need = need & state.valid & ~state.finished[:, None]
            plan = StepPlan(compute=compute_from_mask(need, state, region), key_mask=state.key_mask())
        self._remember(state, masked)
        return plan


@dataclass(frozen=True)
class DKVPrefill(CachePolicy):
    refresh_interval: int | None = None  # None: never (the paper); k: full refresh at block starts and every k steps

    name: ClassVar[str] = "dkv_prefill"

    def __post_init__(self) -> None:
        check_count(f"cache {self.name!r}", "refresh_interval", self.refresh_interval, optional=True)

    def plan(self, state: DecodeState, region: tuple[int, int]) -> StepPlan:
        if state.step == 0 or (self.refresh_interval is not None and refresh_due(state, self.refresh_interval)):
            return full_plan(state)
        gen = (slots(state) >= state.prompt_len).expand(state.batch, -1)
        need = gen | with_predecessors(region_mask(state, region) & state.is_masked(), state.logit_shift)
        return StepPlan(compute=compute_from_mask(need, state, region), key_mask=state.key_mask())


@dataclass(frozen=True)
class DKVPrefillDecode(_Delayed):
    refresh_interval: int | None = None  # generation-region refresh; None: 8 (LLaDA) / 4 (Dream)
    prompt_refresh_interval: int | None = None  # None: the prompt is never recomputed (the paper)

    name: ClassVar[str] = "dkv_pd"

    def __post_init__(self) -> None:
        check_count(f"cache {self.name!r}", "refresh_interval", self.refresh_interval, optional=True)
        check_count(f"cache {self.name!r}", "prompt_refresh_interval", self.prompt_refresh_interval, optional=True)

    def plan(self, state: DecodeState, region: tuple[int, int]) -> StepPlan:
        prev = self._previous(state)
        masked = state.is_masked()
        p_int = self.prompt_refresh_interval
        if prev is None or state.step == 0 or (p_int is not None and refresh_due(state, p_int)):
            plan = full_plan(state)
        elif refresh_due(state, self.refresh_interval or default_interval(state)):
            gen = (slots(state) >= state.prompt_len).expand(state.batch, -1)
            need = gen | with_predecessors(region_mask(state, region) & masked, state.logit_shift)
            plan = StepPlan(compute=compute_from_mask(need, state, region), key_mask=state.key_mask())
        else:
            plan = self._delayed_plan(state, region, prev)
        self._remember(state, masked)
        return plan
