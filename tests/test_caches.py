"""Cache policies: every cache with every sampler, exactness against full recomputation, K/V after a refresh, padded
batches, token identity of ``prefix`` / ``dual`` with Fast-dLLM (``reference_cached_generate``), savings, errors, and
``benchmarks/prompt_blind.py``'s mask (why the approximate caches lose: the prompt attends to the answer)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from checkpoints import llada_config, llada_state_dict
from reference_cached_generate import dual_cache_generate, llada_cached_forward, prefix_cache_generate

import dlm_decode
import dlm_decode.decode.loop as loop
import dlm_decode.models.common as common
from dlm_decode.cache import CACHES, KVStore, get_cache
from dlm_decode.samplers import SAMPLERS, get_sampler

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from prompt_blind import blind_attention  # noqa: E402

PROMPTS = [[5, 9, 17, 3, 40, 22], [7, 2, 33], [11, 30, 30, 8, 19]]
EQUAL = torch.tensor([[5, 9, 17, 3, 40, 22], [7, 7, 2, 33, 12, 4], [11, 30, 30, 8, 19, 60]])
# every cache the bidirectional samplers run with. ``sub_block`` runs only with the ``fast_dllm_v2`` sampler on
# Fast-dLLM v2 (``samplers``), so these shared tests on LLaDA / Dream cannot run it: tests/test_fast_dllm_v2.py
# checks it against the reference's ``use_block_cache``; its refusal here is
# test_registered_caches_bound_to_a_sampler_are_refused_without_it
CACHED = sorted(c for c in CACHES if c != "none" and not CACHES[c].samplers)
# the setting of each cache that refreshes at every step (so it must reproduce decoding without a cache)
EVERY_STEP = {
    "prefix": {"refresh_interval": 1},
    "dual": {"refresh_interval": 1},
    "dkv_decode": {"refresh_interval": 1},
    "dkv_greedy": {"refresh_interval": 1},
    "dkv_prefill": {"refresh_interval": 1},
    "dkv_pd": {"refresh_interval": 1, "prompt_refresh_interval": 1},
    "window": {"refresh_cycle": 1, "prune_refresh": False},
    "delayed": {"cache_delay_iter": 10**6},  # no block ever joins the prefix: every forward is full
    "elastic": {"gamma": 2.0},  # the drift test fails at the first layer of every step: a refresh from the embeddings
}
FEW_SAMPLERS = ["low_confidence", "threshold", "factor", "maskgit_plus"]


pytestmark = pytest.mark.usefixtures("one_thread")


def _run(model, sampler, cache, prompts=PROMPTS, cache_options=None, **kw):
    kw.setdefault("gen_length", 16)
    kw.setdefault("block_length", 8 if get_sampler(sampler).traits.blockwise else None)
    return dlm_decode.generate(model, prompts, sampler=sampler, cache=cache, cache_options=cache_options, **kw)


def _computed(plan, state) -> torch.Tensor:
    """[B, T] bool: the slots a plan recomputes."""
    computed = torch.zeros(state.batch, state.total_length, dtype=torch.bool, device=state.device)
    if isinstance(plan.compute, slice):
        computed[:, plan.compute] = True
    else:
        computed.scatter_(1, plan.compute, True)
    return computed


class _Calls(list):
    store_ptrs: tuple | None = None  # (k ptr, v ptr, shape) of the call's K/V store, fixed after the first step


@pytest.fixture
def checked_forward(monkeypatch):
    """Wrap the loop's forward: every plan must compute the hidden state behind each committable masked slot, and
    a ``subset`` (samplers that read their candidates only) must hold every one of those slots and their rows."""
    calls = _Calls()
    original = loop._forward

    def forward(model, state, plan, region, store, subset=None):
        r0, r1 = region
        need = state.block_masked()[:, r0:r1]  # [B, R]
        if plan.candidates is not None:
            need = need & plan.candidates[:, r0:r1]
        src = (torch.arange(r0, r1) - state.logit_shift).clamp(min=0)  # [R]
        computed = _computed(plan, state)
        assert (computed[:, src] | ~need).all(), f"step {state.step}: a masked slot's hidden state is not computed"
        if subset is not None and subset.slots is not None:
            wanted = torch.zeros_like(need).scatter_(1, subset.slots, True)
            assert (wanted | ~need).all(), f"step {state.step}: a committable slot's logits are not computed"
        if subset is not None and subset.rows is not None:
            busy = torch.zeros_like(need[:, 0]).scatter_(0, subset.rows, True)
            assert (busy | ~need.any(1)).all(), f"step {state.step}: a row with candidates sat out the forward"
        calls.append(plan)
        if store is not None:  # the one store of the call: same buffers every step, nothing reallocated
            ptrs = (store.k.data_ptr(), store.v.data_ptr(), store.k.shape)
            assert calls.store_ptrs in (None, ptrs), f"step {state.step}: the K/V store was reallocated"
            calls.store_ptrs = ptrs
        return original(model, state, plan, region, store, subset)

    def forward_drafts(model, state, plan, region, store, drafts):  # draft-and-verify steps: the same plan checks
        return checked(original_drafts, model, state, plan, region, store, drafts)

    def checked(run, model, state, plan, region, store, *extra):
        r0, r1 = region
        need = state.block_masked()[:, r0:r1]
        src = (torch.arange(r0, r1) - state.logit_shift).clamp(min=0)
        assert (_computed(plan, state)[:, src] | ~need).all(), f"step {state.step}: a masked slot is not computed"
        calls.append(plan)
        return run(model, state, plan, region, store, *extra)

    original_drafts = loop._forward_drafts
    monkeypatch.setattr(loop, "_forward", forward)
    monkeypatch.setattr(loop, "_forward_drafts", forward_drafts)
    return calls


@pytest.mark.parametrize("cache", sorted(c for c in CACHES if CACHES[c].samplers))
def test_registered_caches_bound_to_a_sampler_are_refused_without_it(tiny_model, cache):
    """A cache that runs with named samplers only (``sub_block``: ``fast_dllm_v2``) is refused, naming itself, on
    this bidirectional model with any other sampler, and with its own sampler too (not block-causal)."""
    for sampler in ("low_confidence", *CACHES[cache].samplers):
        with pytest.raises(ValueError, match=f"cache '{cache}'"):
            _run(tiny_model, sampler, cache)
    assert not any(CACHES[cache].runs_with(s) for s in SAMPLERS if s not in CACHES[cache].samplers)


@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
@pytest.mark.parametrize("cache", CACHED)
def test_every_cache_runs_every_sampler(tiny_model, cache, sampler, checked_forward):
    if sampler == "lossless" and cache not in ("prefix", "dual"):  # refused: tests/test_lossless.py
        with pytest.raises(ValueError, match="cannot be lossless"):
            _run(tiny_model, sampler, cache)
        return
    out = _run(tiny_model, sampler, cache)
    p = out.sequences.shape[1] - 16
    for i, pr in enumerate(PROMPTS):
        assert out.sequences[i, p - len(pr) : p].tolist() == pr
    assert not (out.sequences[:, p:] == tiny_model.mask_token_id).any()
    n_layers, n_kv, hd = tiny_model.kv_shape()
    assert out.cache_bytes == 2 * n_layers * len(PROMPTS) * n_kv * out.sequences.shape[1] * hd * 4
    assert out.refreshes >= 1 and len(checked_forward) == out.nfe
    assert checked_forward.store_ptrs is not None  # the store was used, and never reallocated


@pytest.mark.parametrize("sampler", FEW_SAMPLERS)
@pytest.mark.parametrize("cache", CACHED)
def test_refresh_every_step_reproduces_no_cache(tiny_model, cache, sampler):
    assert set(EVERY_STEP) == set(CACHED), "give every cache its refresh-every-step setting in EVERY_STEP"
    ref = _run(tiny_model, sampler, "none")
    out = _run(tiny_model, sampler, cache, cache_options=EVERY_STEP[cache])
    assert torch.equal(out.sequences, ref.sequences)
    if cache == "elastic":  # one full refresh, then every step's drift test fails at the first layer of every row
        st = out.cache_stats
        assert out.refreshes == st["full_refreshes"] == 1 and st["reused_all_layers"] == 0
        assert st["refresh_from_layer"][0] == sum(r.nfe for r in out.rows) - len(out.rows)
        assert sum(st["refresh_from_layer"][1:]) == 0
        return
    assert out.nfe == ref.nfe and out.refreshes == out.nfe


@pytest.mark.parametrize("cache", CACHED)
def test_store_after_refresh_equals_fresh_forward(tiny_model, cache, monkeypatch):
    original = loop._forward
    checked = []

    def forward(model, state, plan, region, store, subset=None):
        canvas = state.canvas.clone()
        logits = original(model, state, plan, region, store, subset)
        if plan.refresh:
            fresh = KVStore(*_store_args(model, state), dtype=store.k.dtype, device=store.k.device)
            model.denoise(
                canvas, state.positions, region=region, store=fresh, key_mask=state.key_mask(), compute=slice(None)
            )
            valid = state.valid[None, :, None, :, None]
            assert torch.equal(store.k * valid, fresh.k * valid) and torch.equal(store.v * valid, fresh.v * valid)
            checked.append(state.step)
        return logits

    monkeypatch.setattr(loop, "_forward", forward)
    out = _run(tiny_model, "low_confidence", cache, gen_length=24, block_length=8, steps=24)
    assert checked and len(checked) == out.refreshes


def _store_args(model, state):
    n_layers, n_kv, hd = model.kv_shape()
    return n_layers, state.batch, n_kv, state.total_length, hd


@pytest.mark.parametrize("sampler", FEW_SAMPLERS)
@pytest.mark.parametrize("cache", CACHED)
def test_padded_rows_decode_as_alone(tiny_model, cache, sampler):
    batch = _run(tiny_model, sampler, cache)
    for i, pr in enumerate(PROMPTS):
        alone = _run(tiny_model, sampler, cache, prompts=[pr])
        assert alone.rows[0].generated_ids == batch.rows[i].generated_ids, (cache, sampler, i)


@pytest.mark.parametrize("cache", CACHED)
def test_caches_compute_fewer_token_forwards(tiny_model, cache):
    ref = _run(tiny_model, "low_confidence", "none", gen_length=32, block_length=16, steps=32)
    out = _run(tiny_model, "low_confidence", cache, gen_length=32, block_length=16, steps=32)
    assert out.token_forwards < ref.token_forwards
    assert out.nfe == ref.nfe


# ---- token identity with Fast-dLLM's cached generate functions (LLaDA, fp32, temperature 0) ----------------------


@pytest.fixture(scope="module")
def llada_reference_forward():
    cfg = llada_config()
    sd = llada_state_dict(cfg)
    return lambda ids, past=None, replace=None: llada_cached_forward(sd, cfg, ids, past=past, replace=replace)


def test_reference_forward_matches_model(llada, llada_reference_forward):
    ids = EQUAL[:2]
    logits, past = llada_reference_forward(ids)
    assert torch.allclose(logits, llada(ids).logits, atol=1e-5)
    tail, _ = llada_reference_forward(ids[:, 3:], past=[(k[:, :, :3], v[:, :, :3]) for k, v in past])
    assert torch.allclose(tail, logits[:, 3:], atol=1e-5)  # an exact prefix cache changes nothing


RULES = [("low_confidence", {}), ("threshold", {"threshold": 0.5}), ("factor", {"factor": 1.0})]


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("gen,block,steps", [(16, 8, 16), (24, 8, 12), (16, 4, 8)])
@pytest.mark.parametrize("rule,options", RULES, ids=[r for r, _ in RULES])
@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_fastdllm_token_identity(llada, llada_reference_forward, cache, rule, options, batch, gen, block, steps):
    prompt = EQUAL[:batch]
    fn = prefix_cache_generate if cache == "prefix" else dual_cache_generate
    kw = dict(options)
    if rule == "low_confidence":
        kw["steps"] = steps
    ref, ref_nfe = fn(llada_reference_forward, prompt, gen, block, llada.mask_token_id, **kw)
    out = dlm_decode.generate(
        llada,
        prompt,
        sampler=rule,
        sampler_options=options,
        cache=cache,
        gen_length=gen,
        block_length=block,
        steps=steps,
    )
    assert torch.equal(out.sequences, ref)
    assert out.nfe == ref_nfe


# ---- pruned steps and options -----------------------------------------------------------------------------------


def test_window_commits_only_active_masks(llada):
    active = 2
    out = dlm_decode.generate(
        llada,
        EQUAL[:2],
        sampler="low_confidence",
        cache="window",
        cache_options={"refresh_cycle": 8, "active_tokens": active},
        gen_length=24,
        block_length=24,
        steps=24,
        trace=True,
    )
    trace = out.trace  # [B, L] step that committed each slot
    for s in range(out.nfe - 1):
        if s % 8 == 0:
            continue  # a phase's full step may commit any mask
        masks_then = trace >= s  # [B, L] still MASK when step s began
        left = masks_then.long().cumsum(1)  # rank among those masks
        assert (left[trace == s] <= active).all(), s


@pytest.mark.parametrize("prune", [False, True])
@pytest.mark.parametrize("sampler", ["low_confidence", "threshold"])
@pytest.mark.parametrize("prompts", [PROMPTS, PROMPTS[:1]], ids=["mixed-batch", "one-row"])
def test_window_gathered_masked_and_sliced_keys_decode_alike(llada, sampler, prompts, prune):
    """The window's keys as a gather (small windows), a mask over the canvas (large ones) or a view of one shared
    run of slots (a batch of one): the same attention, the same tokens."""
    opts = {"refresh_cycle": 8, "window_tokens": 4, "active_tokens": 2, "prune_refresh": prune}
    runs = []
    for keys in ("gather", "mask", "auto"):  # always gather, always mask, a view of a shared run where there is one
        kw = dict(prompts=prompts, cache_options=opts | {"keys": keys}, gen_length=32, block_length=16)
        runs.append(_run(llada, sampler, "window", **kw))
    for other in runs[1:]:
        assert torch.equal(runs[0].sequences, other.sequences) and runs[0].nfe == other.nfe


def test_window_reads_one_shared_run_of_keys_as_a_view(llada, monkeypatch):
    """Batch of one in blocks: every pruned step's keys are one run of slots, passed as a slice (no gather, no mask)."""
    original, kinds = loop._forward, []

    def forward(model, state, plan, region, store, subset=None):
        if not plan.refresh:
            kinds.append(type(plan.key_index).__name__ if plan.key_index is not None else "mask")
        return original(model, state, plan, region, store, subset)

    monkeypatch.setattr(loop, "_forward", forward)
    _run(llada, "low_confidence", "window", prompts=PROMPTS[:1], gen_length=32, block_length=16, steps=32)
    assert kinds and set(kinds) == {"slice"}


