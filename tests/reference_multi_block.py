"""Straightforward re-statements of the two published multi-block decoders, written from their code's behaviour for
token-identity tests of dlm_decode's multi-block mode (``ALGORITHMS.md`` §15, issue 77): batch 1, temperature 0.

They keep the references' structure on purpose (Python dicts of block states, one loop iteration per step, the
references' bookkeeping of mask counts) so that they are an independent check of the vectorised library code.

D2F: zhijie-group/Discrete-Diffusion-Forcing @ 771f745, ``D2F-eval/eval_llada.py`` and ``eval_dream.py``:
``DreamLoRA._generate_block_single`` (both files), ``_update_block_completion_states``, ``sample_tokens``,
``create_full_block_attention_mask``, ``_shift_logits`` (Dream). The reference keeps a K/V cache of finished blocks;
under its block-causal mask a finished block's K/V never change once every earlier block is finished, so
:func:`d2f_generate` runs every step as one forward of the whole current canvas under the dense mask (the same
logits, one forward per reference forward). ``model(x [1, T], mask4d [1, 1, T, T] additive float32) -> raw logits``.

d3LLM: hao-ai-lab/d3LLM @ e5bfcac, ``d3llm/d3llm_LLaDA/d3llm_llada_generate_util.py`` (``generate_multi_block``,
``generate_multi_block_kv_cache``, ``handle_early_stop``, ``get_transfer_index_entropy``) and
``d3llm/d3llm_DREAM/d3llm_dream_generate_util.py`` (``_sample_multi_block``, ``_sample_multi_block_kv_cache``); the
cache semantics of ``utils/utils_LLaDA/model/modeling_llada.py`` ``attention()`` (and the Dream twin
``utils/utils_Dream/model/modeling_dream.py``): K/V are stored after RoPE in a ``DynamicCache``; ``update_kvcache=N``
appends the first N new K/V to it, 0 attends to past + new without storing; RoPE positions start at
``cache_position[0]``; the attention is bidirectional over every key (``attn_mask=None``).
:func:`d3llm_generate`: ``model(x [1, T]) -> raw logits``. :func:`d3llm_generate_cached`: a dlm_decode model, run
through ``denoise`` with a ``KVStore`` (see its docstring for the mapping, and for the keys Dream's reference holds
twice). Early stop keeps a quirk of both references: a step selects among the masks read at its start, also after
``handle_early_stop`` has turned the slots past the first EOS into EOS, so in that step such a slot can be committed
again (argmax); the final canvas can hold non-EOS tokens after the first EOS.

Both return ``(tokens, forwards)``: D2F the answer ``x[0, P:]`` ([L] long; shorter than ``max_new_tokens`` when an
EOS stopped the opening of blocks), d3LLM the final canvas [1, P + G] (as the references return them), and the
number of model forwards actually run.

LLaDA and Dream variants (``shift``): what differs.
- D2F: Dream shifts the logits by one (slot i is predicted at hidden i - 1; the reference fills the first slot of a
  forward with the last cached slot's logit); Dream takes EOS from the tokenizer, LLaDA hard-codes 126081 (here:
  ``eos_id`` for both); Dream returns the text cut at the first EOS, LLaDA all generated ids; the cache length is
  read from the cache (Dream) or counted (LLaDA), and ``update_kvcache`` is passed as the new length (Dream) or the
  total length (LLaDA): the same cache either way. Published defaults differ (``max_length`` 2048 / 4096, mask id).
- d3LLM: Dream shifts the logits (``cat(raw[:, :1], raw[:, :-1])``: the first slot of a forward keeps its own logit,
  also in a cached forward that starts mid-canvas); Dream's selection is ``entropy < threshold`` only (no global
  lowest-entropy mask), LLaDA's is the global lowest-entropy mask plus ``entropy <= threshold``; both then force the
  lowest-entropy mask of the first fully activated block that got none. Dream's early stop recounts every block's
  masks from the canvas (and, cached, marks the blocks after the EOS as cached); LLaDA only corrects the blocks
  ``handle_early_stop`` touches. Dream's cached variant counts blocks with a ceiling (LLaDA: floor; equal when the gen
  length is a multiple of the block) and its cache scan does not stop at a block still within its delay (LLaDA's
  does), so Dream can hold a block's keys twice: see :func:`d3llm_generate_cached`. The no-cache loops decrement
  mask counts without a floor, the cached loops floor them at 0. Both: argmax tokens, entropy of the float64
  softmax with epsilon 1e-12, no top-p / top-k at temperature 0 (Dream's ``alg`` must be ``entropy_threshold``).

Published settings (temperature 0 unless said; gen length = ``max_new_tokens``):
- D2F LLaDA (``D2F-eval/eval_llada.sh``, LLaDA-8B-Instruct + D2F_LLaDA_Instruct_8B_Lora, bf16, gen 512):
  GSM8K block 64, block_add 0.7; MBPP block 32, add 0.9; MATH block 32, add 0.1; HumanEval block 32, add 0.1;
  decoded_token_threshold 0.95 and skip_threshold 0.9 everywhere; top-p none, sampling_strategy default.
- D2F Dream (``D2F-eval/eval_dream.sh``, Dream-v0-Base-7B + D2F_Dream_Base_7B_Lora, bf16, gen 256): GSM8K-CoT block 32,
  MBPP block 48, MATH block 64, each add 0.1, skip 0.9; HumanEval block 32, add 0.9, skip 0.95; decoded 0.95 everywhere.
- d3LLM LLaDA (``eval_scripts/llada_*.sh``, d3LLM/d3LLM_LLaDA, gen 256, block 32; the harness defaults
  ``utils/utils_LLaDA/eval_llada.py``: block_add 0.1, decoded 0.95, cache_delay_iter 10000, refresh 10000,
  temperature 0, early_stop False): ``generate_multi_block`` threshold 0.5 (gsm8k_cot, math), 0.4 (long gsm8k,
  mbpp), early_stop True; ``generate_multi_block_kv_cache``: gsm8k_cot threshold 0.5, delay 2, refresh 3; long gsm8k
  0.4, delay 2, refresh 10000; math 0.5, delay 1, refresh 10000; mbpp 0.4, delay 1, refresh 10000; humaneval 0.5,
  delay 2, refresh 4 with block_add 1.0 and decoded 1.0; all early_stop True. (``llada_humaneval.sh``'s section
  titled generate_multi_block passes no generation_method: it runs the harness default ``generate``.)
- d3LLM Dream (``eval_scripts/dream_*.sh``, d3LLM/d3LLM_Dream, ``generation_method=generation_multi_block``,
  gen 256, block 32, block_add 0.1, decoded 0.95, all passed explicitly (the harness defaults in
  ``utils/utils_Dream/eval_instruct/lm_eval/models/diffllm.py``: threshold 0.45, block_add 1.0, decoded 1.0,
  delay 10000, refresh 10000, early_stop False); ``cache_delay_iter`` >= 10000 selects the no-cache loop):
  no cache: gsm8k_cot 0.4, math 0.4, mbpp 0.4 (temperature 0), humaneval 0.5 and long gsm8k 0.4 at temperature 0.1
  (humaneval with early_stop True); cached: gsm8k_cot 0.4 delay 1, long gsm8k 0.45 delay 1, math 0.4 delay 2,
  mbpp 0.45 delay 2 (temperature 0), humaneval 0.5 delay 2 (temperature 0.1); refresh 10000, early_stop True.
  ``eval_scripts/dream-coder.sh`` (d3LLM_Dream_Coder, evalplus): gen 512, threshold 0.5, block 32, add 0.1,
  decoded 0.95, delay 32, early_stop True (no refresh given).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dlm_decode.cache.store import KVAccess, KVStore

# ---- shared -----------------------------------------------------------------------------------------------------


def shift_logits(raw: torch.Tensor) -> torch.Tensor:
    """Dream's one-slot shift over a forward that starts at slot 0: slot i gets the raw logit of slot i - 1, slot 0
    keeps its own (d3LLM's ``cat(raw[:, :1], raw[:, :-1])``; D2F fills it with a cached logit or 1.0, but slot 0 is
    a prompt slot and its logit is never read)."""
    return torch.cat([raw[:, :1], raw[:, :-1]], dim=1)


def _progress(block: dict) -> float:
    return 1 - block["mask_count"] / block["total_masks"]


# ---- D2F --------------------------------------------------------------------------------------------------------


def d2f_mask(prompt_length: int, total: int, block_size: int) -> torch.Tensor:
    """``create_full_block_attention_mask`` for a canvas of ``total`` slots, additive float32 [1, 1, T, T]: the prompt
    sees itself; answer block b (on the grid from the prompt's end) sees the prompt, blocks < b and itself."""
    slot = torch.arange(total)
    block = torch.where(slot < prompt_length, 0, 1 + (slot - prompt_length).div(block_size, rounding_mode="floor"))
    visible = block[None, :] <= block[:, None]  # [T, T] query row, key column
    return torch.zeros(total, total).masked_fill(~visible, float("-inf"))[None, None]


def _d2f_open_block(x: torch.Tensor, blocks: dict, mask_id: int, block_size: int) -> torch.Tensor:
    start = x.shape[1]
    blocks[len(blocks)] = {
        "start": start,
        "end": start + block_size,
        "mask_count": block_size,
        "total_masks": block_size,
        "state": "active",
        "is_complete": False,
    }
    return torch.cat([x, torch.full((1, block_size), mask_id, dtype=x.dtype)], dim=1)


def _d2f_activate(blocks: dict, decoded_token_threshold: float) -> None:
    """``_update_block_completion_states``: a block whose decoded share reaches the threshold fully activates the next
    one (the prompt, share 1, activates block 1)."""
    for bid in sorted(blocks):
        if _progress(blocks[bid]) >= decoded_token_threshold and bid + 1 in blocks:
            blocks[bid + 1]["is_complete"] = True


def _d2f_commit(x, block, logits, mask_id, eos_id, skip_threshold) -> bool:
    """Commit one active block's masks from this step's logits [1, T, V]; True when an EOS was committed.

    ``sample_tokens`` at temperature 0 without top-p / top-k: the softmax of the logits in the model dtype (float32
    here, the dtype of the tests' models), argmax token and its probability. Fully activated: every mask with
    probability > skip_threshold, or the single most confident one when none passes; semi-activated: only those."""
    rel = torch.where(x[0, block["start"] : block["end"]] == mask_id)[0]  # masked offsets in the block
    probs = torch.softmax(logits[0, block["start"] + rel], dim=-1)  # [M, V]
    conf, x0 = probs.max(dim=-1)
    chosen = torch.where(conf > skip_threshold)[0]
    if block["is_complete"] and len(chosen) == 0:
        chosen = torch.topk(conf, 1).indices
    for i in chosen.tolist():
        x[0, block["start"] + int(rel[i])] = x0[i]
    block["mask_count"] -= len(chosen)
    return any(int(x0[i]) == eos_id for i in chosen.tolist())


def _d2f_deactivate(blocks: dict, finished: list[int]) -> int:
    """Finished active blocks become 'to_cache' (cached by the next forward) once no earlier block is active, in
    block order; returns how many left the active set."""
    n = 0
    for bid in finished:
        if blocks[bid]["state"] == "active" and all(blocks[b]["state"] != "active" for b in range(bid)):
            blocks[bid]["state"] = "to_cache"
            n += 1
    return n


@torch.no_grad()
def d2f_generate(
    model,
    prompt: torch.Tensor,  # [1, P]
    *,
    mask_id: int,
    eos_id: int,
    block_size: int,
    max_new_tokens: int,
    block_add_threshold: float,
    decoded_token_threshold: float,
    skip_threshold: float,
    shift: bool,
    trace: list | None = None,
) -> tuple[torch.Tensor, int]:
    """D2F ``_generate_block_single`` at temperature 0: (answer tokens [L], forwards). ``trace``: a list that gets,
    per forward, the number of active blocks (open blocks, finished ones waiting for an earlier one included)."""
    x = prompt.clone()
    p = x.shape[1]
    blocks = {0: {"start": 0, "end": p, "mask_count": 0, "total_masks": p, "state": "to_cache", "is_complete": True}}
    active, eos_detected, forwards = 0, False, 0
    while True:
        # at most one block per step, at its start, while the answer has room and no EOS was committed
        if len(blocks) - 1 < max_new_tokens // block_size and not eos_detected:
            if _progress(blocks[len(blocks) - 1]) >= block_add_threshold:
                x = _d2f_open_block(x, blocks, mask_id, block_size)
                active += 1
        _d2f_activate(blocks, decoded_token_threshold)
        if not bool((x == mask_id).any()) and active == 0:
            break
        open_ids = [b for b in sorted(blocks) if blocks[b]["state"] == "active"]
        if not open_ids and not any(s["state"] == "to_cache" for s in blocks.values()):
            break  # the reference stops before its forward: nothing to denoise, nothing to cache
        logits = model(x, d2f_mask(p, x.shape[1], block_size))  # [1, T, V]
        forwards += 1
        if shift:
            logits = shift_logits(logits)
        if trace is not None:
            trace.append(len(open_ids))
        for s in blocks.values():
            if s["state"] == "to_cache":
                s["state"] = "in_cache"  # their K/V were written by this forward
        finished = []
        for bid in open_ids:
            block = blocks[bid]
            if bool((x[0, block["start"] : block["end"]] == mask_id).any()):
                eos_detected |= _d2f_commit(x, block, logits, mask_id, eos_id, skip_threshold)
            if not bool((x[0, block["start"] : block["end"]] == mask_id).any()):
                finished.append(bid)
        active -= _d2f_deactivate(blocks, finished)
    return x[0, p:], forwards


# ---- d3LLM: block bookkeeping -----------------------------------------------------------------------------------


def _d3_block(start: int, end: int, mask_count: int, is_complete: bool, cached: bool | None) -> dict:
    block = {
        "start": start,
        "end": end,
        "mask_count": mask_count,
        "total_masks": end - start,
        "is_complete": is_complete,
    }
    if cached is not None:  # the cached loops' extra fields
        block.update(completed_at_nfe=None, is_cached=cached)
    return block


def _d3_init(prompt_length: int, gen: int, block_size: int, decoded_token_threshold: float, cached: bool) -> dict:
    """Block 0 is the prompt (complete; cached loops: finished at nfe 0, not cached); block 1 exists from the start,
    fully activated when the prompt's share 1 reaches ``decoded_token_threshold``."""
    blocks = {0: _d3_block(0, prompt_length, 0, True, False if cached else None)}
    if cached:
        blocks[0]["completed_at_nfe"] = 0
    end = min(prompt_length + block_size, prompt_length + gen)
    blocks[1] = _d3_block(
        prompt_length, end, end - prompt_length, 1.0 >= decoded_token_threshold, False if cached else None
    )
    return blocks


def _d3_activate(blocks: dict, decoded_token_threshold: float) -> None:
    for bid in sorted(blocks):
        if bid > 0 and not blocks[bid]["is_complete"] and _progress(blocks[bid - 1]) >= decoded_token_threshold:
            blocks[bid]["is_complete"] = True


def _d3_maybe_open(x, blocks, p, gen, block_size, num_blocks, mask_id, add_thr, dec_thr, cached) -> None:
    """Open the next block (at most one per step) when the last one's share reaches ``add_thr`` or it has no mask.
    Runs after the activation update, so the new block's activation is decided here from its predecessor's share."""
    bid = len(blocks)
    last = blocks[bid - 1]
    if bid > num_blocks or bid - 1 == 0 or not (_progress(last) >= add_thr or last["mask_count"] == 0):
        return
    start = p + (bid - 1) * block_size
    end = min(start + block_size, p + gen)
    if end > start:
        masks = int((x[0, start:end] == mask_id).sum())
        blocks[bid] = _d3_block(start, end, masks, _progress(last) >= dec_thr, False if cached else None)


def _handle_early_stop(x, blocks, eos_id, p, mask_id) -> int | None:
    """``handle_early_stop``: the first EOS of the answer (or None); every slot after it becomes EOS; blocks wholly
    after it get no masks and complete; the block holding it recounts its masks up to the EOS."""
    hits = torch.where(x[0, p:] == eos_id)[0]
    if len(hits) == 0:
        return None
    first = p + int(hits[0])
    x[0, first + 1 :] = eos_id
    for bid in sorted(blocks):
        b = blocks[bid]
        if bid == 0:
            continue
        if b["start"] > first and b["mask_count"] != 0:
            b["mask_count"], b["is_complete"] = 0, True
        elif b["start"] <= first < b["end"]:
            before = int((x[0, b["start"] : first + 1] == mask_id).sum())
            if before != b["mask_count"]:
                b["mask_count"] = before
                b["is_complete"] = b["is_complete"] or before == 0
    return first


def _d3_early_stop(x, blocks, eos_id, p, gen, block_size, num_blocks, mask_id, nfe, dream, cached) -> int | None:
    """The early-stop part of a step: ``handle_early_stop``, then (Dream) every block's mask count recounted from
    the canvas (cached: the blocks after the EOS marked cached), then the blocks not yet opened that lie wholly after
    the EOS created finished (cached: finished at this nfe and marked cached). Returns the EOS slot or None."""
    first = _handle_early_stop(x, blocks, eos_id, p, mask_id)
    if first is None:
        return None
    if dream:
        for bid in sorted(blocks):
            b = blocks[bid]
            if bid == 0:
                continue
            actual = int((x[0, b["start"] : b["end"]] == mask_id).sum())
            if actual != b["mask_count"]:
                b["mask_count"] = actual
                b["is_complete"] = b["is_complete"] or actual == 0
            if cached and b["start"] > first:
                b["is_cached"] = True
                b["completed_at_nfe"] = nfe if b["completed_at_nfe"] is None else b["completed_at_nfe"]
    while len(blocks) <= num_blocks:
        start = p + (len(blocks) - 1) * block_size
        if start <= first:
            break
        b = _d3_block(start, min(start + block_size, p + gen), 0, True, True if cached else None)
        if cached:
            b["completed_at_nfe"] = nfe
        blocks[len(blocks)] = b
    return first


def _d3_rightmost_end(blocks: dict) -> int | None:
    """End of the rightmost block that is fully activated or has masks; None when that is the prompt."""
    right = 0
    for bid in sorted(blocks):
        if blocks[bid]["is_complete"] or blocks[bid]["mask_count"] > 0:
            right = bid
    return None if right == 0 else blocks[right]["end"]


def _d3_step_start(x, blocks, p, nfe, run: dict) -> int | None:
    """A step up to its forward: early stop (when asked), the activation update, at most one new block (none once an
    EOS is in the answer). Returns the end of the rightmost open block, or None where the reference leaves its loop
    (every mask gone after an early stop; no open block)."""
    has_eos = False
    if run["early_stop"] and run["eos_id"] is not None:
        args = (x, blocks, run["eos_id"], p, run["gen"], run["block_size"], run["num_blocks"], run["mask_id"], nfe)
        has_eos = _d3_early_stop(*args, run["dream"], run["cached"]) is not None
        if has_eos and not bool((x[0, p:] == run["mask_id"]).any()):
            return None
    _d3_activate(blocks, run["dec"])
    if not has_eos:
        args = (x, blocks, p, run["gen"], run["block_size"], run["num_blocks"], run["mask_id"], run["add"], run["dec"])
        _d3_maybe_open(*args, cached=run["cached"])
    return _d3_rightmost_end(blocks)


# ---- d3LLM: selection -------------------------------------------------------------------------------------------


def _entropy(logits: torch.Tensor) -> torch.Tensor:
    """[1, T, V] -> [1, T] entropy of the float64 softmax, ``-sum p log(p + 1e-12)`` (both variants)."""
    prob = F.softmax(logits.to(torch.float64), dim=-1)
    return -torch.sum(prob * torch.log(prob + 1e-12), dim=-1)


def _d3_select(x, logits, seen, cand, blocks, threshold, dream) -> tuple[torch.Tensor, torch.Tensor]:
    """One step's commits: (tokens [1, T], transfer [1, T] bool). ``logits`` [1, T, V] (reference-shifted for Dream;
    only slots ``seen`` [T] bool came out of this step's forward), ``cand`` [1, T] the step's masks up to the end of
    the rightmost open block (the mask set read at the step's start, as the references use it)."""
    ent = torch.where(seen[None], _entropy(logits), torch.inf)  # [1, T]; unforwarded slots: never chosen
    x0 = torch.where(seen[None], logits.argmax(-1), x)  # argmax tokens (temperature 0)
    if dream:  # ``(entropy < threshold) & mask`` over every open block
        transfer = (ent < threshold) & cand
    else:  # get_transfer_index_entropy: the lowest-entropy mask, then every other one unless entropy > threshold
        x0 = torch.where(cand, x0, x)
        n = int(cand.sum())
        order = torch.topk(torch.where(cand, ent, torch.inf)[0], k=n, largest=False).indices
        transfer = torch.zeros_like(cand)
        for k, slot in enumerate(order.tolist()):
            transfer[0, slot] = k == 0 or not bool(ent[0, slot] > threshold)
    # the first fully activated block that still has masks (by its count) and got none: its lowest-entropy mask
    first = next((b for i, b in sorted(blocks.items()) if i > 0 and b["is_complete"] and b["mask_count"] > 0), None)
    if first is not None and not bool(transfer[0, first["start"] : first["end"]].any()):
        s, e = first["start"], first["end"]
        best = s + int(torch.where(cand[0, s:e], ent[0, s:e], torch.inf).argmin())
        transfer[0, best] = True
        if not dream:  # LLaDA re-takes the argmax there (the same token at a forwarded mask)
            x0[0, best] = logits[0, best].argmax()
    return x0, transfer


def _d3_recount(blocks: dict, transfer: torch.Tensor, floor: bool) -> None:
    """Mask counts after the commits: the no-cache loops subtract from blocks that still count masks, the cached
    loops from every answer block with a floor at 0."""
    for bid in sorted(blocks):
        b = blocks[bid]
        if bid == 0 or (not floor and b["mask_count"] <= 0):
            continue
        n = int(transfer[0, b["start"] : b["end"]].sum())
        if n > 0:
            b["mask_count"] = max(0, b["mask_count"] - n) if floor else b["mask_count"] - n


# ---- d3LLM: the loops -------------------------------------------------------------------------------------------


def _d3_check(prompt: torch.Tensor, block_size: int, max_new_tokens: int) -> None:
    assert prompt.shape[0] == 1, "batch 1, as the references"
    # the references leave the slots past the last whole block masked forever (their loops run to the 10,000-step
    # guard); the LLaDA cached loop even counts blocks with a floor, the Dream one with a ceiling
    assert max_new_tokens % block_size == 0 and block_size >= 2


@torch.no_grad()
def d3llm_generate(
    model,
    prompt: torch.Tensor,  # [1, P]
    *,
    mask_id: int,
    eos_id: int | None,
    block_size: int,
    max_new_tokens: int,
    threshold: float,
    block_add_threshold: float,
    decoded_token_threshold: float,
    early_stop: bool,
    shift: bool,
    trace: list | None = None,
) -> tuple[torch.Tensor, int]:
    """d3LLM ``generate_multi_block`` (LLaDA) / ``_sample_multi_block`` (Dream, ``shift``) at temperature 0, without
    cache: (canvas [1, P + G], forwards). Every forward is the whole canvas, bidirectional (future blocks MASK).
    ``trace``: per forward, the number of answer blocks that still count masks (blocks in flight).

    The reference's ``nfe`` is incremented at the top of each iteration, before the early-stop exit and the "no
    open block" exit that run no forward, so it can exceed the forwards returned here by one."""
    _d3_check(prompt, block_size, max_new_tokens)
    p, gen = prompt.shape[1], max_new_tokens
    num_blocks = gen // block_size
    x = F.pad(prompt, (0, gen), value=mask_id)  # [1, P + G]
    blocks = _d3_init(p, gen, block_size, decoded_token_threshold, cached=False)
    run = dict(gen=gen, block_size=block_size, num_blocks=num_blocks, mask_id=mask_id, eos_id=eos_id)
    run |= dict(early_stop=early_stop, add=block_add_threshold, dec=decoded_token_threshold, dream=shift, cached=False)
    seen = torch.ones(x.shape[1], dtype=torch.bool)  # every slot is forwarded
    nfe, forwards = 0, 0
    while True:
        mask = x == mask_id  # [1, T], read once per step (the selection keeps using it after an early stop)
        if not bool(mask[0, p:].any()) and len(blocks) > num_blocks:
            break
        nfe += 1
        end = _d3_step_start(x, blocks, p, nfe, run)
        if end is None:
            break
        logits = model(x)  # [1, T, V]
        forwards += 1
        if shift:
            logits = shift_logits(logits)
        if trace is not None:
            trace.append(sum(1 for i, b in blocks.items() if i > 0 and b["mask_count"] > 0))
        cand = mask.clone()
        cand[:, end:] = False
        x0, transfer = _d3_select(x, logits, seen, cand, blocks, threshold, dream=shift)
        x[transfer] = x0[transfer]
        _d3_recount(blocks, transfer, floor=False)
        assert nfe <= 10000, "the reference stops at its 10,000-step guard"
    return x, forwards


# ---- d3LLM with the delayed cache -------------------------------------------------------------------------------


class StoreForward:
    """The reference's past-K/V forwards on a dlm_decode model, through ``denoise`` and a ``KVStore``.

    The reference's cache is a list of K/V entries (post-RoPE, so each keeps its slot's position); here it is the
    store's canvas slots ``[0, held)`` plus copies of earlier versions of some slots in a second area of the store
    (slot ``T + s`` for slot s): the keys the reference holds twice (see :func:`d3llm_generate_cached`). A forward
    computes ``[c0, T)`` and attends to the cache's entries plus its own K/V (``key_index``: the canvas slots and the
    held copies). ``__call__(x, branch, c0, arg)`` runs one branch (``arg``: the refresh length, or the number of
    slots an update appends) and returns the logits of ``[c0, T)`` as the reference reads them, [1, T - c0, V]."""

    def __init__(self, model, length: int) -> None:
        n_layers, n_kv, hd = model.kv_shape()
        weight = next(model.parameters())
        self.model, self.t = model, length
        self.store = KVStore(n_layers, 1, n_kv, 2 * length, hd, dtype=weight.dtype, device=weight.device)
        self.held = 0
        self.copies = torch.zeros(length, dtype=torch.bool)  # [T] slots with an earlier version held twice
        self.duplicated = 0  # slots ever held twice (a statistic for the tests)

    def _hold_twice(self, c0: int) -> None:
        """The forward recomputes ``[c0, held)`` while the reference keeps their cached entries: move them aside."""
        if self.held > c0:
            assert not bool(self.copies[c0 : self.held].any())
            self.store.k[:, :, :, self.t + c0 : self.t + self.held] = self.store.k[:, :, :, c0 : self.held]
            self.store.v[:, :, :, self.t + c0 : self.t + self.held] = self.store.v[:, :, :, c0 : self.held]
            self.copies[c0 : self.held] = True
            self.duplicated += self.held - c0
        assert self.held >= c0, "the reference's cache never stops short of the forward's first slot"

    def __call__(self, x: torch.Tensor, branch: str, c0: int, arg: int | None) -> torch.Tensor:
        t = x.shape[1]
        if branch in ("full", "refresh"):  # no past: the forward sees only itself
            self.copies[:] = False
        else:
            self._hold_twice(c0)
        keys = torch.cat([torch.arange(t), t + torch.where(self.copies)[0]])[None]  # [1, W] slots of the keys
        kv = KVAccess(self.store, write=branch in ("refresh", "update"))
        pos = torch.arange(t, device=x.device)[None]  # positions from the cache length (c0 == manual_cache_length)
        run = dict(compute=slice(c0, t), store=kv, key_index=keys.to(x.device))
        if not self.model.logit_shift or c0 == 0:  # LLaDA; Dream from slot 0 (denoise's shift is the reference's)
            out = self.model.denoise(x, pos, region=(c0, t), **run)
        else:  # Dream from c0 > 0: slot c0 keeps its own raw logit; denoise's (c0 + 1, T) holds raw c0 .. T - 2
            raw = self.model.denoise(x, pos, region=(c0 + 1, t), **run)
            out = torch.cat([raw[:, :1], raw], dim=1)
        if branch == "refresh":
            self.held = arg
        elif branch == "update":
            self.held = c0 + arg
        elif branch == "use":
            self.held = c0  # [c0, held) live on as the copies
        return out


def _d3_cache_scan(blocks: dict, cache_length: int, nfe: int, delay: int, dream: bool) -> list[int]:
    """The blocks due for caching: from the first block past the cache, finished ones get their finishing nfe; one
    finished ``delay`` steps ago is due. A block with masks ends the scan; in LLaDA a block still within its delay
    ends it too, Dream's scan goes on past it."""
    due = []
    for bid in sorted(blocks):
        b = blocks[bid]
        if b["end"] <= cache_length:
            continue
        if b["mask_count"] != 0:
            break
        if b["completed_at_nfe"] is None:
            b["completed_at_nfe"] = nfe
        waited = nfe - b["completed_at_nfe"]
        if waited >= delay and not b["is_cached"]:
            due.append(bid)
            b["is_cached"] = True
        elif waited < delay and not dream:
            break
    return due


def _d3_cache_plan(blocks, cache_length, has_cache, nfe, delay, refresh_interval, end, dream):
    """The forward of a cached step, as the reference's branches decide it: (branch, c0, arg) or None when the
    reference stops (nothing to forward before ``end``). ``cache_length``: ``manual_cache_length``; ``has_cache``:
    whether the reference holds a cache object. Branches: "update" (forward from the cache end; ``arg`` = how many
    slots, the due blocks', are appended to the cache), "use" (forward from the first block to denoise, the cache read
    only), "refresh" (a full forward whose K/V replace the cache: ``arg`` = up to the start of the last stabilizing
    block, else up to the cache end), "full" (no cache yet: a full forward)."""
    due = _d3_cache_scan(blocks, cache_length, nfe, delay, dream)
    update = blocks[max(due)]["end"] - cache_length if due else 0
    stabilizing = [
        i for i in sorted(blocks) if blocks[i]["mask_count"] == 0 and blocks[i]["completed_at_nfe"] is not None
    ]
    stabilizing = [i for i in stabilizing if not blocks[i]["is_cached"]]
    starts = [blocks[i]["start"] for i in stabilizing] + [b["start"] for b in blocks.values() if b["mask_count"] > 0]
    start = min([cache_length, *starts])
    if start >= end:
        return None
    if update > 0:
        return "update", cache_length, update
    if has_cache and not stabilizing and nfe % refresh_interval != 0:
        return "use", start, None
    if has_cache:
        return "refresh", 0, blocks[stabilizing[-1]]["start"] if stabilizing else cache_length
    return "full", 0, None


@torch.no_grad()
def d3llm_generate_cached(
    model,
    prompt: torch.Tensor,  # [1, P]
    *,
    mask_id: int,
    eos_id: int | None,
    block_size: int,
    max_new_tokens: int,
    threshold: float,
    block_add_threshold: float,
    decoded_token_threshold: float,
    cache_delay_iter: int,
    refresh_interval: int,
    early_stop: bool,
    shift: bool,
    forward=None,
    trace: list | None = None,
) -> tuple[torch.Tensor, int]:
    """d3LLM ``generate_multi_block_kv_cache`` (LLaDA) / ``_sample_multi_block_kv_cache`` (Dream, ``shift``) at
    temperature 0: (canvas [1, P + G], forwards). ``model``: a dlm_decode model; ``forward``: how the past-K/V
    forwards run (default :class:`StoreForward` over ``model``; the tests pass an independent one). ``trace``: per
    forward, its branch ("update", "use", "refresh", "full").

    Mapping. A forward computes ``[c0, T)`` and attends to the reference's cache plus its own K/V; RoPE positions
    start at ``manual_cache_length``, which is c0 in "update" and "use" (checked) and 0 in "full" and "refresh"
    (these pass no past: they see only themselves). "update" appends the K/V of its first ``arg`` slots to the cache,
    "refresh" replaces the cache by the K/V of ``[0, arg)``, "use" and "full" store nothing.

    Keys held twice. The reference's cache length and ``manual_cache_length`` can part: a refresh keeps K/V up to the
    start of the *last* stabilizing block while ``manual_cache_length`` stays at the first one's start. In LLaDA the
    scan stops at a stabilizing block, so one block at most stabilizes and it starts at the cache end: they agree. In
    Dream the scan goes on, so two blocks stabilize together when the second finishes before the first is cached
    (common at delay 1 or 2); after such a refresh the next "update" forwards from ``manual_cache_length`` and appends
    those slots' K/V once more: from then until the next refresh, the keys of the first block are in the cache twice
    (an earlier and a fresh version, both at their own RoPE positions; a "use" step sees both too). Well defined,
    and re-stated so (:class:`StoreForward` keeps the earlier versions aside; ``StoreForward.duplicated`` counts them).

    The nfe counter: as in :func:`d3llm_generate` (the early-stop exit and the "nothing to forward" exit come after
    the increment); it also drives ``completed_at_nfe`` and the refresh period, so it is kept as the reference keeps
    it."""
    _d3_check(prompt, block_size, max_new_tokens)
    p, gen = prompt.shape[1], max_new_tokens
    num_blocks = gen // block_size
    x = F.pad(prompt, (0, gen), value=mask_id)  # [1, P + G]
    forward = StoreForward(model, x.shape[1]) if forward is None else forward
    assert not shift or getattr(model, "logit_shift", 1) == 1
    blocks = _d3_init(p, gen, block_size, decoded_token_threshold, cached=True)
    run = dict(gen=gen, block_size=block_size, num_blocks=num_blocks, mask_id=mask_id, eos_id=eos_id)
    run |= dict(early_stop=early_stop, add=block_add_threshold, dec=decoded_token_threshold, dream=shift, cached=True)
    manual, has_cache, nfe, forwards = 0, False, 0, 0
    while True:
        mask = x == mask_id  # [1, T]
        if not bool(mask[0, p:].any()) and len(blocks) > num_blocks:
            break
        nfe += 1
        end = _d3_step_start(x, blocks, p, nfe, run)
        args = (blocks, manual, has_cache, nfe, cache_delay_iter, refresh_interval, end, shift)
        plan = None if end is None else _d3_cache_plan(*args)
        if plan is None:
            break
        branch, c0, arg = plan
        assert branch in ("full", "refresh") or c0 == manual, "RoPE offset and first computed slot agree"
        out = forward(x, branch, c0, arg)  # [1, T - c0, V]
        forwards += 1
        logits = out.new_full((1, x.shape[1], out.shape[-1]), float("-inf"))  # the reference's logits_full
        logits[:, c0:] = out
        manual += arg if branch == "update" else 0
        has_cache |= branch in ("update", "refresh")
        if trace is not None:
            trace.append(branch)
        seen = torch.arange(x.shape[1]) >= c0
        cand = mask.clone()
        cand[:, end:] = False
        x0, transfer = _d3_select(x, logits, seen, cand, blocks, threshold, dream=shift)
        x[transfer] = x0[transfer]
        _d3_recount(blocks, transfer, floor=True)
        assert nfe <= 10000, "the reference stops at its 10,000-step guard"
    return x, forwards
