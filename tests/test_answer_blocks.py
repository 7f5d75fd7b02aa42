"""D2F's attention pattern (``models.visibility.AnswerBlocks``) on the bidirectional models: ``denoise(...,
answer_blocks=...)`` against the official forward under D2F's dense 4D mask, built here as the reference's
``create_full_block_attention_mask`` builds it, on every path ``denoise`` has (full canvas, region and compute
sub-ranges, slot-id compute, a K/V store written by one forward and read by a later one, the rows a store spreads, a
key run, gathered keys, a left-padded batch), for LLaDA, Dream (shifted logits) and LLaDA-MoE, on tiny random float32
checkpoints. The 4D forward itself is checked against the straightforward reference forwards of ``checkpoints`` and
``llada_moe_reference``."""

from __future__ import annotations

import json

import pytest
import torch
from checkpoints import dream_state_dict, llada_state_dict, reference_dream_logits, reference_llada_logits
from llada2_reference import write_llada2
from llada_moe_reference import reference_logits as reference_moe_logits
from llada_moe_reference import write_llada_moe
from safetensors.torch import load_file

import dlm_decode
from dlm_decode.cache.store import KVAccess, KVStore
from dlm_decode.models import AnswerBlocks, common

pytestmark = pytest.mark.usefixtures("one_thread")

P, B = 5, 4  # prompt slots, answer block length
T = P + 2 * B + 3  # 16: blocks [0, 5) prompt, [5, 9), [9, 13), [13, 16) (the last one cut at the canvas end)
RULE = AnswerBlocks(P, B)
TOL = {"atol": 1e-5, "rtol": 1e-5}


def d2f_mask(prompt_length: int, length: int, block: int) -> torch.Tensor:  # [1, 1, T, T] additive float
    """D2F's dense mask as the reference builds it: -inf everywhere, the prompt sees itself, then per answer block
    (the last one cut at the end) the prompt, each earlier block and itself."""
    mask = torch.full((1, 1, length, length), float("-inf"))
    mask[:, :, :prompt_length, :prompt_length] = 0
    n_blocks = (length - prompt_length + block - 1) // block
    for j in range(n_blocks):
        start, end = prompt_length + j * block, min(prompt_length + (j + 1) * block, length)
        mask[:, :, start:end, :prompt_length] = 0
        for i in range(j):
            mask[:, :, start:end, prompt_length + i * block : min(prompt_length + (i + 1) * block, length)] = 0
        mask[:, :, start:end, start:end] = 0
    return mask


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return write_llada_moe(tmp_path_factory.mktemp("d2f_moe") / "m", seed=0)


@pytest.fixture(scope="module")
def moe(moe_dir):
    return dlm_decode.load_model(moe_dir)[0]


@pytest.fixture(params=["llada", "dream", "llada_moe"])
def model(request, llada, dream, moe):
    return {"llada": llada, "dream": dream, "llada_moe": moe}[request.param]


def _canvas(seed: int, length: int = T, rows: int = 2) -> torch.Tensor:
    ids = torch.randint(3, 60, (rows, length), generator=torch.Generator().manual_seed(seed))
    ids[:, P + 1 :: 3] = 61  # some MASK-like tokens in the answer (any ids do: the weights are random)
    return ids


def _positions(ids: torch.Tensor) -> torch.Tensor:
    return torch.arange(ids.shape[1]).expand_as(ids)


def _dense(model, ids: torch.Tensor, prompt_length: int = P) -> torch.Tensor:  # [B, T, V] official, unshifted
    return model(ids, attention_mask=d2f_mask(prompt_length, ids.shape[1], B)).logits


def _aligned(model, raw: torch.Tensor, r0: int, r1: int) -> torch.Tensor:  # logits predicting slots [r0, r1)
    s = model.logit_shift
    return raw[:, r0 - s : r1 - s]


def _store(model, rows: int = 2, length: int = T) -> KVStore:
    n_layers, n_kv, hd = model.kv_shape()
    return KVStore(n_layers, rows, n_kv, length, hd, dtype=torch.float32, device="cpu")


