"""The one decode loop: every sampler with every cache, on batches of mixed prompt lengths.

    out = generate(model, ["What is 2+2?"], tokenizer=tok, chat=True, sampler="threshold",
                   sampler_options={"threshold": 0.9}, cache="dual", gen_length=256, block_length=32)

Per block: the sampler's ``begin_block``; then steps until no row has a MASK left in its block: the cache plans
which slots to recompute, the model returns aligned logits for the sampler's region, the sampler selects, the loop
commits (only masked in-block slots of unfinished rows, never MASK), applies cuts and the EOS stop, and records
statistics. Every block has a step bound (the sampler's ``max_block_steps``): at the last allowed step every
remaining mask of the block is committed with its proposal, so the loop always ends and never leaves a MASK.
A row whose logits turn non-finite is stopped with an error message; the other rows go on.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm.auto import tqdm

from dlm_decode.cache.base import CachePolicy, StepPlan
from dlm_decode.cache.store import KVStore
from dlm_decode.core.config import DecodeConfig
from dlm_decode.core.inputs import Prompt, build_canvas, encode_prompts
from dlm_decode.core.request import ModelFacts, check_request
from dlm_decode.core.state import DecodeState
from dlm_decode.options import describe
from dlm_decode.samplers.base import Sampler, candidates


@dataclass
class RowResult:
    prompt_ids: list[int]
    generated_ids: list[int]  # the gen_length slots after the prompt
    text: str | None
    nfe: int  # forwards this row took part in while unfinished
    error: str | None = None


@dataclass
class GenerateOutput:
    sequences: torch.Tensor  # [B, T] final canvas (left-padded prompts + generation)
    rows: list[RowResult]
    nfe: int  # model forwards (a classifier-free-guidance pair counts once)
    seconds: float
    tokens_per_step: list[list[int]]  # per step, tokens committed in each row
    token_forwards: int  # query slots computed by the model, summed over rows and steps
    cache_bytes: int  # K/V store allocated for the call (0 without a cache)
    refreshes: int  # steps that recomputed every slot
    sampler: dict[str, Any] = field(default_factory=dict)
    cache: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)  # the DecodeConfig decoded with (unset options filled in)
    trace: torch.Tensor | None = None  # [B, L] step that committed each generation slot (-1: cut / filled)
    scratch: dict[str, Any] = field(default_factory=dict)  # the call's sampler / cache memory (records, statistics)

    @property
    def generated(self) -> torch.Tensor:  # [B, L]
        return self.sequences[:, self.sequences.shape[1] - len(self.rows[0].generated_ids) :]

    @property
    def texts(self) -> list[str | None]:
        return [r.text for r in self.rows]

    def committed_tokens(self) -> int:
        return sum(sum(s) for s in self.tokens_per_step)

    def to_json(self) -> dict[str, Any]:
        return {
            "rows": [
                {
                    "prompt_ids": r.prompt_ids,
                    "generated_ids": r.generated_ids,
                    "text": r.text,
                    "nfe": r.nfe,
                    "error": r.error,  # None, or why the row stopped early (its slots are then not an answer)
                }
                for r in self.rows
            ],
            "nfe": self.nfe,
            "seconds": self.seconds,
            "token_forwards": self.token_forwards,
            "cache_bytes": self.cache_bytes,
            "sampler": self.sampler,
            "cache": self.cache,
            "config": self.config,
        }


END_OF_TURN_TOKENS = ("<|endoftext|>", "<|eot_id|>", "<|im_end|>")  # LLaDA, LLaDA-Instruct, Dream-Instruct


def _eos_ids(model: Any, tokenizer: Any | None) -> list[int]:
    """Ids that end an answer: the config's EOS plus the tokenizer's EOS and end-of-turn tokens."""
    ids = set(model.eos_token_ids)
    if tokenizer is not None:
        if isinstance(getattr(tokenizer, "eos_token_id", None), int):
            ids.add(tokenizer.eos_token_id)
        vocab = tokenizer.get_vocab()
        ids.update(vocab[t] for t in END_OF_TURN_TOKENS if t in vocab)
    return sorted(ids)


@torch.no_grad()
def generate(
    model: Any,
    prompts: list[Prompt] | torch.Tensor,
    *,
    tokenizer: Any | None = None,
    chat: bool = False,
    sampler: str | Sampler = "low_confidence",
    sampler_options: dict[str, Any] | None = None,
    cache: str | CachePolicy | None = "none",
    cache_options: dict[str, Any] | None = None,
    config: DecodeConfig | None = None,
    trace: bool = False,
    progress: bool = False,
    **config_kwargs: Any,
) -> GenerateOutput:
    """Decode a batch. ``prompts``: texts, chats, token-id lists, or a [B, P] tensor of ids (no padding).

    Decoding options (``gen_length``, ``block_length``, ``steps``, ``temperature``, ``top_p``, ``top_k``, ``seed``,
    ``stop_at_eos``, ``cfg_scale``) come as keywords or as a ``DecodeConfig``.
    """
    rows = encode_prompts(prompts, tokenizer, chat)
    req = check_request(
        ModelFacts.of_model(model),
        rows,
        sampler=sampler,
        sampler_options=sampler_options,
        cache=cache,
        cache_options=cache_options,
        config=config,
        **config_kwargs,
    )
    cfg, smp, pol, block, num_blocks = req.config, req.sampler, req.cache, req.block_length, req.num_blocks
    smp, cfg = smp.with_defaults(cfg, model.sampling_defaults)  # unset options: the sampler's reference defaults
    mask_id = model.mask_token_id
    pad_id = getattr(model.config, "pad_token_id", None)
    eos = _eos_ids(model, tokenizer)
    if pad_id is None:
        pad_id = eos[0] if eos else 0
    device = next(model.parameters()).device
    canvas, valid, positions, p = build_canvas(
        rows, gen_length=cfg.gen_length, mask_id=mask_id, pad_id=pad_id, device=device
    )
    b, t = canvas.shape
    gen = torch.Generator(device=device)
    gen.manual_seed(cfg.seed if cfg.seed is not None else 0)
    fill = int(model.config.eos_token_id if isinstance(model.config.eos_token_id, int) else eos[0]) if eos else pad_id
    state = DecodeState(
        canvas=canvas,
        positions=positions,
        valid=valid,
        prompt_len=p,
        config=cfg,
        mask_id=mask_id,
        eos_ids=torch.tensor(eos, dtype=torch.long, device=device),
        fill_id=fill,
        generator=gen,
        block_length=block,
        num_blocks=num_blocks,
        finished=torch.zeros(b, dtype=torch.bool, device=device),
        failed=[None] * b,
        gen_end=torch.full((b,), t, dtype=torch.long, device=device),
        trace=torch.full((b, cfg.gen_length), -1, dtype=torch.long, device=device),
        row_steps=torch.zeros(b, dtype=torch.long, device=device),
        logit_shift=int(getattr(model, "logit_shift", 0)),
    )
    store = None
    if pol.uses_store:
        n_layers, n_kv, hd = model.kv_shape()
        rows_eff = 2 * b if cfg.cfg_scale > 0 else b
        dtype = next(model.parameters()).dtype
        store = KVStore(n_layers, rows_eff, n_kv, t, hd, dtype=dtype, device=device)
    refreshes = 0
    bar = tqdm(total=b * cfg.gen_length, desc=f"{smp.name}/{pol.name}", disable=not progress, leave=False)
    start = time.perf_counter()
    # Blocks advance per row: a row's next block starts where its last one ended (fixed-size blocks by default; a
    # sampler may move ``state.block_end`` to make blocks variable). ``block_start`` is shared: the earliest start
    # among unfinished rows; slots between it and a row's own start are already decoded, so they are never candidates.
    next_start = torch.full((b,), p, device=device, dtype=torch.long)  # [B]
    bi = 0
    while True:
        todo = ~state.finished & (next_start < state.gen_end)
        if not bool(todo.any()):
            break
        state.block_index, state.block_step = bi, 0
        state.block_starts = next_start.clone()
        state.block_start = int(next_start[todo].min())
        state.block_end = torch.minimum(next_start + block, state.gen_end)
        smp.begin_block(state)
        pol.begin_block(state)
        limit = smp.max_block_steps(state)
        state.block_limit = limit
        while True:
            cand_all = state.block_masked()  # [B, T]
            active = cand_all.any(1)
            if not bool(active.any()):
                break
            r0, r1 = smp.region(state)
            plan = pol.plan(state, (r0, r1))
            last = state.block_step + 1 >= limit
            if last and plan.candidates is not None:
                raise RuntimeError(f"cache {pol.name!r} restricted the candidates at the block's last allowed step")
            refreshes += int(plan.refresh)
            logits = _forward(model, state, plan, (r0, r1), store)  # [B, R, V]
            computed = None if plan.candidates is None else plan.candidates[:, r0:r1]  # [B, R]
            if computed is not None:  # slots the policy did not compute: flat logits, never committed
                logits = logits.masked_fill(~computed[..., None], 0.0)
            _fail_nonfinite(state, logits, candidates(state, r0, r1))
            sel = smp.select(state, logits, r0)
            cand = candidates(state, r0, r1)
            allowed = cand if sel.stop_rows is None else cand | _all_in(state, sel.stop_rows, r0, r1)
            if computed is not None:
                cand, allowed = cand & computed, allowed & computed
            commit = sel.commit & allowed
            if last:  # step bound reached: finish the block
                commit = commit | (cand & state.in_block()[:, r0:r1])
            if bool((commit & (sel.tokens == mask_id)).any()):
                raise RuntimeError(f"sampler {smp.name!r} proposed the MASK id for a committed slot")
            committed = torch.zeros_like(cand_all)
            committed[:, r0:r1] = commit
            state.canvas[:, r0:r1] = torch.where(commit, sel.tokens, state.canvas[:, r0:r1])
            _record(state, committed, active)
            if sel.cut_at is not None:
                _cut(state, sel.cut_at)
            if sel.stop_rows is not None:
                _stop_rows(state, sel.stop_rows)
            if cfg.stop_at_eos:
                _stop_at_eos(state)
            state.step += 1
            state.block_step += 1
            state.finished |= ~state.is_masked()[:, p:].any(1)
            pol.after_step(state, committed)
            bar.update(int(committed.sum()))
        next_start = torch.maximum(state.block_end, next_start)
        bi += 1
    bar.close()
    seconds = time.perf_counter() - start
    return _output(state, rows, tokenizer, smp, pol, store, refreshes, seconds, trace)


def _forward(model: Any, state: DecodeState, plan: StepPlan, region: tuple[int, int], store: KVStore | None):
    canvas, pos, km, ki, compute = state.canvas, state.positions, plan.key_mask, plan.key_index, plan.compute
    cfg_scale = state.config.cfg_scale
    if cfg_scale > 0:  # unconditional copy: the prompt fully masked (LLaDA)
        un = canvas.clone()
        un[:, : state.prompt_len][state.valid[:, : state.prompt_len]] = state.mask_id
        canvas, pos = torch.cat([canvas, un]), torch.cat([pos, pos])
        km = None if km is None else torch.cat([km, km])
        ki = ki if ki is None or isinstance(ki, slice) else torch.cat([ki, ki])
        compute = compute if isinstance(compute, slice) else torch.cat([compute, compute])
    if store is not None:
        store.frozen = not plan.write
    try:
        logits = model.denoise(canvas, pos, compute=compute, region=region, store=store, key_mask=km, key_index=ki)
    finally:
        if store is not None:
            store.end_step()
            store.frozen = False
    if isinstance(compute, slice):
        c0, c1, _ = compute.indices(canvas.shape[1])
        n_q = c1 - c0
    else:
        n_q = compute.shape[1]
    state.token_forwards += n_q * canvas.shape[0]
    if cfg_scale > 0:
        cond, unc = logits.chunk(2)
        logits = unc + (cfg_scale + 1) * (cond - unc)
    return logits


def _fail_nonfinite(state: DecodeState, logits: torch.Tensor, cand: torch.Tensor) -> None:
    if bool(torch.isfinite(logits).all()):
        return
    bad_pos = ~torch.isfinite(logits).all(-1) & cand  # [B, R]
    for i in bad_pos.any(1).nonzero().flatten().tolist():
        if state.failed[i] is None:
            state.failed[i] = f"non-finite logits at step {state.step} (block {state.block_index}); row stopped"
        state.finished[i] = True


def _record(state: DecodeState, committed: torch.Tensor, active: torch.Tensor) -> None:
    p, n = state.prompt_len, state.gen_length
    gen_commit = committed[:, p : p + n]
    state.trace[gen_commit] = state.step
    state.tokens_per_step.append(committed.sum(1).tolist())
    state.row_steps += active.long()


def _cut(state: DecodeState, cut_at: torch.Tensor) -> None:
    """Fill generation slots >= cut_at with the fill id, decoded or not (EoTP truncates the canvas there); rows with
    cut_at < 0 are untouched."""
    idx = torch.arange(state.total_length, device=state.device)
    rows = (cut_at >= 0) & ~state.finished
    cut = rows[:, None] & (idx[None, :] >= cut_at[:, None]) & (idx[None, :] >= state.prompt_len)
    state.canvas[cut] = state.fill_id
    state.trace[cut[:, state.prompt_len :]] = -1
    state.gen_end = torch.where(rows, torch.minimum(state.gen_end, cut_at), state.gen_end)
    state.block_end = torch.minimum(state.block_end, state.gen_end)


def _all_in(state: DecodeState, stop_rows: torch.Tensor, r0: int, r1: int) -> torch.Tensor:
    """[B, R] masked generation slots of the region in unfinished stopping rows (an all-in commit may fill them)."""
    idx = torch.arange(r0, r1, device=state.device)
    gen = (idx[None, :] >= state.prompt_len) & (idx[None, :] < state.gen_end[:, None])
    return stop_rows[:, None] & ~state.finished[:, None] & gen & state.is_masked()[:, r0:r1]


def _stop_rows(state: DecodeState, stop_rows: torch.Tensor) -> None:
    """Stop rows after an all-in commit; any mask the region did not cover gets the fill id (never leave a MASK)."""
    left = stop_rows[:, None] & state.is_masked()
    left[:, : state.prompt_len] = False
    state.canvas[left] = state.fill_id
    state.finished |= stop_rows


def _stop_at_eos(state: DecodeState) -> None:
    """Rows whose first EOS has every earlier generation slot decoded get the rest filled with EOS."""
    p = state.prompt_len
    gen = state.canvas[:, p:]
    n = gen.shape[1]
    idx = torch.arange(n, device=state.device)
    masked = gen == state.mask_id
    first_mask = torch.where(masked.any(1), masked.float().argmax(1), n)
    is_eos = torch.isin(gen, state.eos_ids)
    first_eos = torch.where(is_eos.any(1), is_eos.float().argmax(1), n)
    stop = (first_eos < first_mask) & ~state.finished
    if not bool(stop.any()):
        return
    fill = stop[:, None] & (idx[None, :] > first_eos[:, None]) & masked
    gen[fill] = state.fill_id
    state.finished |= stop


def _output(state, rows, tokenizer, smp, pol, store, refreshes, seconds, trace) -> GenerateOutput:
    p = state.prompt_len
    eos = set(state.eos_ids.tolist())
    results = []
    for i in range(state.batch):
        ids = state.canvas[i, p:].tolist()
        text = None
        if tokenizer is not None:
            end = next((j for j, tkn in enumerate(ids) if tkn in eos), len(ids))
            text = tokenizer.decode([x for x in ids[:end] if x != state.mask_id], skip_special_tokens=True)
        results.append(RowResult(rows[i], ids, text, int(state.row_steps[i]), state.failed[i]))
    return GenerateOutput(
        sequences=state.canvas,
        rows=results,
        nfe=state.step,
        seconds=seconds,
        tokens_per_step=state.tokens_per_step,
        token_forwards=state.token_forwards,
        cache_bytes=store.nbytes if store is not None else 0,
        refreshes=refreshes,
        sampler=describe(smp),
        cache=describe(pol),
        config=dataclasses.asdict(state.config) | {"block_length": state.block_length},
        trace=state.trace if trace else None,
        scratch=state.scratch,
    )
