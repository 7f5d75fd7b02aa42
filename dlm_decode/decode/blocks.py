"""Block-causal models (LLaDA2.0 / LLaDA2.1, ``ALGORITHMS.md`` §12) in the one decode loop: the absolute block grid,
the canvas it needs, and the stop after the block that holds the first EOS.

Reference: the ``generate()`` of the LLaDA2 modeling files. Blocks lie on the absolute position grid (block k =
positions ``[kB, (k+1)B)``); decoding starts at the block holding the prompt's end, so the prompt's last partial block
is decoded with its prompt slots fixed; the canvas runs to the end of the block holding position ``prompt + gen - 1``
(the last block is whole, even past ``gen_length``, as in the reference); after each block a row with an EOS among
its generated slots stops, and its answer is the tokens up to and including the first EOS (else ``gen_length``).

In a batch, rows are left-padded (``core.state``): a row's grid is its own positions, so its blocks start at
``grid_offset + kB`` in canvas slots and every row decodes what it decodes alone.
"""

from __future__ import annotations

import torch

from dlm_decode.core.state import DecodeState


def grid_lengths(prompt_lens: list[int], gen_length: int, block_length: int) -> tuple[int, list[int]]:
    """-> (generation slots the canvas needs after the common prompt length P, each row's end slot ``gen_end``):
    row b ends at the end of the block holding its position ``p_b + gen_length - 1``."""
    p = max(prompt_lens)
    ends = [p - n + -(-(n + gen_length) // block_length) * block_length for n in prompt_lens]
    return max(ends) - p, ends


def grid_block_end(state: DecodeState, start: torch.Tensor) -> torch.Tensor:
    """[B] the end slot of the grid block holding slot ``start`` [B] of each row."""
    off, b = state.inputs.grid_offset, state.block_length
    return off + torch.div(start - off, b, rounding_mode="floor") * b + b


def stop_after_eos_block(state: DecodeState, every_row: bool = False) -> None:
    """Rows whose generated slots so far hold an EOS stop: every slot after the first EOS gets the fill id (EOS).
    ``every_row``: finished rows too (the end of a multi-block decode, where rows finish at different steps)."""
    p = state.prompt_len
    gen = state.canvas[:, p:]  # [B, L'] a view: filled in place
    idx = torch.arange(gen.shape[1], device=state.device)
    is_eos = torch.isin(gen, state.eos_ids) & (idx[None, :] < (state.block_end - p)[:, None])
    hit = is_eos.any(1) if every_row else is_eos.any(1) & ~state.finished  # [B]
    first = torch.where(is_eos, idx, gen.shape[1]).min(1).values  # [B]
    after = hit[:, None] & (idx[None, :] > first[:, None])  # [B, L']
    gen.masked_fill_(after, state.fill_id)
    n = state.gen_length
    state.stats.trace.masked_fill_(after[:, :n], -1)
    state.finished |= hit
