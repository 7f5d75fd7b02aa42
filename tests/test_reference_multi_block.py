"""The multi-block re-statements (``reference_multi_block.py``) checked where they must agree with something known:
block by block (both thresholds 1.0) they are dlm_decode's ``entropy_threshold`` (d3LLM) and a plain threshold decode
under the block-causal mask (D2F); the delayed cache without any cached block is the no-cache loop; the cache mapping
on ``denoise`` + ``KVStore`` equals a literal past-K/V forward (``llada_cached_forward``); below 1.0 several blocks
are in flight. Tiny random checkpoints, float32, temperature 0, batch 1.
"""

from __future__ import annotations

import pytest
import torch
from checkpoints import (
    EOS,
    MASK,
    _attn,
    _rms,
    _rope,
    dream_config,
    dream_state_dict,
    llada_config,
    llada_state_dict,
    reference_dream_logits,
    reference_llada_logits,
)
from reference_multi_block import StoreForward, d2f_generate, d2f_mask, d3llm_generate, d3llm_generate_cached

import dlm_decode

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [[5, 9, 17, 3, 40, 22], [9, 3, 36, 3, 17, 11, 40, 5, 21]]  # 6 and 9 slots: the answer grid starts mid-block
# entropy thresholds that commit several masks per step on the tiny checkpoints (vocabulary 64: at most ln 64 = 4.2)
ETAS = {"llada": [2.0, 2.5, 3.0], "dream": [1.5, 2.0, 2.5]}


def _raw(model):
    return lambda ids: model(ids).logits


def _sd_cfg(name):
    cfg = llada_config() if name == "llada" else dream_config()
    sd = llada_state_dict(cfg) if name == "llada" else dream_state_dict(cfg)
    return sd, cfg


def _masked_forward(name):
    """``model(x, mask4d)`` for D2F: the pure-torch reference forward of the conftest checkpoint under a 4D mask."""
    sd, cfg = _sd_cfg(name)
    fwd = reference_llada_logits if name == "llada" else reference_dream_logits
    return lambda ids, mask4d: fwd(sd, cfg, ids, mask4d=mask4d)


def _d3(model, prompt, name, eta, add=1.0, dec=1.0, **kw):
    return dict(
        mask_id=MASK, eos_id=EOS, block_size=8, max_new_tokens=32, threshold=eta, block_add_threshold=add,
        decoded_token_threshold=dec, early_stop=False, shift=name == "dream",
    ) | kw  # fmt: skip


# ---- d3LLM ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["llada", "dream"])
@pytest.mark.parametrize("which", [0, 1, 2])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_d3llm_block_by_block_is_entropy_threshold(request, name, which, prompt):
    """Both thresholds 1.0: a block opens when the last one is done and is fully activated at once, so the single
    selection is the current block's; LLaDA's (lowest entropy + ``<= eta``) is ``entropy_threshold``, Dream's
    (``< eta``, the forced lowest one when none passes) too except on an entropy exactly at eta."""
    model = request.getfixturevalue(name)
    eta, ids = ETAS[name][which], torch.tensor([prompt])
    ref, forwards = d3llm_generate(_raw(model), ids, **_d3(model, ids, name, eta))
    out = dlm_decode.generate(
        model, ids, sampler="entropy_threshold", sampler_options={"eta": eta}, gen_length=32, block_length=8,
        cache="none",
    )  # fmt: skip
    assert torch.equal(out.sequences, ref)
    assert out.nfe == forwards
    assert forwards < 32 and not bool((ref == MASK).any())  # several masks per step, and a finished canvas


@pytest.mark.parametrize("name", ["llada", "dream"])
@pytest.mark.parametrize("add,dec", [(1.0, 1.0), (0.25, 0.5), (0.1, 0.95)])
def test_d3llm_cache_that_never_caches_is_the_no_cache_loop(request, name, add, dec):
    """A delay no block ever reaches: the prompt (block 0, finished at nfe 0) is stabilizing forever, so the reference
    has no cache and every step takes its "full" branch: the tokens and forwards of ``d3llm_generate``."""
    model = request.getfixturevalue(name)
    ids = torch.tensor([PROMPTS[1]])
    eta = ETAS[name][1]
    ref, forwards = d3llm_generate(_raw(model), ids, **_d3(model, ids, name, eta, add, dec))
    trace = []
    kw = _d3(model, ids, name, eta, add, dec, cache_delay_iter=10**6, refresh_interval=10**6)
    out, cached_forwards = d3llm_generate_cached(model, ids, **kw, trace=trace)
    assert torch.equal(out, ref) and cached_forwards == forwards
    assert set(trace) == {"full"}


