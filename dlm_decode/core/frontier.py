"""Multi-block decoding: several blocks of a row in flight at once (D2F, d3LLM; ``ALGORITHMS.md`` §15).

References: D2F (Wang et al. 2025, "Diffusion LLMs Can Do Faster-Than-AR Inference via Discrete Diffusion Forcing";
zhijie-group/Discrete-Diffusion-Forcing, ``_generate_block_single`` of ``D2F-eval/eval_llada.py`` and its Dream
twin) and d3LLM (hao-ai-lab/d3LLM, ``generate_multi_block`` / ``generate_multi_block_kv_cache`` of
``d3llm/d3llm_LLaDA/d3llm_llada_generate_util.py`` and its Dream twin). Both keep, per row, a *frontier* of open
blocks on a grid that starts where the answer starts:

* answer block 0 opens at once (its predecessor, the prompt, is fully decoded); at the start of every step, block
  k + 1 opens when block k's decoded share reaches ``block_add_threshold`` (a full block always qualifies), one
  block per step at most, up to the generation's end;
* block k is *fully activated* once block k - 1's decoded share has reached ``decoded_token_threshold`` (it stays
  so); until then it is *semi-activated*; answer block 0 is fully activated from the start;
* every open block is denoised in the step's one forward; what is committed where is the sampler's rule
  (``samplers.multi_block``: D2F commits per block, d3LLM makes one selection over all open blocks).

EOS (``early_stop``, off by default, on in the D2F and d3LLM presets as in their references): D2F's rule stops
opening blocks once any end id has been committed (its open blocks are still finished; the slots of blocks never
opened get the fill id, as a cut); d3LLM's rule also fills every slot after the first committed end id with the
fill id at the start of each step (masks included); as in d3LLM's loops, that step still selects among the slots
it filled (they were masks when the step began, ``DecodeState.phantom``), so they may be committed again, and a
row that ends there keeps those tokens. Without it every block opens, whatever the answer holds (the
d3LLM function's default; D2F's reference always stops). Differences, on purpose: the references look for one id
(D2F LLaDA hard-codes 126081, D2F Dream and d3LLM take the tokenizer's EOS); we look for every end id of the model
(``DecodeState.eos_ids``) and fill with the call's fill id.

A block-causal model (LLaDA2, SDAR) never opens a block after an end id, as block by block (``decode.blocks``), and
its answer ends at the first end id (every later slot gets the fill id once the row is done).

Grid: on a bidirectional model (and D2F's attention mode) answer block k is ``[P + kB, P + (k+1)B)`` in canvas slots
(``P``: the common prompt length; rows are left-padded, so the grid is the same for every row). On a block-causal
model (LLaDA2, SDAR) the blocks are the row's own grid blocks from the one holding its prompt's end (its first block
may hold prompt slots, which count as decoded). With both thresholds at 1 the frontier is one block at a time: the
ordinary block-by-block decode.

This module only keeps and moves the frontier (``start``, ``update``: called by the decode loop, which owns the
cursor); samplers read where the blocks lie with ``layout``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from dlm_decode.core.state import DecodeState

SELECTIONS = ("per_block", "global")  # D2F's per-block commits, d3LLM's one selection over all open blocks


@dataclass(frozen=True)
class MultiBlock:
    """The frontier rule of a sampler that decodes several blocks at once (``Sampler.multi_block``)."""

    block_add_threshold: float = 1.0
    decoded_token_threshold: float = 1.0
    selection: str = "per_block"  # D2F ("per_block") or d3LLM ("global")
    early_stop: bool = False  # stop opening blocks after an end id (d3LLM's selection: and fill after the first one)


@dataclass
class Frontier:
    """Per row: where its answer blocks lie and how far it is."""

    first: torch.Tensor  # [B] canvas slot where answer block 0 starts
    count: torch.Tensor  # [B] answer blocks the row has
    opened: torch.Tensor  # [B] answer blocks opened so far
    full: torch.Tensor  # [B, N] bool: block k is fully activated (N: the most blocks of a row)
    closed: torch.Tensor  # [B] bool: no further block opens (an end id was committed)
    rule: MultiBlock  # the sampler's


def start(state: DecodeState, todo: torch.Tensor, rule: MultiBlock) -> Frontier:
    """The frontier of a call's first step: answer block 0 open and fully activated in the rows of ``todo`` [B]."""
    b, size = state.block_length, state.inputs
    first = state.cursor.next_start.clone()
    if size.block_causal:  # the row's grid block holding its first answer slot
        off = size.grid_offset
        first = off + torch.div(first - off, b, rounding_mode="floor") * b
    count = torch.div(state.gen_end - first + b - 1, b, rounding_mode="floor").clamp(min=0)
    n = max(int(count.max()), 1)
    full = torch.zeros(state.batch, n, dtype=torch.bool, device=state.device)
    full[:, 0] = True
    opened = todo.long()
    frontier = Frontier(first, count, opened, full, torch.zeros_like(todo), rule)
    _place(state, frontier)
    return frontier


def block_index(state: DecodeState, frontier: Frontier, r0: int, r1: int) -> torch.Tensor:
    """[B, R] the answer block each slot of ``[r0, r1)`` lies in (-1 before the answer's first block)."""
    idx = torch.arange(r0, r1, device=state.device)[None, :] - frontier.first[:, None]
    blk = torch.div(idx, state.block_length, rounding_mode="floor")
    return torch.where(idx >= 0, blk, -1)


