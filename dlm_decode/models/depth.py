"""A depth-aware forward for Elastic-Cache (``dlm_decode.cache.elastic``): shallow layers compute only the step's
query slots, and from the first layer whose attention drifted on, a row recomputes every slot.

Paper: Nguyen-Tri, Ranjan, Shen, "Attention Is All You Need for KV Cache in Diffusion LLMs" (arXiv 2510.14973). The
policy plans a step's query slots (``compute``: the sliding window of masks, the tokens decoded last step and the
tracked most-attended tokens) and hands a ``DepthProgram`` to the model in the plan; the model's layer loop
(``common.run_layers``) then runs ``run_program`` with the plan (``cache.depth_plan.DepthProgram``) instead of
its plain loop. Per layer ``i``:

* the input hidden states of the computed slots are written into a per-call cache ``hidden`` [L, B, T, d] (the
  hidden-state cache that lets a later layer take every slot up again);
* reuse mode (a row not refreshing yet): before the layer writes its K/V, the tracked tokens' attention rows of the
  previous state are taken (their cached layer input against the cached keys); after the layer, their rows of the
  current state; ``sigma`` = cosine similarity of the two over the keys, the mean over heads and tracked tokens. A row
  whose ``sigma < gamma`` refreshes from this layer on: the layer is run again with every slot of the row (the
  others keep their query slots), its inputs the cached ``hidden[i]`` with the fresh query rows written in;
* every layer picks, per row, the ``track_num`` decoded slots the window's masks attend to most (summed over heads
  and window queries): the union over layers is the next step's tracked set.

A refresh step (``full``) runs every slot through every layer and only fills the caches and picks the tokens.
What the policy reads back (the picks, each row's refresh layer, the per-layer ``sigma``) lands in ``DepthMemory``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from dlm_decode.cache.depth_plan import DepthProgram
from dlm_decode.models.common import EAGER, EagerLayers, Index, Layer, apply_rope, norm_heads


def run_program(
    self: DepthProgram,
    blocks: Any,
    h: torch.Tensor,  # [B, Q, d] embeddings of the computed slots
    rope: Any,  # positions [B, N] -> (cos, sin), the model's ``rope_cos_sin``
    kv: Any,  # the forward's ``cache.store.KVAccess`` (every row of the store, written)
    slots: Index,
    key_mask: torch.Tensor | None,  # [B, T]
    rows: Index | None,
    pieces: EagerLayers = EAGER,
) -> torch.Tensor:  # [B, N, d] the last layer's output for ``rows``
    n_layers, t = len(blocks), self.positions.shape[1]
    b = h.shape[0]
    plan = self.for_batch(b)
    cur = _as_index(slots, b, t, h.device)  # [B, Q]
    want = cur if rows is None else _take(cur, rows)  # [B, N] slot ids the caller wants back
    mem = self.memory
    mem.bind(n_layers, h, t)
    refreshing = torch.full((b,), plan.full, dtype=torch.bool, device=h.device)
    cos, sin = rope(plan.positions.gather(1, cur))
    for i, block in enumerate(blocks):
        testing = plan.track is not None and not bool(refreshing.all())
        past = (
            _rows_attention(block, plan, mem.hidden[i], plan.track, kv.store.keys(i), key_mask, rope)
            if testing
            else None
        )
        mem.hidden[i].scatter_(1, cur[..., None].expand_as(h), h)
        r = _rows_of(cur, want) if i == n_layers - 1 else None
        out = block(h, cos, sin, i, kv, cur, key_mask, None, r, pieces)
        if testing:
            now = _rows_attention(block, plan, mem.hidden[i], plan.track, kv.store.keys(i), key_mask, rope)
            sigma = _drift(past, now, plan.track)  # [B]
            mem.sigma[i] = sigma
            start = (sigma < plan.gamma) & ~refreshing
            if bool(start.any()):  # these rows recompute every slot from this layer on
                refreshing |= start
                mem.boundary[start] = i
                cur = _refresh_index(cur, refreshing, t)
                h = mem.hidden[i].gather(1, cur[..., None].expand(-1, -1, h.shape[-1]))
                cos, sin = rope(plan.positions.gather(1, cur))
                r = _rows_of(cur, want) if i == n_layers - 1 else None
                out = block(h, cos, sin, i, kv, cur, key_mask, None, r, pieces)
        mem.slot_layers += cur.shape[0] * cur.shape[1]
        mem.picks[i] = _pick(block, plan, mem.hidden[i], kv.store.keys(i), key_mask, rope)
        h = out
    return h


def _rows_attention(block: Layer, plan: DepthProgram, hidden, slots, keys, key_mask, rope) -> torch.Tensor:
    """[B, H, N, T] attention weights of the queries of ``slots`` [B, N], their inputs taken from ``hidden``
    [B, T, d], over ``keys`` [B, Hk, T, hd] (the store's, read as they stand)."""
    x = hidden.gather(1, slots[..., None].expand(-1, -1, hidden.shape[-1]))  # [B, N, d]
    return attention_weights(block, x, plan.positions.gather(1, slots), keys, key_mask, rope)


def _pick(block: Layer, plan: DepthProgram, hidden, keys, key_mask, rope) -> torch.Tensor:  # [B, track_num]
    """The ``track_num`` attendable slots the window's masks attend to most at this layer."""
    att = _rows_attention(block, plan, hidden, plan.window, keys, key_mask, rope)  # [B, H, W, T]
    att = att * plan.window_ok[:, None, :, None]
    score = att.sum((1, 2)).masked_fill(~plan.attendable, -1.0)  # [B, T]
    return score.topk(plan.track_num, dim=1).indices


def attention_weights(
    block: Layer,
    x: torch.Tensor,  # [B, N, d] layer inputs of the query slots
    positions: torch.Tensor,  # [B, N]
    keys: torch.Tensor,  # [B, Hk, T, hd]
    key_mask: torch.Tensor | None,  # [B, T]
    rope: Any,
) -> torch.Tensor:  # [B, H, N, T] fp32 softmax weights
    """The layer's attention weights for some queries, computed apart from its attention (which keeps none)."""
    n_heads, n_kv, hd = block.shape
    b, n, _ = x.shape
    q = block.projections()[0](block.norm_attention(x)).view(b, n, n_heads, hd).transpose(1, 2)  # [B, H, N, hd]
    cos, sin = rope(positions)
    q = apply_rope(norm_heads(block, q, "q"), cos, sin, block.rope_fp32).float()
    k = keys.float().repeat_interleave(n_heads // n_kv, dim=1)  # [B, H, T, hd]
    scores = q @ k.transpose(-1, -2) / math.sqrt(hd)  # [B, H, N, T]
    if key_mask is not None:
        scores = scores.masked_fill(~key_mask[:, None, None, :], float("-inf"))
    return scores.softmax(-1)


def _drift(past: torch.Tensor, now: torch.Tensor, track: torch.Tensor) -> torch.Tensor:  # [B]
    """Mean over heads and distinct tracked slots of the cosine similarity of two [B, H, K, T] attention rows."""
    cos = torch.nn.functional.cosine_similarity(past, now, dim=-1)  # [B, H, K]
    distinct = torch.ones_like(track, dtype=torch.bool)  # [B, K]: sorted ids, repeats are padding
    distinct[:, 1:] = track[:, 1:] != track[:, :-1]
    w = distinct[:, None, :].float()
    return (cos * w).sum((1, 2)) / (w.sum(2) * cos.shape[1]).squeeze(1)


def _as_index(slots: Index, b: int, t: int, device: torch.device) -> torch.Tensor:  # [B, Q]
    if isinstance(slots, slice):
        c0, c1, _ = slots.indices(t)
        return torch.arange(c0, c1, device=device).expand(b, -1)
    return slots


def _take(cur: torch.Tensor, rows: Index) -> torch.Tensor:  # [B, N] the slot ids at query rows ``rows``
    return cur[:, rows] if isinstance(rows, slice) else cur.gather(1, rows)


def _rows_of(cur: torch.Tensor, want: torch.Tensor) -> torch.Tensor:  # [B, N] rows of ``cur`` holding ``want``
    return torch.searchsorted(cur.contiguous(), want.contiguous()).clamp(max=cur.shape[1] - 1)


def _refresh_index(cur: torch.Tensor, refreshing: torch.Tensor, t: int) -> torch.Tensor:  # [B, W]
    """Every slot for the refreshing rows, the current query slots for the others (sorted, padded by repeats)."""
    need = torch.zeros(cur.shape[0], t, dtype=torch.bool, device=cur.device)
    need.scatter_(1, cur, True)
    need |= refreshing[:, None]
    counts = need.sum(1)
    width = int(counts.max())
    col = torch.where(need, need.long().cumsum(1) - 1, width)
    out = torch.full((cur.shape[0], width + 1), t - 1, dtype=torch.long, device=cur.device)
    out.scatter_(1, col, torch.arange(t, device=cur.device).expand_as(need))
    out = out[:, :width]
    last = out.gather(1, (counts - 1)[:, None])
    return torch.where(torch.arange(width, device=cur.device)[None, :] < counts[:, None], out, last)