def _literal_forward(name, sd, cfg, ids, pos, past):
    """The LLaDA / Dream forward of ``checkpoints`` with a literal past-K/V list, as the references' modeling files
    keep it: (raw logits [1, Q, V], per layer (K after RoPE, V) = the past's followed by the new ones)."""
    llada = name == "llada"
    nh, nkv = (cfg["n_heads"], cfg["n_kv_heads"]) if llada else (cfg["num_attention_heads"], cfg["num_key_value_heads"])
    hd = (cfg["d_model"] if llada else cfg["hidden_size"]) // nh
    h = sd["model.transformer.wte.weight" if llada else "model.embed_tokens.weight"][ids]
    present = []
    for i in range(cfg["n_layers" if llada else "num_hidden_layers"]):
        p = f"model.transformer.blocks.{i}." if llada else f"model.layers.{i}."
        a = _rms(h, sd[p + ("attn_norm" if llada else "input_layernorm") + ".weight"], cfg["rms_norm_eps"])

        def proj(n, heads, a=a, p=p):
            if llada:
                return (a @ sd[p + f"{n}_proj.weight"].T).view(1, -1, heads, hd).transpose(1, 2)
            w, bias = sd[p + f"self_attn.{n}_proj.weight"], sd[p + f"self_attn.{n}_proj.bias"]
            return (a @ w.T + bias).view(1, -1, heads, hd).transpose(1, 2)

        q, k, v = proj("q", nh), proj("k", nkv), proj("v", nkv)
        q, k = _rope(q, pos, cfg["rope_theta"], llada), _rope(k, pos, cfg["rope_theta"], llada)
        if past is not None:
            k, v = torch.cat([past[i][0], k], dim=2), torch.cat([past[i][1], v], dim=2)
        present.append((k, v))
        o = _attn(q, k, v, None).transpose(1, 2).reshape(1, ids.shape[1], -1)
        h = h + o @ sd[p + ("attn_out" if llada else "self_attn.o_proj") + ".weight"].T
        m = _rms(h, sd[p + ("ff_norm" if llada else "post_attention_layernorm") + ".weight"], cfg["rms_norm_eps"])
        gate, up, down = (
            ("ff_proj", "up_proj", "ff_out") if llada else ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
        )
        g = m @ sd[p + gate + ".weight"].T
        h = h + (g * torch.sigmoid(g) * (m @ sd[p + up + ".weight"].T)) @ sd[p + down + ".weight"].T
    h = _rms(h, sd["model.transformer.ln_f.weight" if llada else "model.norm.weight"], cfg["rms_norm_eps"])
    return h @ sd["model.transformer.ff_out.weight" if llada else "lm_head.weight"].T, present


class PastKV:
    """The references' ``DynamicCache`` taken literally, on ``_literal_forward``: a list of per-layer (K, V); a
    forward from c0 passes its positions from c0 (``cache_position``); "update" appends the first ``arg`` new
    entries, "refresh" keeps the first ``arg`` of a forward without past; Dream's logits shifted as the references
    read them (``cat(raw[:, :1], raw[:, :-1])`` over the forward)."""

    def __init__(self, name):
        self.name, (self.sd, self.cfg), self.past = name, _sd_cfg(name), None

    def __call__(self, x, branch, c0, arg):
        past = self.past if branch in ("update", "use") else None
        pos = torch.arange(c0, x.shape[1])[None]
        raw, present = _literal_forward(self.name, self.sd, self.cfg, x[:, c0:], pos, past)
        kept = 0 if past is None else past[0][0].shape[2]
        if branch == "refresh":
            self.past = [(k[:, :, :arg], v[:, :, :arg]) for k, v in present]
        elif branch == "update":
            self.past = [(k[:, :, : kept + arg], v[:, :, : kept + arg]) for k, v in present]
        return torch.cat([raw[:, :1], raw[:, :-1]], dim=1) if self.name == "dream" else raw