def layout(state: DecodeState, r0: int, r1: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What a sampler reads: ``(block [B, R], full [B, R])``, the answer block of each region slot (-1: before the
    answer) and whether that block is fully activated."""
    frontier = state.cursor.frontier
    blk = block_index(state, frontier, r0, r1)
    full = frontier.full.gather(1, blk.clamp(0, frontier.full.shape[1] - 1)) & (blk >= 0)
    return blk, full


def shares(state: DecodeState, frontier: Frontier) -> torch.Tensor:
    """[B, N] float64: the decoded share of each answer block (slots that are not MASK, over the block's size)."""
    b, n = state.block_length, frontier.full.shape[1]
    idx = torch.arange(state.total_length, device=state.device)[None, :] - frontier.first[:, None]  # [B, T]
    blk = torch.div(idx, b, rounding_mode="floor")
    inside = (idx >= 0) & (blk < n) & (idx + frontier.first[:, None] < state.gen_end[:, None])
    col = torch.where(inside, blk, n)  # column n collects the slots outside the answer's blocks
    masks = torch.zeros(state.batch, n + 1, dtype=torch.float64, device=state.device)
    masks.scatter_add_(1, col, state.is_masked().to(torch.float64))
    size = torch.zeros_like(masks).scatter_add_(1, col, torch.ones_like(masks[:, :1]).expand_as(col))
    return 1.0 - masks[:, :n] / size[:, :n].clamp(min=1)


def update(state: DecodeState, cut: Callable[[DecodeState, torch.Tensor], None]) -> None:
    """The start of a step: the EOS rule, then at most one new block per row, then the activations; the cursor's
    block ends follow. ``cut(state, at)``: the loop's cut (fills generation slots from ``at`` [B] on, -1: none)."""
    frontier = state.cursor.frontier
    rule = frontier.rule
    live = ~state.finished
    state.phantom = None
    hit, first_eos = first_eos_slot(state)
    if rule.early_stop and rule.selection == "global":  # d3LLM: everything after the first end id is the fill id
        masked = state.is_masked()
        cut(state, torch.where(hit & live, first_eos + 1, -1))
        filled = masked & ~state.is_masked()  # d3LLM still selects among them in this step (its masks were read
        state.phantom = filled if bool(filled.any()) else None  # before the fill): they may be committed again
    if rule.early_stop or state.inputs.block_causal:  # block-causal models stop after their EOS block anyway
        frontier.closed |= hit
    share = shares(state, frontier)  # [B, N]
    last = (frontier.opened - 1).clamp(min=0)
    last_share = share.gather(1, last[:, None])[:, 0]
    grow = live & ~frontier.closed & (frontier.opened < frontier.count) & (last_share >= rule.block_add_threshold)
    frontier.opened = frontier.opened + grow.long()
    n = frontier.full.shape[1]
    k = torch.arange(1, n, device=state.device)[None, :]
    ready = (share[:, :-1] >= rule.decoded_token_threshold) & (k < frontier.opened[:, None])
    frontier.full[:, 1:] |= ready
    _place(state, frontier)
    done = live & frontier.closed & ~state.block_masked().any(1)  # nothing left to decode in the opened blocks
    cut(state, torch.where(done, state.cursor.block_end, -1))
    state.finished |= live & ~state.is_masked()[:, state.prompt_len :].any(1)
    if state.phantom is not None:  # d3LLM's blocks after the EOS count as open for this step: its selection reaches
        idx = torch.arange(state.total_length, device=state.device)  # the slots it just filled
        last = torch.where(state.phantom, idx + 1, 0).max(1).values
        state.cursor.block_end = torch.maximum(state.cursor.block_end, last)


def first_eos_slot(state: DecodeState) -> tuple[torch.Tensor, torch.Tensor]:
    """([B] a generation slot holds an end id, [B] the first such slot (canvas coordinates))."""
    p = state.prompt_len
    gen = state.canvas[:, p:]
    is_eos = torch.isin(gen, state.eos_ids)
    idx = torch.arange(gen.shape[1], device=state.device)
    first = torch.where(is_eos, idx, gen.shape[1]).min(1).values
    return is_eos.any(1), first + p


def _place(state: DecodeState, frontier: Frontier) -> None:
    """The cursor's block: per row from its first open block that still has a MASK (``block_starts``) to the end
    of its last opened block (``block_end``); ``block_start``, the region's start, is the earliest over live rows."""
    cur, b = state.cursor, state.block_length
    end = torch.minimum(frontier.first + frontier.opened * b, state.gen_end)  # [B]
    idx = torch.arange(state.total_length, device=state.device)[None, :]
    open_masked = state.is_masked() & (idx >= frontier.first[:, None]) & (idx < end[:, None])
    lowest = torch.where(open_masked, idx, state.total_length).min(1).values  # [B] (T: none)
    starts = frontier.first + torch.div((lowest - frontier.first).clamp(min=0), b, rounding_mode="floor") * b
    starts = torch.minimum(starts, end)
    live = ~state.finished & open_masked.any(1)
    cur.block_end = end
    cur.block_starts = starts
    lo = torch.where(live, starts, state.total_length).min()
    cur.block_start = int(torch.where(live.any(), lo, frontier.first.min()))