def test_rule_is_the_reference_mask():
    slots = torch.arange(T)
    assert torch.equal(RULE.visible(slots, slots), d2f_mask(P, T, B)[0, 0] == 0)
    assert RULE.block_ids(torch.tensor([0, 4, 5, 8, 9, 15])).tolist() == [0, 0, 1, 1, 2, 3]
    for bad in ({"prompt_end": -1, "block_length": 4}, {"prompt_end": 5, "block_length": 0}):
        with pytest.raises(ValueError, match="answer_blocks"):
            AnswerBlocks(**bad)
    with pytest.raises(ValueError, match="block_length"):
        AnswerBlocks(5, True)


def test_4d_forward_matches_the_straightforward_references(llada, dream, moe, llada_dir, dream_dir, moe_dir):
    """The official forward under D2F's mask (float and bool alike) against reference forwards written apart from
    dlm_decode.models, and unlike the bidirectional forward."""
    ids = _canvas(0)
    mask = d2f_mask(P, T, B)
    vis = (mask == 0).expand(2, -1, -1, -1)
    cfg = json.loads((llada_dir / "config.json").read_text())
    want = reference_llada_logits(llada_state_dict(cfg), cfg, ids, keymask=vis)
    torch.testing.assert_close(llada(ids, attention_mask=mask).logits, want, **TOL)
    torch.testing.assert_close(llada(ids, attention_mask=vis).logits, want, **TOL)
    assert (llada(ids).logits - want)[:, : P + B].abs().max() > 1e-3  # the prompt sees no answer any more
    cfg = json.loads((dream_dir / "config.json").read_text())
    want = reference_dream_logits(dream_state_dict(cfg), cfg, ids, keymask=vis)
    torch.testing.assert_close(dream(ids, attention_mask=mask).logits, want, atol=5e-5, rtol=1e-5)
    cfg, sd = json.loads((moe_dir / "config.json").read_text()), load_file(str(moe_dir / "model.safetensors"))
    want = reference_moe_logits(cfg, sd, ids, vis)  # the summation orders differ (as tests/test_llada_moe.py allows)
    torch.testing.assert_close(moe(ids, attention_mask=mask).logits, want, atol=5e-5, rtol=1e-5)


def test_full_canvas_and_regions(model):
    ids, pos = _canvas(1), _positions(_canvas(1))
    raw = _dense(model, ids)
    s = model.logit_shift
    got = model.denoise(ids, pos, region=(s, T), answer_blocks=RULE)
    torch.testing.assert_close(got, _aligned(model, raw, s, T), **TOL)
    plain = model.denoise(ids, pos, region=(s, T))
    assert (plain - got).abs().max() > 1e-3  # the rule changes the logits
    for r0, r1 in ((P, P + B), (P + B + 1, P + 2 * B + 1), (T - 2, T)):  # within, across and at the end of blocks
        got = model.denoise(ids, pos, region=(r0, r1), answer_blocks=RULE)
        torch.testing.assert_close(got, _aligned(model, raw, r0, r1), **TOL)
    # no store, only a prefix of whole blocks computed: under the rule nothing in it looks further, so it is exact
    got = model.denoise(ids, pos, compute=slice(0, P + 2 * B), region=(P, P + 2 * B), answer_blocks=RULE)
    torch.testing.assert_close(got, _aligned(model, raw, P, P + 2 * B), **TOL)


def test_compute_as_slot_ids_and_read(model):
    ids, pos = _canvas(2), _positions(_canvas(2))
    raw = _dense(model, ids)
    every = torch.arange(T).expand(2, -1)
    got = model.denoise(ids, pos, compute=every, region=(P, T), answer_blocks=RULE)
    torch.testing.assert_close(got, _aligned(model, raw, P, T), **TOL)
    prefix = torch.arange(P + B).expand(2, -1)  # the prompt and the first answer block, as ids
    got = model.denoise(ids, pos, compute=prefix, region=(P, P + B), answer_blocks=RULE)
    torch.testing.assert_close(got, _aligned(model, raw, P, P + B), **TOL)
    read = torch.tensor([[0, 5, 10], [2, 3, 9]])  # a subset of the region's slots per row (the last layer's rows)
    got = model.denoise(ids, pos, compute=every, region=(P, T), read=read, answer_blocks=RULE)
    want = _aligned(model, raw, P, T)
    torch.testing.assert_close(
        got.gather(1, read[..., None].expand(-1, -1, got.shape[-1])),
        want.gather(1, read[..., None].expand(-1, -1, want.shape[-1])),
        **TOL,
    )


