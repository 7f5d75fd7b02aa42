"""Log-likelihood of a continuation under a block-causal diffusion LM (LLaDA2): the block diffusion ELBO.

A block-causal model predicts block ``b`` from the clean blocks before it and a noisy block ``b``; its evidence lower
bound (Arriola et al., "Block Diffusion", ICLR 2025, Eq. 6, the BD3-LM training loss) is a sum over blocks of the
masked-diffusion ELBO of each block given the clean earlier ones. ``eval.likelihood`` draws the same Monte Carlo
masks as for a bidirectional model (``llada`` or ``dream``): for any per-subset loss ``f(S)`` both estimators have
the expectation ``sum_S f(S) / (|S| C(L, |S|))``, and with independent masking at rate ``t`` weighted by ``1 / t``
that expectation is the sum of the blocks' ELBOs once a token's loss depends only on the masked slots of its own
block. So one forward per sample suffices, as in BD3-LM's training: the canvas is the clean sequence followed by a
noisy copy of the grid blocks that hold the continuation, at the same positions; a clean slot sees the clean slots
of its block and the earlier ones, a noisy slot the clean slots of earlier blocks and the noisy slots of its own
block. The loss is read at the noisy copy's masked continuation slots.

Blocks lie on the absolute grid of positions (``block_length``, LLaDA2's 32 by default), as in decoding: the
context's last partial block is noisy-copied too, its context slots never masked. Classifier-free guidance masks the
context in both copies for the unconditional row. No reference harness scores LLaDA2 by likelihood; the estimator is
ours, checked in ``tests/test_eval_plugin.py`` against a brute-force evaluation of every masked subset.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from dlm_decode.eval.scored import scored_losses


def block_canvas(
    rows: Sequence[Any], block_length: int, mask_id: int, unconditional: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(tokens [B, T], positions [B, T], visible [B, T, T] bool, scored [B, T] bool, targets [B, T])`` for rows
    with ``context``, ``continuation`` and ``mask`` [L] (``likelihood.Row``)."""
    seqs = []
    for r in rows:
        ctx = [mask_id] * len(r.context) if unconditional else list(r.context)
        ids, c0 = ctx + list(r.continuation), len(r.context)
        g0 = (c0 // block_length) * block_length  # the grid block holding the continuation's first slot
        noisy = ids[g0:]
        scored = [False] * len(noisy)
        for j, m in enumerate(r.mask.tolist()):
            if m:
                noisy[c0 - g0 + j], scored[c0 - g0 + j] = mask_id, True
        targets = ids[g0:]
        seqs.append((ids + noisy, list(range(len(ids))) + list(range(g0, len(ids))), len(ids), scored, targets))
    b, t = len(rows), max(len(s[0]) for s in seqs)
    tokens = torch.full((b, t), mask_id, dtype=torch.long)
    positions = torch.zeros(b, t, dtype=torch.long)
    kind = torch.full((b, t), -1, dtype=torch.long)  # 0 clean, 1 noisy, -1 padding
    scored = torch.zeros(b, t, dtype=torch.bool)
    targets = torch.zeros(b, t, dtype=torch.long)
    for i, (ids, pos, n, sc, tg) in enumerate(seqs):
        tokens[i, : len(ids)], positions[i, : len(ids)] = torch.tensor(ids), torch.tensor(pos)
        kind[i, :n], kind[i, n : len(ids)] = 0, 1
        scored[i, n : len(ids)], targets[i, n : len(ids)] = torch.tensor(sc), torch.tensor(tg)
    blk = positions // block_length
    bq, bk = blk[:, :, None], blk[:, None, :]  # [B, T, 1], [B, 1, T]
    clean_q, noisy_q = (kind == 0)[:, :, None], (kind == 1)[:, :, None]
    clean_k, noisy_k = (kind == 0)[:, None, :], (kind == 1)[:, None, :]
    visible = (clean_q & clean_k & (bk <= bq)) | (noisy_q & clean_k & (bk < bq)) | (noisy_q & noisy_k & (bk == bq))
    visible[:, :, 0] |= kind == -1  # padding queries see one key (their outputs are never read)
    return tokens, positions, visible, scored, targets


@torch.no_grad()
def block_row_losses(
    model: Any, rows: Sequence[Any], *, block_length: int, cfg_scale: float = 0.0, head_chunk: int = 4096
) -> torch.Tensor:
    """[N] masked cross-entropy / ratio of each row (``likelihood.row_losses`` for block-causal models)."""
    device = next(model.parameters()).device
    mask_id = model.mask_token_id
    tokens, positions, visible, scored, targets = block_canvas(rows, block_length, mask_id)
    if cfg_scale > 0:  # the unconditional rows have the same lengths: stacked below the B rows
        un = block_canvas(rows, block_length, mask_id, unconditional=True)
        tokens, positions, visible = (
            torch.cat([a, u]) for a, u in zip((tokens, positions, visible), un[:3], strict=True)
        )
    hidden = model.hidden_states_4d(tokens.to(device), positions.to(device), visible[:, None].to(device))
    row, slot = scored.nonzero(as_tuple=True)  # [N] each
    ratios = [r.ratio for r in rows]
    return scored_losses(
        model, hidden, row.to(device), slot.to(device), targets[scored].to(device), ratios, cfg_scale, head_chunk
    )
