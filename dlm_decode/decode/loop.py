"""One block and one step of the decode loop.

``run_block``: ``begin_block`` (the cursor, the sampler's and the cache's set-up, the step bound), then steps until
no row has a MASK left in its block (one host sync per step: that test, which also brings back the most masks a row
has left). ``step``: the cache plans which slots to recompute, one forward gives aligned logits for the sampler's
region, the sampler selects, ``commit_mask`` decides what is written, then the cut, all-in and EOS rules and the
statistics. The step itself never waits for the device unless a progress bar asks. For a sampler that reads only
its candidates' logits (``Sampler.reads_candidates_only``) the forward computes logits at those slots alone: the
test's mask count bounds them, so building their index needs no further sync.

Draft-and-verify samplers (``Sampler.draft`` returns ``Drafts``): the step's one forward runs the current canvas and
its D drafts side by side (batch ``B * (1 + D)``, each row's copies against that row's cache under the same plan; a
cache store is copied per draft and the copies are dropped), and ``Sampler.verify`` selects instead of ``select``.
Everything after the selection is the ordinary step; ``nfe`` counts the forward once (the sequential forwards) and
``token_forwards`` counts every canvas's query slots (the compute).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from dlm_decode.cache import CachePolicy, KVStore, StepPlan
from dlm_decode.cache.plans import rows_to_index
from dlm_decode.core.state import DecodeState
from dlm_decode.decode.commit import all_in, commit_mask, cut, fail_nonfinite, record, stop_at_eos, stop_rows
from dlm_decode.samplers import Sampler
from dlm_decode.samplers.base import Drafts, candidates


def open_rows(state: DecodeState) -> torch.Tensor | None:
    """[B] bool: rows with a block left to decode (unfinished, next start before their end); None when none is."""
    todo = ~state.finished & (state.cursor.next_start < state.gen_end)
    return todo if bool(todo.any()) else None


def run_block(
    model: Any, state: DecodeState, smp: Sampler, pol: CachePolicy, store: KVStore | None, todo: torch.Tensor, bar=None
) -> None:
    """Decode the next block of every row in ``todo`` [B] (from ``open_rows``), then move the cursor past it."""
    begin_block(state, smp, pol, todo)
    while most := _masks_left(state, smp):
        step(model, state, smp, pol, store, bar, most_masked=most)
    state.cursor.next_start = torch.maximum(state.cursor.block_end, state.cursor.next_start)
    state.cursor.block_index += 1


def begin_block(state: DecodeState, smp: Sampler, pol: CachePolicy, todo: torch.Tensor) -> None:
    """Point the cursor at the next block of the rows in ``todo`` [B] (fixed-size by default; a sampler may move
    its end at the first step), let the sampler and the cache set up, and take the sampler's step bound."""
    cur = state.cursor
    cur.block_step = 0
    cur.block_starts = cur.next_start.clone()
    cur.block_start = int(cur.next_start[todo].min())  # shared: earlier slots of a row are already decoded
    cur.block_end = torch.minimum(cur.next_start + state.block_length, state.gen_end)
    smp.begin_block(state)
    pol.begin_block(state)
    cur.block_limit = smp.max_block_steps(state)


def _masks_left(state: DecodeState, smp: Sampler) -> int:
    """The most MASK slots a row has left in its block, 0 when the block is done (the step's one host sync, shared
    with the MASK-commit check)."""
    most, bad = torch.stack([state.block_masked().sum(1).max(), state.stats.mask_committed.long()]).tolist()
    if bad:
        raise RuntimeError(f"sampler {smp.name!r} proposed the MASK id for a committed slot")
    return int(most)


def step(
    model: Any,
    state: DecodeState,
    smp: Sampler,
    pol: CachePolicy,
    store: KVStore | None,
    bar=None,
    most_masked: int | None = None,
) -> None:
    """One forward and one selection: commit what the sampler chose (within the contract), then the stop rules.
    ``most_masked``: the most masks a row has left in its block (from ``_masks_left``; None: unknown, so the
    forward computes the whole region's logits)."""
    cur = state.cursor
    active = state.block_masked().any(1)  # [B] rows taking part in this step
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
    if drafts is None:
        read = _read_index(state, smp, (r0, r1), computed, most_masked)
        logits = _forward(model, state, plan, (r0, r1), store, read)  # [B, R, V]
        if computed is not None:  # slots the policy did not compute: flat logits, never committed
            logits = logits.masked_fill(~computed[..., None], 0.0)
        fail_nonfinite(state, logits, candidates(state, r0, r1))
        sel = smp.select(state, logits, r0)
    else:
        logits = _forward_drafts(model, state, plan, (r0, r1), store, drafts)  # [B, 1 + D, R, V]
        fail_nonfinite(state, logits[:, 0], candidates(state, r0, r1))
        sel = smp.verify(state, logits, drafts, r0)
    if sel.block_end is not None:
        if cur.block_step != 0:
            raise RuntimeError(f"sampler {smp.name!r} moved the block end after the block's first step")
        cur.block_end = sel.block_end
    extra = None if sel.stop_rows is None else all_in(state, sel.stop_rows, r0, r1)
    commit = commit_mask(sel.commit, candidates(state, r0, r1), all_in=extra, computed=computed, last=last)
    state.stats.mask_committed |= (commit & (sel.tokens == state.mask_id)).any()
    committed = torch.zeros_like(state.canvas, dtype=torch.bool)  # [B, T]
    committed[:, r0:r1] = commit
    state.canvas[:, r0:r1] = torch.where(commit, sel.tokens, state.canvas[:, r0:r1])
    record(state, committed, active, sel.steps)
    if sel.cut_at is not None:
        cut(state, sel.cut_at)
    if sel.stop_rows is not None:
        stop_rows(state, sel.stop_rows)
    if state.config.stop_at_eos:
        stop_at_eos(state)
    cur.step += 1
    cur.block_step += 1
    state.finished |= ~state.is_masked()[:, state.prompt_len :].any(1)
    pol.after_step(state, committed)
    if bar is not None:
        bar.update(int(committed.sum()))