def test_store_keeps_finished_blocks_exact(model):
    """A first forward writes the store while later blocks are still masked; the later blocks then change and a
    second forward computes only them, reading the stored earlier blocks: under the rule their K/V never depended
    on the later blocks, so the result is the full forward's on the new canvas."""
    s = model.logit_shift
    first = _canvas(3)
    first[:, P + B :] = 61
    later = first.clone()
    later[:, P + B :] = _canvas(4)[:, P + B :]
    pos = _positions(first)
    raw = _dense(model, later)
    start = P + B - s  # Dream: the last slot of the finished block predicts the first new slot
    for compute in (slice(start, T), torch.arange(start, T).expand(2, -1)):
        store = _store(model)
        model.denoise(first, pos, compute=slice(0, T), region=(s, T), store=store, answer_blocks=RULE)
        got = model.denoise(later, pos, compute=compute, region=(P + B, T), store=store, answer_blocks=RULE)
        torch.testing.assert_close(got, _aligned(model, raw, P + B, T), **TOL)
    # rows at different blocks: row 1 changes from the next block on and computes only from there (slot ids padded
    # by repeats of the last slot, as the caches pad them); its region slots before that are not compared
    later[1, P + B : P + 2 * B] = first[1, P + B : P + 2 * B]
    raw = _aligned(model, _dense(model, later), P + B, T)
    width = T - start
    ids = torch.stack([torch.arange(start, T), torch.arange(P + 2 * B - s, T + B).clamp(max=T - 1)[:width]])
    store = _store(model)
    model.denoise(first, pos, compute=slice(0, T), region=(s, T), store=store, answer_blocks=RULE)
    got = model.denoise(later, pos, compute=ids, region=(P + B, T), store=store, answer_blocks=RULE)
    torch.testing.assert_close(got[0], raw[0], **TOL)
    torch.testing.assert_close(got[1, B:], raw[1, B:], **TOL)
    # without the rule the stored prefix is stale: the same steps give other logits
    store = _store(model)
    model.denoise(first, pos, compute=slice(0, T), region=(s, T), store=store)
    stale = model.denoise(later, pos, compute=slice(start, T), region=(P + B, T), store=store)
    assert (stale - model.denoise(later, pos, region=(P + B, T))).abs().max() > 1e-3


def test_store_rows_and_unwritten_forward(model):
    """A forward of one row of the store's batch (``KVAccess.rows``: the store spreads it), written or not."""
    s = model.logit_shift
    ids, pos = _canvas(5), _positions(_canvas(5))
    raw = _dense(model, ids)
    store = _store(model)
    model.denoise(ids, pos, compute=slice(0, T), region=(s, T), store=store, answer_blocks=RULE)
    before = store.k.clone()
    one = torch.tensor([1])
    for write in (True, False):
        kv = KVAccess(store, rows=one, write=write)
        got = model.denoise(ids[1:], pos[1:], compute=slice(P - s, T), region=(P, T), store=kv, answer_blocks=RULE)
        torch.testing.assert_close(got, _aligned(model, raw, P, T)[1:], **TOL)
    torch.testing.assert_close(store.k, before, **TOL)  # rewritten with the same K/V, the other row untouched


def test_key_run_and_gathered_keys(model):
    """Keys narrowed to one run of slots, or gathered per row, including keys of later blocks the rule must hide."""
    s = model.logit_shift
    ids, pos = _canvas(6), _positions(_canvas(6))
    raw = _dense(model, ids)
    want = _aligned(model, raw, P, P + B)
    store = _store(model)
    model.denoise(ids, pos, compute=slice(0, T), region=(s, T), store=store, answer_blocks=RULE)
    block = slice(P - s, P + B)
    got = model.denoise(
        ids, pos, compute=block, region=(P, P + B), store=store, key_index=slice(0, T - 1), answer_blocks=RULE
    )
    torch.testing.assert_close(got, want, **TOL)
    first = torch.arange(P + B)
    gathered = torch.stack(
        [torch.cat([first, torch.tensor([P + B, P + B + 1])]), torch.cat([first, torch.tensor([T - 2, T - 1])])]
    )
    visible = torch.ones_like(gathered, dtype=torch.bool)
    for kv in (store, None):  # keys: the store's slots, or the computed slots (all of them here)
        compute = block if kv is not None else slice(0, T)
        got = model.denoise(
            ids,
            pos,
            compute=compute,
            region=(P, P + B),
            store=kv,
            key_mask=visible,
            key_index=gathered,
            answer_blocks=RULE,
        )
        torch.testing.assert_close(got, want, **TOL)
    leak = model.denoise(ids, pos, compute=block, region=(P, P + B), store=store, key_mask=visible, key_index=gathered)
    assert (leak - want).abs().max() > 1e-3  # without the rule the later keys are seen


