"""One forward for several units: the engine's requests share the model call, each getting the logits it gets alone.

``run_forwards`` takes the step's ``(unit, pending)`` pairs and groups those that can share a call (``merge_key``):
the same kind of call (with a K/V store or without, written or not, the same block-causal block) and nothing that
gives a call its own shape (drafts, a depth program, classifier-free guidance, gathered keys, CUDA graphs, a narrowed
row set), then splits a group by width (``_by_width``: rows of similar query counts share a call, so one row's full
refresh never makes the others compute as many slots). A group of one, and every unit that cannot share, runs its
own forward (``loop.forward_one``): exactly what it runs alone.

A shared call (``_shared_logits``) lays the units' canvases side by side, right-padded to the longest (a padded slot
is never computed and never visible: each row's key mask ends at its own canvas), so every slot keeps the column it
has alone and the prompts need no re-layout. Each row computes its own slots (its plan's compute, as slot ids padded
by repeats of its last one, which ``plans.rows_to_index`` documents as never changing a result), and reads the
hidden states behind its own region (its own start and width); the LM head, most of a step's cost at a large
vocabulary, runs over the units' read rows alone, laid end to end, never over the padding. The attention runs over
the units' rows of the shared store (``cache.arena``), where each unit's cache already writes. Per unit the
statistics count its own computed slots, as alone; ``run_forwards`` returns how many model calls the step made.

Float results of the projections can depend on how many rows a matrix product has (which kernel a library picks):
the tokens are those of the unit alone wherever the products are batch-invariant, as on the CPU in float32, where
the tests check them.
"""

from __future__ import annotations

from typing import Any

import torch

from dlm_decode.cache.arena import Arena
from dlm_decode.cache.store import KVAccess
from dlm_decode.decode.loop import Pending, Unit, forward_one
from dlm_decode.models.graphs import fixed_shapes

Item = tuple[Unit, Pending]


def merge_key(model: Any, unit: Unit, pending: Pending) -> tuple | None:
    """What a unit's call must agree on to share a forward; None when it runs its own."""
    state, plan = unit.state, pending.plan
    if pending.drafts is not None or plan.layers is not None or state.config.cfg_scale > 0 or state.batch != 1:
        return None
    narrowed_rows = pending.narrow is not None and pending.narrow.rows is not None
    if plan.key_index is not None or fixed_shapes(model) or narrowed_rows:
        return None
    block = state.block_length if state.inputs.block_causal else state.inputs.answer_blocks
    if unit.store is None:
        c0, _, _ = _span(plan.compute, state.total_length)
        return None if c0 != 0 else ("none", block)  # without a store: a prefix of the canvas, keys = computed
    if unit.store_row is None:
        return None
    return ("store", plan.write, block)


def run_forwards(model: Any, items: list[Item], arena: Arena | None) -> tuple[list[torch.Tensor], int]:
    """The step's logits for each ``(unit, pending)`` (as ``loop.forward_one`` gives them) and the model calls
    made."""
    out: list[torch.Tensor | None] = [None] * len(items)
    groups: dict[tuple, list[int]] = {}
    for i, (unit, pending) in enumerate(items):
        key = merge_key(model, unit, pending)
        groups.setdefault(("own", i) if key is None else key, []).append(i)
    calls = 0
    for key, idx in groups.items():
        for part in _by_width([_width(*items[i]) for i in idx]):
            calls += 1
            if len(part) == 1:
                unit, pending = items[idx[part[0]]]
                out[idx[part[0]]] = forward_one(model, unit, pending)
                continue
            shared = _shared_logits(model, [items[idx[j]] for j in part], arena, key[0] == "store")
            for j, logits in zip(part, shared, strict=True):
                out[idx[j]] = logits
    return out, calls


#: a shared call pads every row to its widest; a row joins a call while the padded query slots stay within this
#: factor of the real ones (plus ``CALL_SLOTS``, about what a call's fixed cost is worth in slots), else it opens a
#: call of its own width class: a row's refresh (every slot) never makes the other rows compute as many
PAD_FACTOR = 1.5
CALL_SLOTS = 32


def _width(unit: Unit, pending: Pending) -> int:
    """The query slots a unit's call computes."""
    c = pending.plan.compute
    if isinstance(c, slice):
        c0, c1, _ = c.indices(unit.state.total_length)
        return (c1 - c0) * unit.state.batch
    return c.shape[0] * c.shape[1]


def _by_width(widths: list[int]) -> list[list[int]]:
    """Positions of ``widths`` in calls: sorted by width, a call closed when padding to its widest would cost more
    than ``PAD_FACTOR`` times its real slots plus ``CALL_SLOTS``."""
    order = sorted(range(len(widths)), key=lambda i: widths[i])
    parts: list[list[int]] = []
    for i in order:
        part = parts[-1] if parts else None
        if part is not None:
            real = sum(widths[j] for j in part) + widths[i]
            if widths[i] * (len(part) + 1) <= PAD_FACTOR * real + CALL_SLOTS:
                part.append(i)
                continue
        parts.append([i])
    return parts


