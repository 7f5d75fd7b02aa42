"""Setting a call up: the state (canvas, inputs, cursor, statistics) and the K/V store its cache writes into."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dlm_decode.cache import KVStore
from dlm_decode.core.inputs import build_canvas
from dlm_decode.core.state import BlockCursor, DecodeInputs, DecodeState, DecodeStats
from dlm_decode.decode.blocks import grid_lengths
from dlm_decode.decode.request import Request
from dlm_decode.models.visibility import AnswerBlocks

END_OF_TURN_TOKENS = ("<|endoftext|>", "<|eot_id|>", "<|im_end|>")  # LLaDA, LLaDA-Instruct, Dream-Instruct


def eos_ids(model: Any, tokenizer: Any | None) -> list[int]:
    """Ids that end an answer: the config's EOS plus the tokenizer's EOS and end-of-turn tokens."""
    ids = set(model.eos_token_ids)
    if tokenizer is not None:
        if isinstance(getattr(tokenizer, "eos_token_id", None), int):
            ids.add(tokenizer.eos_token_id)
        vocab = tokenizer.get_vocab()
        ids.update(vocab[t] for t in END_OF_TURN_TOKENS if t in vocab)
    return sorted(ids)


def prepare(
    model: Any,
    rows: list[list[int]],
    req: Request,
    tokenizer: Any | None = None,
    make_store: Callable[[int], KVStore] | None = None,
) -> tuple[DecodeState, KVStore | None]:
    """The call's state, with any context the sampler forces already written, and its K/V store (None when the
    cache keeps none). ``rows``: checked prompt token ids; ``req``: from ``check_request``. ``make_store(length)``:
    where a one-row call without classifier-free guidance keeps its K/V (the engine's arena row); None: a store of
    its own."""
    cfg = req.config
    mask_id = model.mask_token_id
    pad_id = getattr(model.config, "pad_token_id", None)
    eos = eos_ids(model, tokenizer)
    if pad_id is None:
        pad_id = eos[0] if eos else 0
    device = next(model.parameters()).device
    block_causal = bool(getattr(model, "block_causal", False))
    slots, ends = cfg.gen_length, None
    if block_causal:  # the canvas runs to the end of each row's last grid block (``decode.blocks``)
        slots, ends = grid_lengths([len(r) for r in rows], cfg.gen_length, req.block_length)
    canvas, valid, positions, p = build_canvas(
        rows, gen_length=slots, mask_id=mask_id, pad_id=pad_id, device=device
    )  # [B, T] each
    b, t = canvas.shape
    gen = torch.Generator(device=device)
    gen.manual_seed(cfg.seed if cfg.seed is not None else 0)
    fill = int(model.config.eos_token_id if isinstance(model.config.eos_token_id, int) else eos[0]) if eos else pad_id
    inputs = DecodeInputs(
        positions=positions,
        valid=valid,
        prompt_len=p,
        config=cfg,
        mask_id=mask_id,
        eos_ids=torch.tensor(eos, dtype=torch.long, device=device),
        fill_id=fill,
        generator=gen,
        block_length=req.block_length,
        num_blocks=req.num_blocks,
        steps=req.steps,
        key_mask=None if bool(valid.all()) else valid,
        logit_shift=int(getattr(model, "logit_shift", 0)),
        block_causal=block_causal,
        grid_offset=torch.tensor([p - len(r) for r in rows], device=device) if block_causal else None,
        answer_blocks=AnswerBlocks(p, req.block_length) if cfg.attention == "answer_block_causal" else None,
    )
    state = DecodeState(
        inputs=inputs,
        canvas=canvas,
        finished=torch.zeros(b, dtype=torch.bool, device=device),
        gen_end=torch.full((b,), t, dtype=torch.long, device=device)
        if ends is None
        else torch.tensor(ends, device=device),
        cursor=BlockCursor(next_start=torch.full((b,), p, dtype=torch.long, device=device)),
        stats=DecodeStats.empty(b, cfg.gen_length, device),
    )
    forced = req.sampler.forced_tokens(state)
    if forced is not None:  # context, not decoding: no trace, not counted
        state.canvas = torch.where(forced.commit, forced.tokens, state.canvas)
    store = None
    if req.cache.uses_store and make_store is not None and b == 1 and cfg.cfg_scale == 0:
        store = make_store(t)
    elif req.cache.uses_store:
        n_layers, n_kv, hd = model.kv_shape()
        rows_eff = 2 * b if cfg.cfg_scale > 0 else b  # classifier-free guidance decodes an unconditional copy
        dtype = next(model.parameters()).dtype
        store = KVStore(n_layers, rows_eff, n_kv, t, hd, dtype=dtype, device=device)
    return state, store