def test_left_padded_rows_equal_each_prompt_alone(model):
    """Two prompts of 3 and 5 tokens left-padded to P = 5: each row's logits are those of its prompt alone (its
    own P, D2F's dense mask), with no store and with a store read by a later forward."""
    s = model.logit_shift
    answer = 2 * B + 1
    prompts = [torch.tensor([7, 12, 30]), torch.tensor([9, 4, 22, 41, 5])]
    answers = _canvas(7, answer)
    canvas = torch.full((2, P + answer), 1)
    valid = torch.zeros_like(canvas, dtype=torch.bool)
    alone = []
    for i, p in enumerate(prompts):
        canvas[i, P - len(p) :] = torch.cat([p, answers[i]])
        valid[i, P - len(p) :] = True
        ids = torch.cat([p, answers[i]])[None]
        raw = _dense(model, ids, len(p))
        got = model.denoise(ids, _positions(ids), region=(len(p), ids.shape[1]), answer_blocks=AnswerBlocks(len(p), B))
        torch.testing.assert_close(got, _aligned(model, raw, len(p), ids.shape[1]), **TOL)
        alone.append(got)
    alone = torch.cat(alone)
    pos = (valid.long().cumsum(1) - 1).clamp(min=0)
    got = model.denoise(canvas, pos, region=(P, P + answer), key_mask=valid, answer_blocks=RULE)
    torch.testing.assert_close(got, alone, **TOL)
    store = _store(model, length=P + answer)
    model.denoise(
        canvas,
        pos,
        compute=slice(0, P + answer),
        region=(s, P + answer),
        store=store,
        key_mask=valid,
        answer_blocks=RULE,
    )
    got = model.denoise(
        canvas,
        pos,
        compute=slice(P + B - s, P + answer),
        region=(P + B, P + answer),
        store=store,
        key_mask=valid,
        answer_blocks=RULE,
    )
    torch.testing.assert_close(got, alone[:, B:], **TOL)


def test_rule_never_takes_the_kernel_dispatcher(llada, monkeypatch):
    """With a rule the attention is PyTorch SDPA under the per-query mask (on CUDA too), never ``masked_attention``
    (the Triton kernel's entry, which takes one key mask per row); without one it still is."""
    ids, pos = _canvas(9), _positions(_canvas(9))
    want = _dense(llada, ids)[:, P:T]
    store = _store(llada)

    def refuse(*args, **kwargs):
        raise AssertionError("masked_attention called")

    monkeypatch.setattr(common, "masked_attention", refuse)
    got = llada.denoise(ids, pos, compute=slice(0, T), region=(P, T), store=store, answer_blocks=RULE)
    torch.testing.assert_close(got, want, **TOL)
    with pytest.raises(AssertionError, match="masked_attention called"):
        llada.denoise(ids, pos, region=(P, T))


def test_refusals(llada, moe, tmp_path):
    ids = _canvas(8)
    pos = _positions(ids)
    with pytest.raises(ValueError, match="depth-aware"):
        llada.denoise(ids, pos, region=(P, T), layers=object(), answer_blocks=RULE)
    block_causal = dlm_decode.load_model(write_llada2(tmp_path / "llada2"))[0]
    with pytest.raises(ValueError, match="block-causal already"):
        block_causal.denoise(ids, pos, region=(P, T), answer_blocks=RULE)
    with pytest.raises(ValueError, match=r"4D mask must be \[2 or 1, 1, 16, 16\]"):
        moe(ids, attention_mask=torch.zeros(1, 1, T, T - 1))
    with pytest.raises(ValueError, match="additive float"):
        llada(ids, attention_mask=torch.ones(1, 1, T, T))  # a 1 / 0 mask is not D2F's 0 / -inf one
