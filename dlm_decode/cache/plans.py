"""Building blocks shared by the cache policies: compute sets as slices or padded ``[B, Q]`` index tensors.

A policy describes what to recompute as a ``[B, T]`` bool mask (``need``); ``compute_from_mask`` turns it into the
cheapest form ``denoise`` accepts: one slice when every row needs the same contiguous run of slots (batch 1 nearly
always), else per-row sorted slot ids padded to a common ``Q`` with duplicates of the row's last id. Duplicates never
change a result: the store holds each slot once (the duplicate writes the same K/V again), keys are read from the
store, and the region lookup takes the first copy. Padding with extra real slots would refresh their K/V and make a
row's output depend on its batch mates.
"""

from __future__ import annotations

import torch

from dlm_decode.cache.base import StepPlan
from dlm_decode.core.state import DecodeState


def full_plan(state: DecodeState) -> StepPlan:
    """Recompute every slot and store all K/V (a refresh)."""
    return StepPlan(compute=slice(0, state.total_length), key_mask=state.key_mask(), refresh=True)


def refresh_due(state: DecodeState, interval: int | None) -> bool:
    """Refresh at each block start and, with an interval, every ``interval`` steps of the block."""
    return state.block_step == 0 or (interval is not None and state.block_step % interval == 0)


def slots(state: DecodeState) -> torch.Tensor:  # [T]
    return torch.arange(state.total_length, device=state.device)


def block_starts(state: DecodeState) -> torch.Tensor:  # [B] each row's own block start
    starts = getattr(state, "block_starts", None)
    if starts is None:
        return torch.full((state.batch,), state.block_start, dtype=torch.long, device=state.device)
    return starts


def region_mask(state: DecodeState, region: tuple[int, int]) -> torch.Tensor:  # [B, T]
    idx = slots(state)
    return ((idx >= region[0]) & (idx < region[1])).expand(state.batch, -1)


def with_predecessors(targets: torch.Tensor, shift: int) -> torch.Tensor:  # [B, T]
    """``targets`` plus the slots whose hidden states predict them (slot i - shift; Dream: shift 1)."""
    if shift == 0:
        return targets
    out = targets.clone()
    out[:, :-shift] |= targets[:, shift:]
    return out


def mask_ranks(masked: torch.Tensor) -> torch.Tensor:  # [B, T]: 1 for a row's first MASK, 2 for its second, ...
    return masked.long().cumsum(1) * masked


def rows_to_index(need: torch.Tensor, width: int | None = None) -> torch.Tensor:
    """[B, T] bool -> [B, Q] sorted slot ids per row, Q = the largest row count, padded with the row's last id.

    A row that needs nothing (finished) computes the last slot Q times; nothing reads its result. ``width``: Q when
    the caller already knows a bound on every row's count (no host sync); None: counted here.
    """
    b, t = need.shape
    counts = need.sum(1)  # [B]
    q = max(int(counts.max()) if width is None else width, 1)
    col = torch.where(need, need.long().cumsum(1) - 1, q)  # [B, T] target column; q collects the unneeded
    out = torch.full((b, q + 1), t - 1, dtype=torch.long, device=need.device)
    out.scatter_(1, col, torch.arange(t, device=need.device).expand(b, t))
    out = out[:, :q]
    last = out.gather(1, (counts - 1).clamp(min=0)[:, None])  # [B, 1]
    last = torch.where(counts[:, None] > 0, last, t - 1)
    return torch.where(torch.arange(q, device=need.device)[None, :] < counts[:, None], out, last)


def shared_run(mask: torch.Tensor) -> slice | None:
    """[B, T] bool -> ``slice(c0, c1)`` when every row's True slots are exactly ``[c0, c1)``, else None."""
    t = mask.shape[1]
    idx = torch.arange(t, device=mask.device)
    lo = torch.where(mask, idx, t).min(1).values  # [B]
    hi = torch.where(mask, idx + 1, 0).max(1).values
    stats = torch.stack([lo.min(), lo.max(), hi.min(), hi.max(), (mask.sum(1) - (hi - lo)).abs().max()]).tolist()
    c0, c1 = stats[0], stats[2]
    return slice(c0, c1) if stats[0] == stats[1] and stats[2] == stats[3] and stats[4] == 0 and c1 > c0 else None


