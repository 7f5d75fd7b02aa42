"""The decode loop's parts: a ``Unit`` of rows decoded together, how it moves from block to block, and its step.

A ``Unit`` is one ``DecodeState`` with its sampler, cache policy and K/V store: ``generate``'s whole batch (its rows
share block boundaries, as the references' batched loops do), or one request of the engine (``decode.scheduler``,
``engine``). The scheduler is the one loop: every step it ``advance``s each unit (closing a block whose rows have no
MASK left and opening the next, so a unit never waits for another), runs ``prepare_step`` for each, one forward for
all of them that can share one (``decode.merged``), and ``finish_step`` for each. ``step`` is the three for one unit
with its own forward.

``advance``: ``begin_block`` (the cursor, the sampler's and the cache's set-up, the step bound) when a block opens;
a block ends when no row has a MASK left in it (one host sync per step: that test, which also brings back the most
masks a row has left). ``prepare_step``: the cache plans which slots to recompute and the sampler may draft;
``forward_one``: one forward gives aligned logits for the sampler's region (``forward.region_logits``, narrowed to
the rows and slots a sampler that reads only its candidates needs, sized by the test's counts); ``finish_step``: the
sampler selects, ``commit_mask`` decides what is written, then the cut, all-in and EOS rules and the statistics.
The step itself never waits for the device unless a progress bar asks.

Draft-and-verify samplers (``Sampler.draft`` returns ``Drafts``): the step's one forward runs the current canvas and
its D drafts side by side (batch ``B * (1 + D)``, each row's copies against that row's cache under the same plan; a
cache store is copied per draft and the copies are dropped), and ``Sampler.verify`` selects instead of ``select``.
Everything after the selection is the ordinary step; ``nfe`` counts the forward once (the sequential forwards) and
``token_forwards`` counts every canvas's query slots (the compute).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from dlm_decode.cache import CachePolicy, KVStore, StepPlan
from dlm_decode.core import frontier
from dlm_decode.core.state import DecodeState
from dlm_decode.decode.blocks import grid_block_end, stop_after_eos_block
from dlm_decode.decode.commit import all_in, commit_mask, cut, fail_nonfinite, record, stop_at_eos, stop_rows
from dlm_decode.decode.forward import StepMasks, Subset, subset
from dlm_decode.decode.forward import draft_logits as _forward_drafts
from dlm_decode.decode.forward import region_logits as _forward
from dlm_decode.models.graphs import fixed_shapes
from dlm_decode.samplers import Sampler
from dlm_decode.samplers.base import Drafts, candidates, editable


@dataclass
class Unit:
    """Rows decoded together: their state, sampler, cache policy and K/V store (None when the cache keeps none).
    ``store_row``: the unit's row in the scheduler's shared store (``cache.arena``), when it has one; units there
    can share a forward (``decode.merged``)."""

    state: DecodeState
    sampler: Sampler
    cache: CachePolicy
    store: KVStore | None
    bar: Any = None  # a tqdm bar counting committed slots, or None
    store_row: int | None = None
    in_block: bool = False  # a block is open (``begin_block`` ran, its end has not been reached)
    masks: StepMasks | None = None  # the counts of the open block, read by ``advance``


@dataclass(frozen=True)
class Pending:
    """A unit's step up to its forward: what ``prepare_step`` decided and ``finish_step`` needs."""

    region: tuple[int, int]
    plan: StepPlan
    drafts: Drafts | None
    last: bool  # the block's last allowed step: every remaining mask is committed
    computed: torch.Tensor | None  # [B, R] the slots the policy computed, when it restricts them
    narrow: Subset | None  # the rows and slots the forward may be narrowed to (``forward.subset``)
    active: torch.Tensor  # [B] rows taking part in this step


def open_rows(state: DecodeState) -> torch.Tensor | None:
    """[B] bool: rows with a block left to decode (unfinished, next start before their end); None when none is."""
    todo = ~state.finished & (state.cursor.next_start < state.gen_end)
    return todo if bool(todo.any()) else None