def _span(compute: slice | torch.Tensor, length: int) -> tuple[int, int, int]:
    return compute.indices(length) if isinstance(compute, slice) else (-1, -1, -1)


def _pad_rows(rows: list[torch.Tensor]) -> torch.Tensor:
    """[1, n_i] id rows -> [k, max n] with each row padded by repeats of its last id."""
    width = max(r.shape[1] for r in rows)
    return torch.cat([torch.cat([r, r[:, -1:].expand(1, width - r.shape[1])], 1) for r in rows])


def _canvas(items: list[Item]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The units' canvases, positions and key masks side by side, right-padded: [k, T] each."""
    states = [u.state for u, _ in items]
    t = max(s.total_length for s in states)
    dev = states[0].device
    canvas = torch.full((len(items), t), states[0].mask_id, dtype=torch.long, device=dev)
    pos = torch.zeros((len(items), t), dtype=torch.long, device=dev)
    visible = torch.zeros((len(items), t), dtype=torch.bool, device=dev)
    for i, (unit, pending) in enumerate(items):
        s, n = unit.state, unit.state.total_length
        canvas[i, :n], pos[i, :n] = s.canvas[0], s.positions[0]
        km = pending.plan.key_mask
        visible[i, :n] = True if km is None else km[0]
    return canvas, pos, visible


def _wanted(model: Any, pending: Pending) -> torch.Tensor:
    """[1, N] the hidden slots behind the unit's region (or the part of it ``narrow`` reads), as ``denoise``."""
    r0, r1 = pending.region
    s = int(getattr(model, "logit_shift", 0))
    read = None if pending.narrow is None else pending.narrow.slots
    dev = pending.active.device
    want = torch.arange(r0, r1, device=dev)[None] - s if read is None else read + (r0 - s)
    return want.clamp(min=0)


def _shared_logits(model: Any, items: list[Item], arena: Arena | None, stored: bool) -> list[torch.Tensor]:
    """One model call for units that agree on ``merge_key``: each unit's [1, R, V] region logits."""
    canvas, pos, visible = _canvas(items)
    t = canvas.shape[1]
    wants = [_wanted(model, p) for _, p in items]
    want = _pad_rows(wants)  # [k, N]
    kw: dict[str, Any] = {}
    first = items[0][0].state
    if first.inputs.block_causal:
        kw["block_length"] = first.block_length
    if first.inputs.answer_blocks is not None:  # the units agree on it (``merge_key``)
        kw["answer_blocks"] = first.inputs.answer_blocks
    if stored:
        comp = []
        for unit, pending in items:
            c = pending.plan.compute
            c0, c1, _ = _span(c, unit.state.total_length)
            comp.append(torch.arange(c0, c1, device=canvas.device)[None] if isinstance(c, slice) else c)
            unit.state.stats.token_forwards += comp[-1].shape[1]
        compute = _pad_rows(comp)  # [k, Q] sorted slot ids
        rows = torch.searchsorted(compute, want).clamp(max=compute.shape[1] - 1)
        store_rows = [u.store_row for u, _ in items]
        lo, hi = min(store_rows), max(store_rows) + 1
        order = torch.tensor(store_rows, device=canvas.device) - lo
        kv = KVAccess(
            arena.window(lo, hi, t),
            rows=None if order.tolist() == list(range(hi - lo)) else order,
            write=items[0][1].plan.write,
        )
        ids, p = canvas.gather(1, compute), pos.gather(1, compute)
        hid = model.hidden_states(ids, p, kv=kv, slots=compute, key_mask=visible, rows=rows, **kw)
    else:
        ends = []
        for unit, pending in items:
            _, c1, _ = _span(pending.plan.compute, unit.state.total_length)
            ends.append(c1)
            unit.state.stats.token_forwards += c1
        c = max(ends)
        own = torch.arange(c, device=canvas.device)[None] < torch.tensor(ends, device=canvas.device)[:, None]
        hid = model.hidden_states(
            canvas[:, :c], pos[:, :c], slots=slice(0, c), key_mask=visible[:, :c] & own, rows=want, **kw
        )
    # the LM head over each unit's own rows only, never the padding: [1, sum N_i, V]
    sizes = [w.shape[1] for w in wants]
    logits = model.output_logits(torch.cat([hid[i, :n] for i, n in enumerate(sizes)])[None]).split(sizes, 1)
    out = []
    for i, (_, pending) in enumerate(items):
        r0, r1 = pending.region
        mine = logits[i]  # [1, N_i, V]
        read = None if pending.narrow is None else pending.narrow.slots
        if read is not None:
            mine = mine.new_zeros(1, r1 - r0, mine.shape[-1]).scatter_(1, read[..., None].expand_as(mine), mine)
        out.append(mine)
    return out
