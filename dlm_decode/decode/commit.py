"""The commit rule and the rules that follow a commit (cut, all-in stop, EOS stop, non-finite rows).

``commit_mask`` is pure (tensors in, tensor out), so the contract the loop enforces on every sampler can be read and
tested alone. The others update the state in place without a host sync.
"""

from __future__ import annotations

import torch

from dlm_decode.core.masks import eos_settled
from dlm_decode.core.state import DecodeState


def commit_mask(
    proposed: torch.Tensor,
    candidates: torch.Tensor,
    *,
    all_in: torch.Tensor | None = None,
    computed: torch.Tensor | None = None,
    last: bool = False,
) -> torch.Tensor:
    """[B, R] bool: the slots a step commits.

    ``proposed``: the sampler's ``Selection.commit``; ``candidates``: masked slots of the current block of unfinished
    rows; ``all_in``: masked generation slots of rows stopping this step (an all-in commit may fill them too);
    ``computed``: slots whose logits the cache computed (None: all; the others are never committed); ``last``: the
    block's last allowed step, where every candidate is committed with its proposal (never leave a MASK).
    """
    allowed = candidates if all_in is None else candidates | all_in
    if computed is not None:
        candidates, allowed = candidates & computed, allowed & computed
    commit = proposed & allowed
    if last:  # step bound reached: finish the block
        commit = commit | candidates
    return commit


def all_in(state: DecodeState, stop_rows: torch.Tensor, r0: int, r1: int) -> torch.Tensor:
    """[B, R] masked generation slots of the region in unfinished stopping rows (an all-in commit may fill them)."""
    idx = torch.arange(r0, r1, device=state.device)
    gen = (idx[None, :] >= state.prompt_len) & (idx[None, :] < state.gen_end[:, None])
    return stop_rows[:, None] & ~state.finished[:, None] & gen & state.is_masked()[:, r0:r1]


def fail_nonfinite(state: DecodeState, logits: torch.Tensor, cand: torch.Tensor) -> None:
    """Stop rows whose logits at a candidate slot are not finite, noting the first such step (the other rows go on)."""
    # a slot's logits are all finite exactly when their max and min are (both propagate NaN): two reductions of
    # [B, R, V] in the logits' dtype, without the [B, R, V] bool tensor of isfinite (17x slower at V 2048) or a
    # float64 sum's conversions (10x slower than these at V 152k on the CPU)
    finite = torch.isfinite(logits.amax(-1)) & torch.isfinite(logits.amin(-1))  # [B, R]
    bad = (~finite & cand).any(1)  # [B]
    stats, first = state.stats, bad & (state.stats.fail_step < 0)
    stats.fail_step = torch.where(first, state.step, stats.fail_step)
    stats.fail_block = torch.where(first, state.block_index, stats.fail_block)
    state.finished |= bad


def record(
    state: DecodeState, committed: torch.Tensor, active: torch.Tensor, steps: torch.Tensor | None = None
) -> None:
    """Statistics of one step: ``committed`` [B, T] slots written, ``active`` [B] rows that took part, ``steps`` [B]
    steps of the followed rule each row's commit stands for (None: one per active row)."""
    p, n = state.prompt_len, state.gen_length
    stats = state.stats
    stats.trace = torch.where(committed[:, p : p + n], state.step, stats.trace)
    stats.commits.append(committed.sum(1))
    stats.row_steps += active.long()
    stats.accepted_steps += active.long() if steps is None else torch.where(active, steps, 0)


def cut(state: DecodeState, cut_at: torch.Tensor) -> None:
    """Fill generation slots >= cut_at with the fill id, decoded or not (EoTP truncates the canvas there); rows with
    cut_at < 0 are untouched."""
    idx = torch.arange(state.total_length, device=state.device)
    rows = (cut_at >= 0) & ~state.finished
    gone = rows[:, None] & (idx[None, :] >= cut_at[:, None]) & (idx[None, :] >= state.prompt_len)  # [B, T]
    state.canvas.masked_fill_(gone, state.fill_id)
    state.stats.trace.masked_fill_(gone[:, state.prompt_len : state.prompt_len + state.gen_length], -1)
    state.gen_end = torch.where(rows, torch.minimum(state.gen_end, cut_at), state.gen_end)
    state.cursor.block_end = torch.minimum(state.cursor.block_end, state.gen_end)


def stop_rows(state: DecodeState, rows: torch.Tensor) -> None:
    """Stop rows after an all-in commit; any mask the region did not cover gets the fill id (never leave a MASK)."""
    left = rows[:, None] & state.is_masked()
    left[:, : state.prompt_len] = False
    state.canvas.masked_fill_(left, state.fill_id)
    state.finished |= rows


def stop_at_eos(state: DecodeState) -> None:
    """Rows whose first EOS has every earlier generation slot decoded get the rest filled with EOS."""
    gen = state.canvas[:, state.prompt_len :]  # [B, L] a view: filled in place
    idx = torch.arange(gen.shape[1], device=state.device)
    settled, first_eos = eos_settled(gen, state.mask_id, state.eos_ids)
    stop = settled & ~state.finished
    gen.masked_fill_(stop[:, None] & (idx[None, :] > first_eos[:, None]) & (gen == state.mask_id), state.fill_id)
    state.finished |= stop