def advance(unit: Unit) -> bool:
    """Bring ``unit`` to its next step: close its block when no row has a MASK left in it and open the next one.
    False when the unit has no block left (it is done)."""
    state, smp = unit.state, unit.sampler
    while True:
        if unit.in_block:
            if state.cursor.frontier is not None:  # several blocks in flight: open / activate, then count
                frontier.update(state, cut)
            unit.masks = _masks_left(state, smp)
            if unit.masks.most:
                return True
            end_block(state)
            unit.in_block = False
        todo = open_rows(state)
        if todo is None:
            return False
        begin_block(state, smp, unit.cache, todo)
        unit.in_block = True


def end_block(state: DecodeState) -> None:
    """The block is done: block-causal rows with an EOS stop, and the cursor moves past the block (past every
    block, with several in flight: they are all done)."""
    if state.cursor.frontier is not None:  # every block is done: the rows end here (block-causal: at the first EOS)
        if state.inputs.block_causal:  # every row's answer ends at its first EOS, whenever the row finished
            stop_after_eos_block(state, every_row=True)
        state.finished.fill_(True)
    elif state.inputs.block_causal:
        stop_after_eos_block(state)
    state.cursor.next_start = torch.maximum(state.cursor.block_end, state.cursor.next_start)
    state.cursor.block_index += 1


def begin_block(state: DecodeState, smp: Sampler, pol: CachePolicy, todo: torch.Tensor) -> None:
    """Point the cursor at the next block of the rows in ``todo`` [B] (fixed-size by default; a sampler may move
    its end at the first step), let the sampler and the cache set up, and take the sampler's step bound."""
    cur = state.cursor
    cur.block_step = 0
    rule = smp.multi_block()
    if rule is not None:  # several blocks in flight: one "block" spanning the open ones (``core.frontier``)
        cur.frontier = frontier.start(state, todo, rule)
        smp.begin_block(state)
        pol.begin_block(state)
        cur.block_limit = state.gen_length + int(cur.frontier.count.max()) + 1  # >= 1 commit per step: never hit
        return
    cur.block_starts = cur.next_start.clone()
    cur.block_start = int(cur.next_start[todo].min())  # shared: earlier slots of a row are already decoded
    if state.inputs.block_causal:  # the absolute grid: the block holding the row's next slot
        cur.block_end = torch.minimum(grid_block_end(state, cur.next_start), state.gen_end)
    else:
        cur.block_end = torch.minimum(cur.next_start + state.block_length, state.gen_end)
    smp.begin_block(state)
    pol.begin_block(state)
    cur.block_limit = smp.max_block_steps(state)


def _masks_left(state: DecodeState, smp: Sampler) -> StepMasks:
    """How many masks are left in the rows' blocks (``most`` 0: the block is done, unless an editing sampler keeps
    a row's block open: then 1): the step's one host sync, shared with the MASK-commit check and the read of the
    widest block end (``DecodeState.region``)."""
    left = state.block_masked().sum(1)  # [B]
    keep = smp.block_open(state)
    facts = [left.max(), (left > 0).sum(), state.stats.mask_committed.long(), state.block_end.max()]
    if keep is not None:
        facts[0] = torch.maximum(facts[0], keep.any().long())
    most, rows, bad, widest = torch.stack(facts).tolist()
    if bad:
        raise RuntimeError(f"sampler {smp.name!r} proposed the MASK id for a committed slot")
    state.cursor.widest_end = int(widest)  # the step's region end, without a sync of its own
    return StepMasks(int(most), int(rows))