def test_window_pruned_phase_start_keeps_the_far_field_out(tiny_model, monkeypatch):
    """prune_refresh (Dream reference): a phase's first step computes only decoded slots and the first
    ``window_tokens`` masks, commits only those masks, and later steps never compute a far-field mask."""
    opts = {"refresh_cycle": 4, "window_tokens": 6, "active_tokens": 3, "prune_refresh": True}
    original, seen = loop._forward, []

    def forward(model, state, plan, region, store, subset=None):
        masked = state.is_masked()  # [B, T], before this step's commits
        computed = _computed(plan, state)
        far = masked & (masked.long().cumsum(1) > opts["window_tokens"])
        last = state.block_step + 1 >= state.block_limit
        if not last:
            assert not (computed & far & ~state.finished[:, None]).any(), f"step {state.step} computed the far field"
        if plan.refresh and not last:
            assert plan.candidates is not None and not (plan.candidates & far).any()
        seen.append(plan.refresh)
        return original(model, state, plan, region, store, subset)

    monkeypatch.setattr(loop, "_forward", forward)
    kw = dict(gen_length=32, block_length=32, steps=32, cache_options=opts)
    pruned = _run(tiny_model, "low_confidence", "window", **kw)
    monkeypatch.setattr(loop, "_forward", original)
    full = _run(tiny_model, "low_confidence", "window", **{**kw, "cache_options": {**opts, "prune_refresh": False}})
    assert sum(seen) == 8 and pruned.refreshes == 8  # one pruned first step per phase of 4 steps
    assert pruned.token_forwards < full.token_forwards
    assert not (pruned.generated == tiny_model.mask_token_id).any()