@pytest.mark.parametrize("name", ["llada", "dream"])
@pytest.mark.parametrize("delay,refresh", [(1, 10**4), (2, 3), (0, 2), (2, 4)])
@pytest.mark.parametrize("add,dec,prompt", [(0.25, 0.5, 0), (1.0, 1.0, 0), (0.1, 0.95, 1)])
def test_d3llm_cache_on_the_store_is_the_past_kv_cache(request, name, delay, refresh, add, dec, prompt):
    """The delayed cache on ``denoise`` + ``KVStore`` (which slots are computed, which stored K/V are seen, which are
    written, which are held twice) gives the tokens, forwards and branches of the literal past-K/V list; every branch
    runs. Dream's duplicated keys are among the cases (checked in ``test_d3llm_dream_cache_holds_keys_twice``)."""
    model = request.getfixturevalue(name)
    ids = torch.tensor([PROMPTS[prompt]])
    kw = _d3(model, ids, name, ETAS[name][1], add, dec, cache_delay_iter=delay, refresh_interval=refresh)
    store_trace, past_trace, store = [], [], StoreForward(model, ids.shape[1] + 32)
    out, forwards = d3llm_generate_cached(model, ids, **kw, forward=store, trace=store_trace)
    lit, lit_forwards = d3llm_generate_cached(model, ids, **kw, forward=PastKV(name), trace=past_trace)
    assert torch.equal(out, lit) and forwards == lit_forwards and store_trace == past_trace
    assert "update" in store_trace and {"use", "refresh"} & set(store_trace) and not bool((out == MASK).any())
    if name == "dream" and (delay, add) == (1, 0.1):
        assert store.duplicated > 0  # the keys held twice, as the literal list holds them


@pytest.mark.parametrize("name", ["llada", "dream"])
def test_d3llm_dream_cache_holds_keys_twice(request, name):
    """Dream's cache scan goes on past a block still in its delay, so two blocks stabilize together, a refresh keeps
    both and the next update appends the first one again: keys held twice (the answer of the literal cache, checked
    above). LLaDA's scan stops there: never."""
    model = request.getfixturevalue(name)
    ids = torch.tensor([PROMPTS[1]])
    kw = _d3(model, ids, name, ETAS[name][1], 0.1, 0.95, cache_delay_iter=1, refresh_interval=10**4)
    store = StoreForward(model, ids.shape[1] + 32)
    d3llm_generate_cached(model, ids, **kw, forward=store)
    assert (store.duplicated > 0) == (name == "dream")


def test_d3llm_cache_is_approximate(llada):
    """The published LLaDA setting (delay 1, no periodic refresh) on the tiny checkpoint: cached keys are stale, so
    the answer differs from the no-cache loop's (a check that the cache is really read)."""
    ids = torch.tensor([PROMPTS[0]])
    kw = _d3(llada, ids, "llada", 2.0, 0.1, 0.95)
    ref, _ = d3llm_generate(_raw(llada), ids, **kw)
    out, _ = d3llm_generate_cached(llada, ids, **kw, cache_delay_iter=1, refresh_interval=10**4)
    assert not torch.equal(out, ref)


@pytest.mark.parametrize("name", ["llada", "dream"])
def test_d3llm_several_blocks_in_flight(request, name):
    """Below 1.0 blocks open before the last one is done: more than one block holds masks in some forward, and the
    whole answer takes fewer forwards than block by block."""
    model = request.getfixturevalue(name)
    ids = torch.tensor([PROMPTS[0]])
    eta = ETAS[name][0]
    trace = []
    out, forwards = d3llm_generate(_raw(model), ids, **_d3(model, ids, name, eta, 0.25, 0.5), trace=trace)
    _, sequential = d3llm_generate(_raw(model), ids, **_d3(model, ids, name, eta))
    assert max(trace) >= 3 and len(trace) == forwards
    assert not bool((out == MASK).any())
    if name == "llada":  # Dream takes no global lowest-entropy mask: semi-activated blocks may wait longer
        assert forwards < sequential


