"""Fast-dLLM v2's sub-block cache (Wu et al. 2025, "Fast-dLLM v2: Efficient Block-Diffusion LLM"; the hierarchical
cache's second level), an **approximate** cache inside the current block of a block-causal model.

Reference: ``use_block_cache=True`` in NVlabs/Fast-dLLM ``v2/generation_functions.py`` ``batch_sample`` and the hub
``modeling.py``. Earlier blocks are cached exactly (as with ``prefix`` here). Inside the current block: a step whose
sub-block's first slot is still a MASK (and the block's first decoding step) forwards the whole block and keeps its
keys and values (the block cache); any other step forwards only the sub-block's slots, overwrites their keys and values
in that block cache in place and attends to the earlier blocks and the whole block cache, so the block's other slots
are served as they were at the sub-block's start (stale where later commits changed them).

Here: the step plan is the exact cache's (``cache.plans.exact_block_plan``) at a block's first step and for a row's
full-block steps; otherwise only the row's current sub-block is computed, its K/V written into the store in place, and
the rest of its grid block read from the store. The sub-block boundaries are the ``fast_dllm_v2`` sampler's (the only
sampler it runs with). One step more is full here: where the block's first slot was committed alone in the block's
first forward (the reference's cache-write forward, ``samplers/fast_dllm_v2.py``), the next step recomputes the whole
block, as the reference's first sub-block step does (its block cache starts empty there). The finished block's final
keys and values are written exactly by the next block's first forward, as with ``prefix``.

Tokens: the reference's ``use_block_cache=True`` tokens at temperature 0 (tested against its re-statement), which
differ from the exact cache's where the stale keys change a commit. In a batch each row decides full or sub-block by
itself (the reference recomputes the whole block for every row when any row's sub-block starts with a MASK), so each
row decodes what it decodes alone. Registered as ``sub_block`` (``--cache sub_block``, ``cache="sub_block"``), refused
before any work on a bidirectional model and with any other sampler (``samplers``; the demo and the loops over every
cache skip it there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from dlm_decode.cache.base import CachePolicy, StepPlan
from dlm_decode.cache.plans import compute_from_mask, exact_block_plan, slots
from dlm_decode.core.state import DecodeState

#: the scratch key where the ``fast_dllm_v2`` sampler leaves its sub-block size
SUB_BLOCK_KEY = "fast_dllm_v2.small_block_size"


@dataclass(frozen=True)
class SubBlockCache(CachePolicy):
    name: ClassVar[str] = "sub_block"
    block_causal_rule: ClassVar[bool] = True
    samplers: ClassVar[tuple[str, ...]] = ("fast_dllm_v2",)  # its sub-blocks are that sampler's

    def check(self, config, sampler, facts) -> None:
        if facts is not None and not facts.block_causal:
            raise ValueError(
                f"cache {self.name!r} is Fast-dLLM v2's sub-block cache: it applies to block-causal models decoded "
                f"with the fast_dllm_v2 sampler, not to the bidirectional {facts.model_type!r} model; use --cache "
                "prefix, dual or another cache of docs/caches.md"
            )
        super().check(config, sampler, facts)

    def plan(self, state: DecodeState, region: tuple[int, int]) -> StepPlan:
        key = f"{self.name}.lead"
        start = state.block_end - state.block_length  # [B] each row's grid block start
        idx = slots(state)[None, :]  # [1, T]
        masked = state.block_masked()  # [B, T]
        if state.block_step == 0:  # the exact plan; rows whose block starts with a MASK recompute it next step too
            state.scratch[key] = masked.gather(1, start.clamp(min=0)[:, None])[:, 0]
            return exact_block_plan(state, region)
        size = state.scratch[SUB_BLOCK_KEY]
        sub = torch.div(idx - start[:, None], size, rounding_mode="floor")  # [B, T]
        has = masked.any(1)  # [B] rows still decoding their block (the others compute nothing)
        big = torch.iinfo(sub.dtype).max
        current = torch.where(has, torch.where(masked, sub, big).min(1).values, 0)  # [B] first sub-block with a MASK
        sub_start = (start + current * size).clamp(0, state.total_length - 1)  # [B]
        full = masked.gather(1, sub_start[:, None])[:, 0]  # [B] its first slot still masked
        if state.block_step == 1:
            full = full | state.scratch[key]
        block = (idx >= start[:, None]) & (idx < state.block_end[:, None]) & has[:, None]  # [B, T]
        part = block & (sub == current[:, None])
        need = torch.where(full[:, None], block, part)
        return StepPlan(compute=compute_from_mask(need, state, region), key_mask=state.key_mask())