def test_window_pruned_phase_start_stores_the_window_forward(llada, monkeypatch):
    """After a pruned first step the stored K/V of the window equal a forward of the truncated canvas
    ``x[:, :window_end]`` alone (what the Dream reference runs); batch of one, so the window is a prefix."""
    original, checked = loop._forward, []

    def forward(model, state, plan, region, store, subset=None):
        canvas = state.canvas.clone()
        masked = canvas == state.mask_id
        logits = original(model, state, plan, region, store, subset)
        if plan.refresh:
            end = int((~masked | (masked.long().cumsum(1) <= 5)).long().cumprod(1).sum())  # window_tokens 5
            n_layers, n_kv, hd = model.kv_shape()
            fresh = KVStore(n_layers, 1, n_kv, end, hd, dtype=store.k.dtype, device=store.k.device)
            model.denoise(canvas[:, :end], state.positions[:, :end], region=(0, end), store=fresh, compute=slice(None))
            # same keys, other reduction order (a masked canvas vs a shorter one): equal to float rounding
            torch.testing.assert_close(store.k[..., :end, :], fresh.k, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(store.v[..., :end, :], fresh.v, rtol=1e-5, atol=1e-5)
            checked.append(end)
        return logits

    monkeypatch.setattr(loop, "_forward", forward)
    out = _run(
        llada,
        "low_confidence",
        "window",
        prompts=PROMPTS[:1],
        gen_length=24,
        block_length=24,
        steps=24,
        cache_options={"refresh_cycle": 6, "window_tokens": 5, "active_tokens": 2, "prune_refresh": True},
    )
    assert len(checked) == out.refreshes == 4 and checked[0] < out.sequences.shape[1]


@pytest.mark.parametrize("sampler", ["low_confidence", "threshold"])
def test_window_pruning_with_a_window_over_every_mask_is_the_full_refresh(tiny_model, sampler):
    kw = dict(gen_length=24, block_length=24, steps=24)
    opts = {"refresh_cycle": 6, "window_tokens": 24, "active_tokens": 4, "prune_refresh": True}
    pruned = _run(tiny_model, sampler, "window", cache_options=opts, **kw)
    full = _run(tiny_model, sampler, "window", cache_options={**opts, "prune_refresh": False}, **kw)
    assert torch.equal(pruned.sequences, full.sequences) and pruned.nfe == full.nfe


def test_greedy_recomputes_less_than_decode(llada):
    """Same refresh schedule: greedy's pruned steps skip the masks outside the block and far from new tokens."""
    kw = dict(gen_length=32, block_length=8, steps=32, cache_options={"refresh_interval": 2})
    a = _run(llada, "low_confidence", "dkv_decode", **kw)
    b = _run(llada, "low_confidence", "dkv_greedy", **kw)
    assert a.refreshes == b.refreshes and b.token_forwards < a.token_forwards


def test_bad_cache_names_and_options_fail_loudly():
    with pytest.raises(ValueError, match="valid caches: .*dkv_decode.*dual.*none.*prefix.*window"):
        get_cache("kv")
    for name in ("prefix", "dual", "dkv_decode", "dkv_greedy", "dkv_prefill", "dkv_pd"):
        with pytest.raises(ValueError, match="refresh_interval must be an integer >= 1"):
            get_cache(name, {"refresh_interval": 0})
    with pytest.raises(ValueError, match="prompt_refresh_interval"):
        get_cache("dkv_pd", {"prompt_refresh_interval": -2})
    with pytest.raises(ValueError, match="prune_refresh expects true/false"):
        get_cache("window", {"prune_refresh": 1})
    for key in ("refresh_cycle", "window_tokens", "active_tokens"):
        with pytest.raises(ValueError, match=f"{key} must be an integer >= 1"):
            get_cache("window", {key: 0})
    with pytest.raises(ValueError, match=r"window must be an integer in \[0, 3\]"):
        get_cache("dkv_greedy", {"window": 7})
    with pytest.raises(ValueError, match="has no option"):
        get_cache("dual", {"interval": 2})
    assert get_cache("dkv_decode", {"refresh_interval": "4"}).refresh_interval == 4


@pytest.mark.parametrize("cache", CACHED)
def test_classifier_free_guidance_doubles_the_store_rows(llada, cache):
    out = _run(llada, "low_confidence", cache, cfg_scale=1.0)
    ref = _run(llada, "low_confidence", cache, cfg_scale=1.0, cache_options=EVERY_STEP[cache])
    assert torch.equal(ref.sequences, _run(llada, "low_confidence", "none", cfg_scale=1.0).sequences)
    assert not (out.sequences == llada.mask_token_id).any()
    n_layers, n_kv, hd = llada.kv_shape()
    assert out.cache_bytes == 2 * n_layers * 2 * len(PROMPTS) * n_kv * out.sequences.shape[1] * hd * 4


def test_window_view_of_keys_under_classifier_free_guidance(llada):
    """CFG doubles the rows (conditional + unconditional); the shared run of keys is read the same for both halves."""
    kw = dict(prompts=PROMPTS[:1], gen_length=32, block_length=16, steps=32, cfg_scale=1.0)
    kw["cache_options"] = {"refresh_cycle": 8, "window_tokens": 4, "active_tokens": 2}
    viewed = _run(llada, "low_confidence", "window", **kw)
    kw["cache_options"] |= {"keys": "mask"}
    masked = _run(llada, "low_confidence", "window", **kw)
    assert torch.equal(viewed.sequences, masked.sequences) and viewed.nfe == masked.nfe


@torch.no_grad()
def test_blind_prompt_ignores_the_answer(llada, monkeypatch):
    p, t = 6, 10
    a = torch.tensor([[5, 9, 17, 3, 40, 22, 7, 8, 11, 12]])
    b = a.clone()
    b[0, p:] = torch.tensor([30, 31, 32, 33])  # other answer tokens
    c = a.clone()
    c[0, 0] = 41  # another prompt token
    free = [llada(x).logits for x in (a, b, c)]
    assert (free[0][:, :p] - free[1][:, :p]).abs().max() > 1e-4  # bidirectional: the prompt sees the answer
    monkeypatch.setattr(common, "masked_attention", blind_attention(common.masked_attention, lambda: p))
    blind = [llada(x).logits for x in (a, b, c)]
    assert torch.equal(blind[0][:, :p], blind[1][:, :p])
    assert (blind[0][:, p:] - blind[2][:, p:]).abs().max() > 1e-4  # the answer still sees the prompt
    assert (blind[0][:, :p] - free[0][:, :p]).abs().max() > 1e-4 and blind[0].shape == (1, t, free[0].shape[-1])
