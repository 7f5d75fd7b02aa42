"""d3LLM's delayed K/V cache (hao-ai-lab/d3LLM, ``generate_multi_block_kv_cache`` in
``d3llm/d3llm_LLaDA/d3llm_llada_generate_util.py``), an approximate cache for bidirectional models.

Blocks lie on the grid of ``core.frontier`` (the prompt is block 0, answer blocks of ``block_length`` from the
prompt's end). A row's cached prefix grows a whole block at a time, in order: once the first block after it has no
MASK left, it *stabilizes* for ``cache_delay_iter`` steps, then the step's forward computes from the prefix's end on
and the block's K/V are kept as part of the prefix. Per step, per row, as the reference decides at the start of the
step (``nfe``: the row's 1-based forward number, counting the forwards it takes part in, so a row waiting for
its batch mates at a block end decides as it would alone):

* the first uncached block is done and has waited ``cache_delay_iter`` steps: it joins the prefix (with a delay of 0
  every done block after it too); this forward computes from the old prefix end on, against the cached prefix;
* it is done but still waiting (stabilizing): a full forward, whose K/V refresh the cached prefix;
* else a forward from the prefix end on against the cached prefix, or a full refresh when ``refresh_interval``
  divides ``nfe``;
* before the row's first cache write (the reference's ``past_key_values`` is None) every forward is full.

The computed slots' K/V are written into the store each step (slots past the prefix are recomputed before they are
read, so only the prefix is ever read from it). With d3LLM's early stop, blocks after the one holding the first end
id never join the prefix (the reference creates them already "cached" and skips them). With Dream's shifted logits
the slot before the prefix end is recomputed too (its hidden state predicts the first uncached slot). Works with
any sampler, block by block or with several blocks in flight. The references' settings: ``cache_delay_iter`` 1
(LLaDA) or 1-2 (Dream), ``refresh_interval`` 10000 (never); the reference function's own default delay, 10000,
never caches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from dlm_decode.cache.base import CachePolicy, StepPlan
from dlm_decode.cache.plans import compute_from_mask, slots
from dlm_decode.core.frontier import first_eos_slot
from dlm_decode.core.state import DecodeState
from dlm_decode.options import check_count, is_int


@dataclass(frozen=True)
class DelayedCache(CachePolicy):
    cache_delay_iter: int = 1  # steps a done block waits before it joins the cached prefix
    refresh_interval: int | None = None  # full refreshes every N forwards of the call (None: never)

    name: ClassVar[str] = "delayed"

    def __post_init__(self) -> None:
        if not is_int(self.cache_delay_iter) or self.cache_delay_iter < 0:
            raise ValueError(
                f"cache {self.name!r}: cache_delay_iter must be an integer >= 0 (steps a done block waits), "
                f"got {self.cache_delay_iter!r}"
            )
        check_count(f"cache {self.name!r}", "refresh_interval", self.refresh_interval, optional=True)

    def count_bounds(self, block, block_steps, gen_length, prompt) -> dict[str, tuple[int, str]]:
        return {}  # both count forwards of the whole call; a count past the call's end means "never" (the reference's)

    def plan(self, state: DecodeState, region: tuple[int, int]) -> StepPlan:
        memo = self._memory(state)
        nfe = state.stats.row_steps + 1  # [B] each row's forward number (a row waiting in a batch does not count)
        start = memo["cached"]  # [B] this forward computes from the old prefix end, unless it is full
        cached, seen, joined = self._scan(state, memo["cached"], memo["seen"], nfe)
        end = self._first_block_end(state, cached)
        waiting = (end > cached) & ~self._masked_in(state, cached, end)  # a done block waits out its delay
        due = nfe % self.refresh_interval == 0 if self.refresh_interval is not None else torch.zeros_like(joined)
        full = ~joined & (~memo["stored"] | waiting | due)  # no store yet, stabilizing, or a periodic refresh
        memo.update(cached=cached, seen=seen, stored=memo["stored"] | joined)  # a first join creates the store
        start = torch.where(full, 0, start - state.logit_shift).clamp(min=0)
        need = (slots(state)[None, :] >= start[:, None]).expand(state.batch, -1)
        return StepPlan(
            compute=compute_from_mask(need, state, region), key_mask=state.key_mask(), refresh=bool((start == 0).all())
        )

    def _scan(self, state: DecodeState, cached: torch.Tensor, seen: torch.Tensor, nfe: torch.Tensor):
        """The reference's scan over the blocks after the prefix, in order: a done block is stamped when first seen
        and joins once it has waited ``cache_delay_iter`` forwards; the scan of a row stops at its first block that
        has a MASK or still waits. -> (prefix ends [B], stamps [B], rows whose prefix grew [B])."""
        cap = self._cap(state)
        joined = torch.zeros_like(cached, dtype=torch.bool)
        while True:
            end = self._first_block_end(state, cached)
            done = (end > cached) & ~self._masked_in(state, cached, end)
            seen = torch.where(done & (seen < 0), nfe, seen)
            join = done & (nfe - seen >= self.cache_delay_iter) & (end <= cap)
            if not bool(join.any()):
                return cached, seen, joined
            cached, seen, joined = torch.where(join, end, cached), torch.where(join, -1, seen), joined | join

    def report(self, state: DecodeState) -> dict[str, Any]:
        memo = state.scratch.get(self.name)
        return {} if memo is None else {"cached_slots": memo["cached"].tolist()}

    def _memory(self, state: DecodeState) -> dict[str, torch.Tensor]:
        memo = state.scratch.get(self.name)
        if memo is None:
            zeros = torch.zeros(state.batch, dtype=torch.long, device=state.device)
            # the prompt, the first block, counts as done at forward 0 (the reference's ``completed_at_nfe`` 0)
            memo = {"cached": zeros, "seen": zeros.clone(), "stored": torch.zeros_like(zeros, dtype=torch.bool)}
            state.scratch[self.name] = memo
        return memo

    def _first_block_end(self, state: DecodeState, cached: torch.Tensor) -> torch.Tensor:
        """[B] the end of the first block after the cached prefix (the prompt, then the answer grid)."""
        p, b = state.prompt_len, state.block_length
        nxt = torch.where(cached < p, p, cached + b)
        return torch.minimum(nxt, torch.full_like(nxt, state.total_length))

    def _masked_in(self, state: DecodeState, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        """[B] some slot of ``[lo, hi)`` is a MASK."""
        idx = slots(state)[None, :]
        return (state.is_masked() & (idx >= lo[:, None]) & (idx < hi[:, None])).any(1)

    def _cap(self, state: DecodeState) -> torch.Tensor:
        """[B] how far the prefix may grow: the canvas, or with d3LLM's early stop the end of the block holding the
        row's first end id."""
        cap = torch.full((state.batch,), state.total_length, dtype=torch.long, device=state.device)
        rule = getattr(state.cursor.frontier, "rule", None)
        if rule is None or not rule.early_stop or rule.selection != "global":
            return cap
        p, b = state.prompt_len, state.block_length
        hit, first = first_eos_slot(state)
        end = p + (torch.div(first - p, b, rounding_mode="floor") + 1) * b
        return torch.where(hit, end, cap)