def compute_from_mask(need: torch.Tensor, state: DecodeState, region: tuple[int, int]) -> slice | torch.Tensor:
    """A slice when every row needs the same contiguous run of slots and it holds the hidden state behind every
    region slot (``denoise`` insists on that for slices), else ``rows_to_index(need)``."""
    run = shared_run(need)
    if (
        run is not None
        and run.start <= max(region[0] - state.logit_shift, 0)
        and run.stop >= region[1] - state.logit_shift
    ):
        return run
    return rows_to_index(need)


def keys_from_mask(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, T] visible keys -> key_index [B, W] and key_mask [B, W] (padding entries hidden, never duplicated)."""
    index = rows_to_index(keys)
    counts = keys.sum(1, keepdim=True)
    visible = torch.arange(index.shape[1], device=keys.device)[None, :] < counts
    return index, visible


def whole_block_end(state: DecodeState, end: torch.Tensor) -> torch.Tensor:
    """[B] ``end`` [B] rounded up to the end of its grid block (a cut may end a row's canvas inside a block, whose
    filled slots the block's queries still see): the answer grid from ``P`` under D2F's attention, the row's
    absolute grid on a block-causal model."""
    b = state.block_length
    if state.inputs.answer_blocks is not None:
        off = torch.full_like(end, state.prompt_len)
    elif state.inputs.grid_offset is not None:
        off = state.inputs.grid_offset
    else:
        return end
    whole = off + torch.div(end - off + b - 1, b, rounding_mode="floor") * b
    return torch.clamp(torch.maximum(whole, end), max=state.total_length)


def block_causal_window(state: DecodeState, region: tuple[int, int]) -> StepPlan:
    """No cache on a block-causal model (or D2F's attention): every slot up to the end of the widest open block
    (later blocks are invisible to it)."""
    km = state.key_mask()
    end = int(whole_block_end(state, state.block_end).max())
    end = max(end, region[1])
    return StepPlan(compute=slice(0, end), key_mask=None if km is None else km[:, :end], refresh=True)


def exact_block_plan(state: DecodeState, region: tuple[int, int]) -> StepPlan:
    """The exact K/V cache of a block-causal model, with no extra forward: each step recomputes the row's current
    grid block (its prompt slots too: they attend to the block's answer); a block's first step also recomputes the
    previous block (the call's first step: everything before), whose final K/V are written there, exactly."""
    end = state.block_end  # [B] the grid block's end
    grid_start = end - state.block_length  # [B]
    if state.block_step == 0:
        grid_start = (grid_start - state.block_length).clamp(min=0) if state.block_index else grid_start * 0
    idx = slots(state)[None, :]
    need = (idx >= grid_start[:, None]) & (idx < end[:, None])  # [B, T]
    return StepPlan(compute=compute_from_mask(need, state, region), key_mask=state.key_mask())


def exact_tracked_plan(state: DecodeState, region: tuple[int, int], key: str = "prefix/exact") -> StepPlan:
    """The exact cache under block-causal attention with several blocks in flight (a block-causal model, or D2F's
    attention, ``core.frontier``) or D2F's attention block by block: each row recomputes from the first slot whose
    stored K/V may be stale to the end of its last open block. K/V a forward writes are final for the blocks that,
    with every block before them, had no MASK at that forward (nothing they see changes any more), so the next
    step starts at the row's first block that still had one (D2F: a finished block is cached once every earlier
    block is done, written by the next step's forward, no extra forward). Dream's shift: the slot before that block
    is recomputed too (its hidden state predicts the block's first slot; its K/V are final, so rewriting them
    changes nothing). ``state.scratch[key]``: [B] the slot up to which the store is final."""
    starts = block_starts(state)  # [B] each row's first open block with a MASK
    exact = state.scratch.get(key)
    if exact is None:
        exact = torch.zeros_like(starts)  # the first forward computes everything up to the open blocks' end
    lo = torch.minimum(exact, starts - state.logit_shift).clamp(min=0)
    idx = slots(state)[None, :]
    need = (idx >= lo[:, None]) & (idx < whole_block_end(state, state.block_end)[:, None])  # [B, T]
    state.scratch[key] = torch.maximum(exact, starts)
    return StepPlan(compute=compute_from_mask(need, state, region), key_mask=state.key_mask())