def _read_index(
    state: DecodeState,
    smp: Sampler,
    region: tuple[int, int],
    computed: torch.Tensor | None,
    most_masked: int | None,
) -> torch.Tensor | None:
    """[B, N] region offsets of the candidates (``denoise``'s ``read``) when the sampler reads only those and they
    are fewer than the region's slots; None: logits for the whole region."""
    if not smp.reads_candidates_only:
        return None
    r0, r1 = region
    cand = candidates(state, r0, r1)  # [B, R]
    if computed is not None:  # the policy computed these alone; the others get flat logits anyway
        cand = cand & computed
    width = r1 - r0 if most_masked is None else min(most_masked, r1 - r0)
    if width >= r1 - r0:  # every slot may be read: the plain region (no gather, no scatter)
        return None
    return rows_to_index(cand, width)


def _forward(
    model: Any,
    state: DecodeState,
    plan: StepPlan,
    region: tuple[int, int],
    store: KVStore | None,
    read: torch.Tensor | None = None,
) -> torch.Tensor:
    """[B, R, V] aligned logits of the region (zeros off ``read`` [B, N] offsets when given), with classifier-free
    guidance applied when asked for."""
    return _run_model(model, state, plan, region, store, state.canvas, state.positions, state.valid, read)


def _forward_drafts(
    model: Any, state: DecodeState, plan: StepPlan, region: tuple[int, int], store: KVStore | None, drafts: Drafts
) -> torch.Tensor:
    """[B, 1 + D, R, V] aligned logits of the region for the current canvas (index 0) and each draft, in one forward
    of batch ``B * (1 + D)``: row b's canvases sit at ``b * (1 + D) + j`` and share row b's plan and cached K/V."""
    b, d, _ = drafts.commit.shape
    n = 1 + d
    r0, r1 = region
    canvas = state.canvas[:, None].repeat(1, n, 1)  # [B, 1 + D, T]
    canvas[:, 1:, r0:r1] = torch.where(drafts.commit, drafts.tokens[:, None], canvas[:, 1:, r0:r1])

    def rows(x: Any) -> Any:  # [B, ...] -> [B * (1 + D), ...]; slices and None pass through
        return x.repeat_interleave(n, 0) if isinstance(x, torch.Tensor) else x

    plan = dataclasses.replace(
        plan, compute=rows(plan.compute), key_mask=rows(plan.key_mask), key_index=rows(plan.key_index)
    )
    copies = None
    if store is not None:  # each canvas reads its row's cache; the copies' writes are dropped with them
        src = torch.arange(b, device=state.device).repeat_interleave(n)  # [B * (1 + D)]
        if state.config.cfg_scale > 0:  # the store's second half holds the unconditional rows
            src = torch.cat([src, src + b])
        copies = store.take_rows(src)
    flat = canvas.view(b * n, -1)
    logits = _run_model(model, state, plan, region, copies, flat, rows(state.positions), rows(state.valid))
    return logits.view(b, n, *logits.shape[1:])


def _run_model(
    model: Any,
    state: DecodeState,
    plan: StepPlan,
    region: tuple[int, int],
    store: KVStore | None,
    canvas: torch.Tensor,  # [N, T]
    pos: torch.Tensor,  # [N, T]
    valid: torch.Tensor,  # [N, T]
    read: torch.Tensor | None = None,  # [N, K] region offsets whose logits are wanted (None: all)
) -> torch.Tensor:
    """[N, R, V] aligned logits of the region for ``canvas`` under ``plan`` (classifier-free guidance applied)."""
    km, ki, compute = plan.key_mask, plan.key_index, plan.compute
    cfg_scale = state.config.cfg_scale
    if cfg_scale > 0:  # unconditional copy: the prompt fully masked (LLaDA)
        un = canvas.clone()
        un[:, : state.prompt_len].masked_fill_(valid[:, : state.prompt_len], state.mask_id)
        canvas, pos = torch.cat([canvas, un]), torch.cat([pos, pos])
        km = None if km is None else torch.cat([km, km])
        ki = ki if ki is None or isinstance(ki, slice) else torch.cat([ki, ki])
        compute = compute if isinstance(compute, slice) else torch.cat([compute, compute])
        read = None if read is None else torch.cat([read, read])
    if store is not None:
        store.frozen = not plan.write
    try:
        logits = model.denoise(
            canvas, pos, compute=compute, region=region, store=store, key_mask=km, key_index=ki, read=read
        )
    finally:
        if store is not None:
            store.end_step()
            store.frozen = False
    if isinstance(compute, slice):
        c0, c1, _ = compute.indices(canvas.shape[1])
        n_q = c1 - c0
    else:
        n_q = compute.shape[1]
    state.stats.token_forwards += n_q * canvas.shape[0]
    if cfg_scale > 0:
        cond, unc = logits.chunk(2)
        logits = unc + (cfg_scale + 1) * (cond - unc)
    return logits
