"""The step's forward: which rows and slots the model computes, the model call, and classifier-free guidance.

``region_logits`` runs the current canvas under the cache's plan; ``draft_logits`` runs it beside a draft-and-verify
sampler's drafts. For a sampler that reads only its candidates' logits (``SamplerTraits.reads_candidates_only``),
``subset`` narrows the forward without changing what the sampler sees (the same ``[B, R, V]`` logits at every slot
it reads, zeros elsewhere):

* rows: a row with no candidate in this step sits out the forward (batch compaction): no projection, MLP or LM
  head for it; with a cache the attention still runs over the store's whole batch (``KVAccess.rows``: zero
  queries for the idle rows, rather than copying the busy rows' keys in every layer). Its K/V in the store are not
  rewritten, and nothing reads them before a forward that rewrites them: a row's K/V are read only by its own
  queries, a row without masks in its block keeps none until the block ends, and every cache policy recomputes a
  row's keys at a block start (or, ``dkv_prefill``, the whole generation region) before that row queries again.
  The reference loops keep computing such rows until the whole batch has finished the block.
* slots: only the candidates get logits; the model runs the last layer's attention output and MLP, the final norm
  and the LM head for them alone (``denoise(read=...)``).

Both sizes come from the host counts of the step's one sync (``StepMasks``), so building them costs no extra sync.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from dlm_decode.cache import KVStore, StepPlan
from dlm_decode.cache.plans import rows_to_index
from dlm_decode.cache.store import KVAccess
from dlm_decode.core.state import DecodeState
from dlm_decode.models.graphs import active_graphs
from dlm_decode.samplers import Sampler
from dlm_decode.samplers.base import Drafts, candidates


class StepMasks(NamedTuple):
    """Host counts read at the step's one sync (``loop._masks_left``), before the step changes anything."""

    most: int  # the most MASK slots a row has left in its current block (0: the block is done)
    rows: int  # rows with a MASK left in their current block


@dataclass(frozen=True)
class Subset:
    """What a forward computes, when less than every row's whole region (None fields: all of it)."""

    rows: torch.Tensor | None = None  # [n] batch rows that take part, busy ones first; the others get zero logits
    slots: torch.Tensor | None = None  # [B, N] region offsets whose logits are wanted (padded by repeats)


def subset(
    state: DecodeState, smp: Sampler, region: tuple[int, int], computed: torch.Tensor | None, masks: StepMasks | None
) -> Subset | None:
    """The rows and slots a sampler that reads only its candidates needs (``computed`` [B, R]: the slots the policy
    computed, when it restricts them); None when it needs everything or the counts are unknown."""
    if not smp.traits.reads_candidates_only or masks is None:
        return None
    r0, r1 = region
    cand = candidates(state, r0, r1)  # [B, R]
    rows = None
    if masks.rows < state.batch:  # busy rows first (stable), cut at the host count: no sync
        rows = torch.argsort((~cand.any(1)).to(torch.uint8), stable=True)[: masks.rows]
    if computed is not None:  # the policy computed these alone; the others get flat logits anyway
        cand = cand & computed
    slots = rows_to_index(cand, masks.most) if masks.most < r1 - r0 else None
    return None if rows is None and slots is None else Subset(rows, slots)


def region_logits(
    model: Any,
    state: DecodeState,
    plan: StepPlan,
    region: tuple[int, int],
    store: KVStore | None,
    narrow: Subset | None = None,
) -> torch.Tensor:
    """[B, R, V] aligned logits of the region (zeros where ``narrow``, from ``subset``, leaves them out), with
    classifier-free guidance applied when asked for."""
    canvas, pos, valid = state.canvas, state.positions, state.valid
    if plan.layers is not None:  # a depth-aware program keeps per-row caches of the whole batch: never narrowed
        narrow = None
    rows = None if narrow is None else narrow.rows
    slots = None if narrow is None else narrow.slots
    if rows is None:
        return run_model(model, state, plan, region, store, canvas, pos, valid, slots)

    def take(x: Any) -> Any:  # [B, ...] -> [n, ...]; slices and None pass through
        return x[rows] if isinstance(x, torch.Tensor) else x

    plan = dataclasses.replace(
        plan, compute=take(plan.compute), key_mask=take(plan.key_mask), key_index=take(plan.key_index)
    )
    logits = run_model(model, state, plan, region, store, take(canvas), take(pos), take(valid), take(slots), rows)
    out = logits.new_zeros(state.batch, *logits.shape[1:])
    return out.index_copy_(0, rows, logits)


def draft_logits(
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
    logits = run_model(model, state, plan, region, copies, flat, rows(state.positions), rows(state.valid))
    return logits.view(b, n, *logits.shape[1:])


def run_model(
    model: Any,
    state: DecodeState,
    plan: StepPlan,
    region: tuple[int, int],
    store: KVStore | None,
    canvas: torch.Tensor,  # [N, T]
    pos: torch.Tensor,  # [N, T]
    valid: torch.Tensor,  # [N, T]
    read: torch.Tensor | None = None,  # [N, K] region offsets whose logits are wanted (None: all)
    store_rows: torch.Tensor | None = None,  # [N] the store's rows these canvases are (None: all, in order)
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
        if store_rows is not None:  # the store's second half holds the unconditional rows
            store_rows = torch.cat([store_rows, store_rows + state.batch])
    kv = None if store is None else KVAccess(store, rows=store_rows, write=plan.write)  # this forward's use of it
    graphs = active_graphs(model)  # ``models.graphs``: a fixed-shape step replayed as a CUDA graph
    blocks = {"block_length": state.block_length} if state.inputs.block_causal else {}  # block-causal mask
    if state.inputs.answer_blocks is not None:  # D2F's attention on a bidirectional model
        blocks = {"answer_blocks": state.inputs.answer_blocks}
    if plan.layers is not None:  # Elastic-Cache's depth-aware layers: eager, their compute set moves per layer
        logits = model.denoise(
            canvas, pos, compute=compute, region=region, store=kv, key_mask=km, key_index=ki, layers=plan.layers
        )
    elif graphs is not None and graphs.takes(canvas, compute, kv, ki, read):
        logits = graphs.run(
            model.denoise, canvas, pos, compute=compute, region=region, key_mask=km, key_index=ki, **blocks
        )
    else:
        logits = model.denoise(
            canvas, pos, compute=compute, region=region, store=kv, key_mask=km, key_index=ki, read=read, **blocks
        )
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
