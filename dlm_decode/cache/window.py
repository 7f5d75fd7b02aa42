"""Window-Diffusion cache: phases of one refresh, then pruned steps over a local window.

References: vhicrgit/Window-Diffusion, ``llada/llada_window_diffusion.py`` (``generate`` with ``window_size`` = the
refresh cycle, ``window_tokens``, ``active_tokens``) and ``dream/model/generation_utils.py``
(``nearest_sample_fast_v2_cache`` with ``o_win_size`` = ``window_tokens``, ``i_win_size`` = ``active_tokens``,
``refresh_cycle``). Decoding runs in phases of ``refresh_cycle`` steps. A phase's first step is one forward that
stores K/V and whose logits decide that step's commits. After it the **window** is fixed for the phase: every decoded
token (prompt included) plus the first ``window_tokens`` masks; masks farther right (the far field) are dropped. Every
other step of the phase runs only the **active** slots -- the first ``active_tokens`` masks, the tokens decoded during
the phase (and, once, the tokens decoded by the phase's first step) -- whose fresh K/V are written back, against the
cached window; only the active masks may be committed (``StepPlan.candidates``).

``prune_refresh`` picks the phase's first step:
- ``False`` (default; the LLaDA reference): one full forward over the whole canvas stores every slot's K/V, may
  commit any mask, and the window is taken after its commits. ``refresh_cycle=1`` then reproduces decoding without
  a cache.
- ``True`` (the Dream reference): the far field never enters the model. The first step computes only the
  window (decoded tokens + the first ``window_tokens`` masks, taken before that step's commits) attending to itself,
  as the reference runs ``x[:, :window_end]``; its commits are restricted to the window's masks, and the window stays
  the slots just computed. With ``window_tokens`` >= the masks left this is the full forward. It is much cheaper on
  long generations, but the model no longer sees how many masks remain: on demo-llada (gen 256, block 32) it kept
  only 28% of the no-cache tokens and ``threshold`` needed 2.2x the forwards, so it is not
  the default for either model (record ``benchmarks/results/caches-window-prune.md`` of commit ba619d8).

Differences, on purpose: the reference has no blocks; here phases restart at every block start (with the reference's
single block, ``block_length = gen_length``, that is the same) so a row decodes alike alone and in a batch. Queries
also see their own fresh keys when an active slot lies outside the window (the reference drops them; identical
whenever the phase decodes fewer than ``window_tokens - active_tokens`` tokens). At a block's last allowed step every
masked slot of the sampler's region is computed too, so the loop can finish the block. With Dream's shift the slot
before each active mask is computed as well. The reference's Dream variant commits only the first mask at a full
step; we follow the LLaDA variant for both models. Sampler counts are unchanged (a fixed schedule or Dream's count
still counts every mask); a count larger than the active masks commits only those, and an all-in commit (a row
stopping early) fills only the active masks with proposals, the loop fills the rest.

How the keys are read (the same attention each way; option ``keys``): ``auto`` (default) reads them, when they are
one run of slots shared by every row (a batch of one decoding in blocks: the prompt, the decoded tokens and the first
masks), as a view of that run of the store, so attention costs the window's length, not the canvas's; otherwise
gathered (``key_index``) while the window holds at most half of the canvas (``GATHER_AT_MOST``), and past that (long
prompts, late in a long generation) as the whole canvas with the far field masked out, which avoids a per-layer gather
that cost more than it saved (measured at gen 1024, demo model). ``gather`` and ``mask`` force one way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from dlm_decode.cache.base import CachePolicy, StepPlan
from dlm_decode.cache.plans import (
    compute_from_mask,
    full_plan,
    keys_from_mask,
    mask_ranks,
    region_mask,
    shared_run,
    with_predecessors,
)
from dlm_decode.core.state import DecodeState
from dlm_decode.options import check_count

GATHER_AT_MOST = 0.5  # auto: gather the window's keys only while they are at most this share of the canvas
KEY_READS = ("auto", "gather", "mask")  # how pruned steps read the window's keys (the same attention each way)


@dataclass(frozen=True)
class WindowCache(CachePolicy):
    refresh_cycle: int = 32  # steps per phase (one full forward each)
    window_tokens: int = 64  # masks kept visible in attention during a phase (besides every decoded token)
    active_tokens: int = 16  # masks recomputed (and committable) at each pruned step
    prune_refresh: bool = False  # True: a phase's first step computes only the window (Dream reference)
    keys: str = "auto"  # auto: a view of one shared run, else a gather or a mask by the window's share; or force one

    name: ClassVar[str] = "window"

    def __post_init__(self) -> None:
        for key in ("refresh_cycle", "window_tokens", "active_tokens"):
            check_count(f"cache {self.name!r}", key, getattr(self, key))
        if not isinstance(self.prune_refresh, bool):
            raise ValueError(f"cache {self.name!r}: prune_refresh must be true or false, got {self.prune_refresh!r}")
        if self.keys not in KEY_READS:
            raise ValueError(f"cache {self.name!r}: keys must be one of {', '.join(KEY_READS)}, got {self.keys!r}")

    def count_bounds(self, block, block_steps, gen_length, prompt) -> dict[str, tuple[int, str]]:
        return {  # masks of the generation; steps of a block
            "window_tokens": (gen_length, "the gen length"),
            "active_tokens": (gen_length, "the gen length"),
            "refresh_cycle": (block_steps, "the steps of one block"),
        }

    def _memory(self, state: DecodeState) -> dict[str, Any]:
        mem = state.scratch.get(f"cache/{self.name}")
        if mem is None:  # one set of [B, T] buffers per call, reused in place
            z = torch.zeros_like(state.valid)
            mem = {k: z.clone() for k in ("window", "phase_decoded", "once", "masked")}
            mem["phase_start"] = False
            state.scratch[f"cache/{self.name}"] = mem
        return mem

    def plan(self, state: DecodeState, region: tuple[int, int]) -> StepPlan:
        mem = self._memory(state)
        masked = state.is_masked()
        mem["masked"].copy_(masked)
        start = state.block_step % self.refresh_cycle == 0
        mem["phase_start"] = start
        if start and not self.prune_refresh:
            return full_plan(state)
        live = state.valid & ~state.finished[:, None]
        in_region = region_mask(state, region)
        last = state.block_step + 1 >= state.block_limit  # last allowed step: every region mask, nothing restricted
        if start:  # pruned phase start: the window computes itself; the far field stays out of the model
            window = self._window(state, masked)  # [B, T]
            mem["window"].copy_(window)
            targets = masked & in_region if last else masked & in_region & window
            candidates = None if last else window & masked
            need = window | with_predecessors(targets, state.logit_shift)
            return self._step(state, region, need & live, window, candidates, refresh=True)
        active = masked & (mask_ranks(masked) <= self.active_tokens) & live  # [B, T]
        if last:
            targets, candidates = active | (masked & in_region), None
        else:
            targets, candidates = active, active
        need = targets | with_predecessors(targets & in_region, state.logit_shift)
        need = (need | mem["phase_decoded"] | mem["once"]) & live
        return self._step(state, region, need, mem["window"], candidates)

    def _window(self, state: DecodeState, masked: torch.Tensor) -> torch.Tensor:  # [B, T]
        """Every decoded slot (prompt included) plus each row's first ``window_tokens`` masks."""
        return state.valid & (~masked | (mask_ranks(masked) <= self.window_tokens))

    def _step(self, state, region, need, window, candidates, refresh=False) -> StepPlan:
        """Compute ``need`` [B, T] against the keys ``window | need``: a view of one shared run, a gather or a mask."""
        keys = (window | need) & state.valid  # [B, T]
        run = shared_run(keys) if self.keys == "auto" else None
        if run is not None:  # one run of slots for every row (batch of one, block decoding): a view of the store
            key_index, key_mask = run, None
        elif self.keys == "mask" or (self.keys == "auto" and int(keys.sum(1).max()) > GATHER_AT_MOST * keys.shape[1]):
            # mostly visible: mask the canvas, no gather
            key_index, key_mask = None, keys
        else:
            key_index, key_mask = keys_from_mask(keys)
        return StepPlan(
            compute=compute_from_mask(need, state, region),
            key_mask=key_mask,
            key_index=key_index,
            candidates=candidates,
            refresh=refresh,
        )

    def after_step(self, state: DecodeState, committed: torch.Tensor) -> None:
        mem = self._memory(state)
        masked = state.is_masked()
        decoded = mem["masked"] & ~masked  # committed or filled during this step
        if mem["phase_start"]:
            if not self.prune_refresh:  # the full forward stored every slot: the window is taken after its commits
                mem["window"].copy_(self._window(state, masked))
            mem["once"].copy_(decoded)
            mem["phase_decoded"].zero_()
        else:
            mem["phase_decoded"] |= decoded
            mem["once"].zero_()
