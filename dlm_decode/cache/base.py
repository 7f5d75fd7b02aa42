"""The cache-policy interface and registry.

A cache remembers; it never decides what to commit. Per step, a policy returns a ``StepPlan``: which canvas slots
the model recomputes (their fresh K/V are written into the call's ``KVStore``), and which keys the queries see.
The model attends over the store, so it never knows which policy runs. ``none`` recomputes every slot every step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from dlm_decode.core.config import DecodeConfig
from dlm_decode.core.state import DecodeState
from dlm_decode.options import build, resolve

CACHES: dict[str, str] = {
    "none": "dlm_decode.cache.base:NoCache",
    "prefix": "dlm_decode.cache.prefix:PrefixCache",
    "dual": "dlm_decode.cache.dual:DualCache",
    "dkv_decode": "dlm_decode.cache.dkv:DKVDecode",
    "dkv_greedy": "dlm_decode.cache.dkv:DKVGreedy",
    "dkv_prefill": "dlm_decode.cache.dkv:DKVPrefill",
    "dkv_pd": "dlm_decode.cache.dkv:DKVPrefillDecode",
    "window": "dlm_decode.cache.window:WindowCache",
}


@dataclass(frozen=True)
class StepPlan:
    compute: slice | torch.Tensor  # a slice of slots shared by all rows, or [B, Q] sorted slot ids
    key_mask: torch.Tensor | None  # [B, T] (or [B, W] with key_index) bool, True = visible; None = all visible
    # [B, W] slots whose K/V the queries attend to (pruning), or a slice: one run of slots shared by every row, read as
    # a view of the store (then key_mask is None: every slot of the run is visible)
    key_index: torch.Tensor | slice | None = None
    write: bool = True  # False: attend to the fresh K/V of the computed slots without storing them
    refresh: bool = False  # True when this step recomputes every slot (statistics)
    # [B, T] bool: the only slots the sampler may commit this step (the policy computed their logits; the loop gives
    # the region's other slots flat logits and never commits them). None: every masked slot of the region. Must be
    # None at the block's last allowed step (``state.block_limit``), where the loop finishes the block.
    candidates: torch.Tensor | None = None


@dataclass(frozen=True)
class CachePolicy:
    name: ClassVar[str] = "base"
    uses_store: ClassVar[bool] = True

    def check(self, config: DecodeConfig, sampler: Any, facts: Any) -> None:
        """Validate against the decoding config, the sampler and the model's ``core.request.ModelFacts`` (None when
        unknown), before any work."""

    def begin_block(self, state: DecodeState) -> None:
        """Called at each block start (after the sampler's ``begin_block``)."""

    def plan(self, state: DecodeState, region: tuple[int, int]) -> StepPlan:
        """Slots to recompute this step; must cover the hidden states behind every masked slot of ``region``."""
        raise NotImplementedError

    def after_step(self, state: DecodeState, committed: torch.Tensor) -> None:
        """``committed`` [B, T] bool: slots written this step."""


@dataclass(frozen=True)
class NoCache(CachePolicy):
    """Recompute the whole canvas every step (the references' default)."""

    name: ClassVar[str] = "none"
    uses_store: ClassVar[bool] = False

    def plan(self, state: DecodeState, region: tuple[int, int]) -> StepPlan:
        return StepPlan(compute=slice(0, state.total_length), key_mask=state.key_mask(), refresh=True)


def get_cache(name: str | CachePolicy | None, options: dict[str, Any] | None = None) -> CachePolicy:
    """A cache policy by registered name with options, or an instance passed through; None means ``none``."""
    if name is None:
        name = "none"
    if isinstance(name, CachePolicy):
        if options:
            raise ValueError("options given together with a cache instance; use dataclasses.replace instead")
        return name
    return build(resolve(CACHES, name, "cache"), options, "cache")


def register_cache(name: str, target: str) -> None:
    CACHES[name] = target