# ---- D2F --------------------------------------------------------------------------------------------------------


def _block_causal(prompt_length: int, total: int, block_size: int) -> torch.Tensor:
    """The D2F mask written a second time, as a visibility table filled block by block (bool [1, 1, T, T])."""
    seen = torch.zeros(total, total, dtype=torch.bool)
    seen[:prompt_length, :prompt_length] = True
    for start in range(prompt_length, total, block_size):
        seen[start : start + block_size, : start + block_size] = True  # the prompt, earlier blocks and itself
    return seen[None, None]


def _block_by_block(model, prompt, *, block_size, gen, skip, shift, eos_id=EOS):
    """A threshold decode, one block at a time under the block-causal mask: each step commits the block's masks with
    probability > ``skip``, or its most confident one; no block opens after one that committed an EOS."""
    x, p, forwards = prompt.clone(), prompt.shape[1], 0
    for _ in range(gen // block_size):
        x = torch.cat([x, torch.full((1, block_size), MASK)], dim=1)
        while bool((x[0, -block_size:] == MASK).any()):
            raw = model(x, _block_causal(p, x.shape[1], block_size))
            forwards += 1
            logits = raw[0, -block_size - 1 : -1] if shift else raw[0, -block_size:]  # [B, V]
            conf, tok = torch.softmax(logits, -1).max(-1)
            masked = x[0, -block_size:] == MASK
            conf = torch.where(masked, conf, -1.0)
            commit = masked & (conf > skip)
            if not bool(commit.any()):
                commit[conf.argmax()] = True
            x[0, -block_size:] = torch.where(commit, tok, x[0, -block_size:])
        if bool((x[0, p:] == eos_id).any()):
            break
    return x[0, p:], forwards


def _d2f(name, add=1.0, dec=1.0, skip=0.4, **kw):
    return dict(
        mask_id=MASK, eos_id=EOS, block_size=8, max_new_tokens=32, block_add_threshold=add,
        decoded_token_threshold=dec, skip_threshold=skip, shift=name == "dream",
    ) | kw  # fmt: skip


def test_d2f_mask_is_block_causal_from_the_prompt_end():
    """Prompt of 3, blocks of 2 from slot 3: hand-written visibility."""
    expect = torch.tensor(
        [
            [1, 1, 1, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0, 0],
            [1, 1, 1, 1, 1, 0, 0],
            [1, 1, 1, 1, 1, 0, 0],
            [1, 1, 1, 1, 1, 1, 1],
            [1, 1, 1, 1, 1, 1, 1],
        ],
        dtype=torch.bool,
    )
    mask = d2f_mask(3, 7, 2)
    assert mask.shape == (1, 1, 7, 7) and mask.dtype == torch.float32
    assert torch.equal(mask[0, 0] == 0, expect) and bool((mask[0, 0][~expect] == float("-inf")).all())
    assert torch.equal(_block_causal(3, 7, 2)[0, 0], expect)


@pytest.mark.parametrize("name", ["llada", "dream"])
def test_reference_forwards_take_a_4d_mask(name):
    """The 4D mask of the pure-torch forwards: all-visible changes nothing; under the D2F mask, a block's logits
    ignore every later slot; bool and additive masks agree."""
    sd, cfg = _sd_cfg(name)
    fwd = reference_llada_logits if name == "llada" else reference_dream_logits
    ids = torch.tensor([PROMPTS[0] + [MASK] * 16])
    plain = fwd(sd, cfg, ids)
    assert torch.equal(fwd(sd, cfg, ids, mask4d=torch.ones(1, 1, 22, 22, dtype=torch.bool)), plain)
    bias, seen = d2f_mask(6, 22, 8), _block_causal(6, 22, 8)
    masked = fwd(sd, cfg, ids, mask4d=bias)
    assert torch.allclose(masked, fwd(sd, cfg, ids, mask4d=seen), atol=1e-6)
    changed = ids.clone()
    changed[0, 14:] = 5  # the second answer block
    assert torch.equal(fwd(sd, cfg, changed, mask4d=bias)[:, :14], masked[:, :14])
    assert not torch.allclose(masked[:, :14], plain[:, :14])  # the mask matters


@pytest.mark.parametrize("name", ["llada", "dream"])
@pytest.mark.parametrize("skip", [0.3, 0.5, 0.9])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_d2f_block_by_block(name, skip, prompt):
    """Both thresholds 1.0: D2F is the plain threshold decode block by block under its mask."""
    model, ids = _masked_forward(name), torch.tensor([prompt])
    ref, forwards = d2f_generate(model, ids, **_d2f(name, skip=skip))
    out, expect = _block_by_block(model, ids, block_size=8, gen=32, skip=skip, shift=name == "dream")
    assert torch.equal(ref, out) and forwards == expect
    assert not bool((ref == MASK).any()) and len(ref) % 8 == 0
    assert len(ref) == 32 or EOS in ref[-8:].tolist()  # the tiny models do commit their EOS now and then
    if skip < 0.9:
        assert forwards < len(ref)  # several commits per step


@pytest.mark.parametrize("name", ["llada", "dream"])
def test_d2f_eos_stops_opening_blocks(name):
    """An EOS committed in a block: no block opens after it (the answer is shorter than the gen length), block by
    block as in the plain decode. The EOS is a token the tiny model commits early (its own EOS never shows)."""
    model, ids = _masked_forward(name), torch.tensor([PROMPTS[1]])
    full, _ = d2f_generate(model, ids, **_d2f(name, eos_id=-1))  # no EOS: every block
    assert len(full) == 32
    eos = int(full[9])  # committed in the second block
    ref, forwards = d2f_generate(model, ids, **_d2f(name, eos_id=eos))
    out, expect = _block_by_block(model, ids, block_size=8, gen=32, skip=0.4, shift=name == "dream", eos_id=eos)
    assert torch.equal(ref, out) and forwards == expect
    first_block_with_eos = min(int(torch.where(full == eos)[0][0]) // 8, 3)
    assert len(ref) == 8 * (first_block_with_eos + 1) < 32


@pytest.mark.parametrize("name", ["llada", "dream"])
@pytest.mark.parametrize("add,dec,skip", [(0.1, 0.95, 0.9), (0.25, 0.5, 0.5), (0.5, 0.75, 0.3)])
def test_d2f_several_blocks_in_flight(name, add, dec, skip):
    """Below 1.0 blocks open before the last one is done: several are active in some forward; the answer is whole."""
    model, ids = _masked_forward(name), torch.tensor([PROMPTS[1]])
    trace = []
    ref, forwards = d2f_generate(model, ids, **_d2f(name, add, dec, skip, eos_id=-1), trace=trace)
    assert max(trace) >= 2 and len(trace) == forwards
    assert len(ref) == 32 and not bool((ref == MASK).any())


# ---- hand-built logits: the commit rules ------------------------------------------------------------------------


def _peaked(entropy_rank: list[float], vocab: int = 8) -> torch.Tensor:
    """[1, S, V] logits, one row per slot, sharper (lower entropy, higher top probability) for larger values."""
    rows = torch.zeros(len(entropy_rank), vocab)
    for i, sharp in enumerate(entropy_rank):
        rows[i, (i + 3) % vocab] = sharp
    return rows[None]


def test_d3llm_selection_llada_takes_the_global_lowest_entropy_dream_does_not():
    """Prompt [0, 2), block 1 [2, 6) fully activated, block 2 [6, 10) semi-activated; nothing under the threshold.
    LLaDA commits the lowest-entropy mask anywhere (slot 7, in the semi-activated block) and, since block 1 got
    none, block 1's lowest (slot 4); Dream only the forced one of block 1."""
    from reference_multi_block import _d3_select, _entropy

    logits = _peaked([0, 0, 1, 2, 3, 1, 0, 6, 1, 0])  # slot 7 sharpest, then slot 4 within block 1
    x = torch.tensor([[20, 21] + [MASK] * 8])
    blocks = {
        0: {"start": 0, "end": 2, "mask_count": 0, "total_masks": 2, "is_complete": True},
        1: {"start": 2, "end": 6, "mask_count": 4, "total_masks": 4, "is_complete": True},
        2: {"start": 6, "end": 10, "mask_count": 4, "total_masks": 4, "is_complete": False},
    }
    cand, seen = x == MASK, torch.ones(10, dtype=torch.bool)
    low = float(_entropy(logits)[0, 7]) - 1e-3  # under every entropy
    for dream, expect in ((False, [4, 7]), (True, [4])):
        x0, transfer = _d3_select(x, logits, seen, cand, blocks, low, dream)
        assert torch.where(transfer[0])[0].tolist() == expect
        assert x0[0, 4] == (4 + 3) % 8  # the argmax token
    # at the threshold: LLaDA takes entropy <= threshold, Dream entropy < threshold
    at = float(_entropy(logits)[0, 3])
    assert torch.where(_d3_select(x, logits, seen, cand, blocks, at, False)[1][0])[0].tolist() == [3, 4, 7]
    assert torch.where(_d3_select(x, logits, seen, cand, blocks, at, True)[1][0])[0].tolist() == [4, 7]


def test_d2f_commit_rule_full_and_semi_activated():
    """Fully activated: every mask over skip_threshold, else the most confident one; semi-activated: only those over
    the threshold, possibly none (strict comparison)."""
    from reference_multi_block import _d2f_commit

    logits = _peaked([0, 0, 1.0, 3.0, 2.0, 0.5])  # slots 2..5, slot 3 the most confident
    conf = torch.softmax(logits[0], -1).max(-1).values
    for complete, skip, expect in (
        (True, 0.99, [3]),  # none over: the top one
        (False, 0.99, []),  # semi-activated: none
        (True, float(conf[4]), [3]),  # strictly over slot 4's probability: slot 3 only
        (False, float(conf[4]) - 1e-6, [3, 4]),
    ):
        x = torch.tensor([[20, 21, MASK, MASK, MASK, MASK]])
        block = {"start": 2, "end": 6, "mask_count": 4, "total_masks": 4, "is_complete": complete}
        eos = _d2f_commit(x, block, logits, MASK, eos_id=(3 + 3) % 8, skip_threshold=skip)
        assert torch.where(x[0] != MASK)[0].tolist()[2:] == expect
        assert block["mask_count"] == 4 - len(expect) and eos == (3 in expect)


@pytest.mark.parametrize("name", ["llada", "dream"])
def test_d3llm_early_stop_without_eos_changes_nothing(request, name):
    """early_stop with an EOS the model never commits: the tokens and forwards of the run without it."""
    model = request.getfixturevalue(name)
    ids = torch.tensor([PROMPTS[0]])
    kw = _d3(model, ids, name, ETAS[name][1], 0.25, 0.5, eos_id=MASK + 100)
    off, f_off = d3llm_generate(_raw(model), ids, **kw)
    on, f_on = d3llm_generate(_raw(model), ids, **(kw | {"early_stop": True}))
    assert torch.equal(on, off) and f_on == f_off


@pytest.mark.parametrize("name", ["llada", "dream"])
def test_d3llm_early_stop_with_the_cache_on_the_store_is_the_past_kv_cache(request, name):
    """Early stop with an EOS the tiny model commits (blocks after it created finished and, in the cached loops,
    marked cached): the store mapping still gives the literal past-K/V list's answer, in fewer forwards than
    without early stop."""
    model = request.getfixturevalue(name)
    ids = torch.tensor([PROMPTS[0]])
    kw = _d3(model, ids, name, ETAS[name][1], 0.25, 0.5, cache_delay_iter=1, refresh_interval=4, eos_id=MASK + 100)
    full, full_forwards = d3llm_generate_cached(model, ids, **kw)
    kw |= {"eos_id": int(full[0, ids.shape[1] + 10]), "early_stop": True}  # committed in the second block
    out, forwards = d3llm_generate_cached(model, ids, **kw)
    lit, lit_forwards = d3llm_generate_cached(model, ids, **kw, forward=PastKV(name))
    assert torch.equal(out, lit) and forwards == lit_forwards < full_forwards
    assert not bool((out == MASK).any())
