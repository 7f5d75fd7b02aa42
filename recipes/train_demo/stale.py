"""Rows trained the way a Fast-dLLM cache serves them: the answer block attends to stale keys and values.

Fast-dLLM's caches (Wu et al. 2025, "Fast-dLLM: Training-free Acceleration of Diffusion LLM by Enabling KV Cache and
Parallel Decoding", Sec. 3.1-3.2) compute every position's keys and values in the first forward of a block, while the
block and everything after it are MASK, and reuse them for the block's later steps: the prefix's (``prefix``), or
everything outside the block (``dual``). A bidirectional model trained only on fresh canvases meets those stale keys
for the first time at decode time, and the shipped demo models lose 40-50 points to it. This module builds that
decode-time state as a training row (the decode code itself is ``dlm_decode.decode``; nothing here is imported by it):

- a stale row picks one block of its response (``block`` tokens on the response's own grid, as LLaDA's blocks are):
  the response before the block is its true text, after it MASK, and the block is masked by the row's usual draw;
- the *refresh canvas* is the same row with the block and everything after it MASK: the canvas of the block's first
  forward, whose keys and values the cache keeps;
- in the scored forward the stale positions (the prompt and the response before the block, but for the slot just
  before it with Dream's shifted logits; for a ``dual`` row also the response after it) take their keys and values
  from the refresh canvas's forward, run without gradients; only the block's masked tokens are scored, with the
  block's length in place of the response length in the loss weight.

The layers' ``pieces`` hook (``dlm_decode.models.common.EagerLayers``) swaps the keys and values after the
projections and RoPE, where the decoder's K/V store sits, so the model code is not changed for training.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dlm_decode.models.common import EagerLayers, layer_input


@dataclass(frozen=True)
class StaleRows:
    """Which rows are stale and how: ``rows`` [N] batch indices; for those rows, ``block`` [N, T] the scored block,
    ``refresh`` [N, T] the positions MASK on the refresh canvas, ``stale`` [N, T] the positions whose K/V are
    taken from it; ``after`` [B, T] the response after each stale row's block (MASK on the scored canvas)."""

    rows: torch.Tensor
    block: torch.Tensor
    refresh: torch.Tensor
    stale: torch.Tensor
    after: torch.Tensor
    block_length: torch.Tensor  # [N] tokens in each row's block (the loss weight's length)


def draw_stale_rows(
    response: torch.Tensor,  # [B, T] bool, the response slots (left-padded rows: the response is at the end)
    share: float,
    block: int,
    generator: torch.Generator,
    logit_shift: int = 0,
) -> StaleRows | None:
    """Pick the stale rows (each row with probability ``share``), each one's block (uniform over its response's
    blocks) and its cache (``dual`` or ``prefix``, even odds). None when no row is picked. With ``logit_shift`` 1
    (Dream) the slot before the block is computed afresh too, as the caches compute it (its hidden state scores the
    block's first slot)."""
    b, t = response.shape
    pick = torch.rand(b, generator=generator, device=generator.device).to(response.device) < share
    where = torch.rand(b, generator=generator, device=generator.device).to(response.device)
    dual = torch.rand(b, generator=generator, device=generator.device).to(response.device) < 0.5
    rows = pick.nonzero(as_tuple=True)[0]
    if rows.numel() == 0:
        return None
    length = response.long().sum(1)  # [B]
    n_blocks = (length + block - 1) // block
    start = t - length + (where * n_blocks).floor().long() * block  # [B] the block's first slot
    end = torch.clamp(start + block, max=t)
    col = torch.arange(t, device=response.device)[None]  # [1, T]
    in_block = (col >= start[:, None]) & (col < end[:, None])
    after = response & (col >= end[:, None])
    refresh = response & (col >= start[:, None])
    fresh = (col >= start[:, None] - logit_shift) & (col < end[:, None])
    stale = ~fresh & ((col < start[:, None] - logit_shift) | dual[:, None])
    after[~pick] = False
    return StaleRows(rows, in_block[rows], refresh[rows], stale[rows], after, (end - start)[rows].float())


class StaleKV(EagerLayers):
    """Layer pieces that record every layer's keys and values (the refresh forward, over the stale rows only), then
    put them in place of the stale positions' in the next forward (over the whole batch); the output piece is the
    eager one."""

    def __init__(self, rows: torch.Tensor, stale: torch.Tensor) -> None:
        self.rows = rows  # [N]
        self.stale = stale[:, None, :, None]  # [N, 1, T, 1]
        self.saved: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.recording = True
        self.layer = 0

    def input(self, block, h, cos, sin, rows):  # -> q [B, H, Q, hd], k and v [B, Hk, Q, hd]
        q, k, v = layer_input(block, h, cos, sin, rows)
        if self.recording:
            self.saved.append((k, v))
            return q, k, v
        old_k, old_v = self.saved[self.layer]
        self.layer += 1
        k = k.index_put((self.rows,), torch.where(self.stale, old_k, k[self.rows]))
        v = v.index_put((self.rows,), torch.where(self.stale, old_v, v[self.rows]))
        return q, k, v


def stale_hidden_states(
    core, noisy: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor, spec: StaleRows
) -> torch.Tensor:  # [B, T, d]
    """The scored forward of ``noisy`` [B, T] with the stale rows' stale K/V from their refresh canvas."""
    pieces = StaleKV(spec.rows, spec.stale)
    ids = noisy[spec.rows].masked_fill(spec.refresh, core.mask_token_id)  # the refresh canvas [N, T]
    before = core.__dict__.get("layer_pieces")
    core.layer_pieces = pieces
    try:
        with torch.no_grad():
            core.hidden_states(ids, positions[spec.rows], key_mask=valid[spec.rows])
        pieces.recording = False
        return core.hidden_states(noisy, positions, key_mask=valid)
    finally:
        if before is None:
            del core.layer_pieces  # back to the class's eager pieces
        else:
            core.layer_pieces = before
