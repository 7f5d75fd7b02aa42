"""The cache-policy interface (the registry is ``registry.py``).

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
    # a ``cache.depth_plan.DepthProgram`` (Elastic-Cache): the model runs its layers depth-aware, the compute set
    # widening per row from the layer whose attention drifted; None: every layer computes ``compute``
    layers: Any = None


STEP_COUNTS = ("refresh_interval", "prompt_refresh_interval")  # options counting steps of a block


@dataclass(frozen=True)
class CachePolicy:
    name: ClassVar[str] = "base"
    uses_store: ClassVar[bool] = True
    # True: the policy has a rule for block-causal models (LLaDA2); the others are refused before any work
    block_causal_rule: ClassVar[bool] = False
    # the only samplers the policy runs with (it reads their state, e.g. ``sub_block`` the sub-blocks of
    # ``fast_dllm_v2``); empty: any sampler. Loops over every cache (the demo, the shared cache tests) skip the others.
    samplers: ClassVar[tuple[str, ...]] = ()

    def check(self, config: DecodeConfig, sampler: Any, facts: Any) -> None:
        """Validate against the decoding config, the sampler and the model's ``core.inputs.ModelFacts`` (None when
        unknown), before any work. Subclasses that override it call it too."""
        if facts is not None and getattr(facts, "block_causal", False) and not self.block_causal_rule:
            raise ValueError(
                f"cache {self.name!r} does not apply to the block-causal model {facts.model_type!r}: a finished "
                "block's keys and values never change there, so its cache is exact; use --cache prefix (the "
                "default for these models: finished blocks cached exactly, no extra forward) or none"
            )
        name = getattr(sampler, "name", None)
        if self.samplers and name not in self.samplers:
            raise ValueError(
                f"cache {self.name!r} runs with the {' or '.join(self.samplers)} sampler only, not {name!r}"
            )

    @classmethod
    def runs_with(cls, sampler: str) -> bool:
        """Whether the policy runs with the sampler called ``sampler`` (``samplers``)."""
        return not cls.samplers or sampler in cls.samplers

    def count_bounds(
        self, block: int, block_steps: int, gen_length: int, prompt: int | None
    ) -> dict[str, tuple[int, str]]:
        """Options that count tokens or steps: option -> (bound, what it is), checked by ``options.check_bounded``
        (``Sampler.count_bounds``; ``prompt``: the shortest prompt, None when not known yet). By default each refresh
        interval (``STEP_COUNTS``, steps of a block) is bounded by the steps a block takes."""
        return {k: (block_steps, "the steps of one block") for k in STEP_COUNTS if hasattr(self, k)}

    def begin_block(self, state: DecodeState) -> None:
        """Called at each block start (after the sampler's ``begin_block``)."""

    def plan(self, state: DecodeState, region: tuple[int, int]) -> StepPlan:
        """Slots to recompute this step; must cover the hidden states behind every masked slot of ``region``."""
        raise NotImplementedError

    def after_step(self, state: DecodeState, committed: torch.Tensor) -> None:
        """``committed`` [B, T] bool: slots written this step."""

    def report(self, state: DecodeState) -> dict[str, Any]:
        """The policy's own statistics of the call (``GenerateOutput.cache_stats``); empty by default."""
        return {}