def prepare_step(model: Any, unit: Unit) -> Pending:
    """A step up to its forward: the rows taking part, the region, the sampler's drafts and the cache's plan."""
    state, smp, pol = unit.state, unit.sampler, unit.cache
    cur = state.cursor
    active = state.block_masked().any(1)  # [B] rows taking part in this step
    keep = smp.block_open(state)
    if keep is not None:
        active = active | keep
    r0, r1 = smp.region(state)
    drafts = smp.draft(state, r0, r1)  # None: an ordinary step
    plan = pol.plan(state, (r0, r1))
    last = cur.block_step + 1 >= cur.block_limit
    if last and plan.candidates is not None:
        raise RuntimeError(f"cache {pol.name!r} restricted the candidates at the block's last allowed step")
    if drafts is not None and plan.candidates is not None:
        raise RuntimeError(f"cache {pol.name!r} restricted the candidates of a draft-and-verify step")
    state.stats.refreshes += int(plan.refresh)
    computed = None if plan.candidates is None else plan.candidates[:, r0:r1]  # [B, R]
    narrow = None
    if drafts is None and not fixed_shapes(model):  # graphs: the whole region
        narrow = subset(state, smp, (r0, r1), computed, unit.masks)
    return Pending((r0, r1), plan, drafts, last, computed, narrow, active)


def forward_one(model: Any, unit: Unit, pending: Pending) -> torch.Tensor:
    """The unit's own forward: [B, R, V] region logits ([B, 1 + D, R, V] with drafts)."""
    state, store = unit.state, unit.store
    if pending.drafts is None:
        return _forward(model, state, pending.plan, pending.region, store, pending.narrow)
    return _forward_drafts(model, state, pending.plan, pending.region, store, pending.drafts)


def finish_step(unit: Unit, pending: Pending, logits: torch.Tensor) -> None:
    """Select and commit from the step's logits (within the contract), then the stop rules and the statistics."""
    state, smp = unit.state, unit.sampler
    cur = state.cursor
    r0, r1 = pending.region
    computed = pending.computed
    if pending.drafts is None:
        if computed is not None:  # slots the policy did not compute: flat logits, never committed
            logits = logits.masked_fill(~computed[..., None], 0.0)
        fail_nonfinite(state, logits, candidates(state, r0, r1))
        sel = smp.select(state, logits, r0)
    else:
        fail_nonfinite(state, logits[:, 0], candidates(state, r0, r1))
        sel = smp.verify(state, logits, pending.drafts, r0)
    if sel.block_end is not None:
        if cur.block_step != 0:
            raise RuntimeError(f"sampler {smp.name!r} moved the block end after the block's first step")
        cur.block_end = sel.block_end
    extra = None if sel.stop_rows is None else all_in(state, sel.stop_rows, r0, r1)
    commit = commit_mask(sel.commit, candidates(state, r0, r1), all_in=extra, computed=computed, last=pending.last)
    state.stats.mask_committed |= (commit & (sel.tokens == state.mask_id)).any()
    if smp.traits.edits and sel.edit is not None:  # token editing: decoded slots of the row's own block
        commit = commit | (sel.edit & editable(state, r0, r1))
    committed = torch.zeros_like(state.canvas, dtype=torch.bool)  # [B, T]
    committed[:, r0:r1] = commit
    state.canvas[:, r0:r1] = torch.where(commit, sel.tokens, state.canvas[:, r0:r1])
    record(state, committed, pending.active, sel.steps)
    if sel.cut_at is not None:
        cut(state, sel.cut_at)
    if sel.stop_rows is not None:
        stop_rows(state, sel.stop_rows)
    if state.config.stop_at_eos:
        stop_at_eos(state)
    cur.step += 1
    cur.block_step += 1
    done = ~state.is_masked()[:, state.prompt_len :].any(1)
    keep = smp.block_open(state)
    state.finished |= done if keep is None else done & ~keep
    unit.cache.after_step(state, committed)
    if unit.bar is not None:
        unit.bar.update(int(committed.sum()))


def step(
    model: Any,
    state: DecodeState,
    smp: Sampler,
    pol: CachePolicy,
    store: KVStore | None,
    bar=None,
    masks: StepMasks | None = None,
) -> None:
    """One forward and one selection for one state (``prepare_step``, ``forward_one``, ``finish_step``).
    ``masks``: the counts of ``_masks_left`` (None: unknown, so the forward computes every row's whole region)."""
    unit = Unit(state, smp, pol, store, bar, masks=masks)
    pending = prepare_step(model, unit)
    finish_step(unit, pending, forward_one(model, unit, pending))
