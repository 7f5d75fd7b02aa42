"""The decode path's shortcuts change no token and no NFE (fp32, tiny random LLaDA and Dream checkpoints).

The shortcuts: the last layer, final norm and LM head run only for the rows whose logits are returned
(``hidden_states(rows=...)``); a sampler that reads only its candidates gets logits at those slots alone
(``denoise(read=...)``); rows without candidates sit out the forward (``forward.subset``, ``KVAccess.rows``).
The plain path below switches all three off (every row of every step through every layer, logits over the whole
region), as the loop ran before them. Equal-length batches are also compared with the reference re-statements.
No wall-clock assertions: speed is ``benchmarks/bench_speed.py --versus-reference``.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import load_script
from reference_cached_generate import dual_cache_generate, llada_cached_forward, prefix_cache_generate
from reference_generate import fastdllm_generate, llada_generate

import dlm_decode
import dlm_decode.decode.loop as loop
from dlm_decode.cache import KVStore
from dlm_decode.cache.store import KVAccess
from dlm_decode.core.state import BlockCursor, DecodeState
from dlm_decode.models.common import take_rows

pytestmark = pytest.mark.usefixtures("one_thread")

MIXED = [[5, 9, 17, 3, 40, 22], [7, 2, 33], [11, 30, 30, 8, 19], [4, 4]]
EQUAL = torch.tensor([[5, 9, 17, 3, 40, 22], [7, 7, 2, 33, 12, 4], [11, 30, 30, 8, 19, 60]])
IDS = torch.tensor([[5, 9, 17, 3, 40, 22, 63, 63, 63, 63, 63], [7, 2, 33, 12, 63, 63, 18, 63, 63, 63, 63]])
SAMPLERS = ["threshold", "factor", "low_confidence"]
THRESHOLD = 0.5  # on the tiny checkpoints 0.9 commits one slot per step in every row: no row would sit out
CACHES = ["none", "prefix", "dual", "window"]


@pytest.fixture
def plain(monkeypatch):
    """``plain(model)``: switch the shortcuts off for ``model`` until the test ends."""

    def switch(model):
        full = model.hidden_states

        def every_row(ids, pos, *, rows=None, **kw):  # all rows through the last layer, then the wanted ones
            return take_rows(full(ids, pos, **kw), rows)

        monkeypatch.setattr(model, "hidden_states", every_row)
        monkeypatch.setattr(loop, "subset", lambda *a: None)

    return switch


@pytest.fixture
def narrowed(monkeypatch):
    """Counts the forwards that skipped rows and slots (so a comparison is known to exercise them)."""
    seen = {"rows": 0, "slots": 0}
    original = loop.subset

    def spy(*args):
        out = original(*args)
        seen["rows"] += out is not None and out.rows is not None
        seen["slots"] += out is not None and out.slots is not None
        return out

    monkeypatch.setattr(loop, "subset", spy)
    return seen


def _decode(model, prompts, sampler, cache, **kw):
    kw.setdefault("gen_length", 24)
    kw.setdefault("block_length", 8)
    if sampler == "threshold":
        kw.setdefault("sampler_options", {"threshold": THRESHOLD})
    if sampler == "low_confidence":
        kw.setdefault("steps", kw["gen_length"])
    return dlm_decode.generate(model, prompts, sampler=sampler, cache=cache, **kw)


@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("cache", CACHES)
def test_mixed_batch_same_tokens_and_nfe_as_the_plain_path(tiny_model, sampler, cache, plain, narrowed):
    fast = _decode(tiny_model, MIXED, sampler, cache)
    if sampler != "low_confidence":  # a fixed schedule keeps every row busy to the block's last step
        assert narrowed["rows"] > 0
    assert narrowed["slots"] > 0
    plain(tiny_model)
    ref = _decode(tiny_model, MIXED, sampler, cache)
    assert torch.equal(fast.sequences, ref.sequences)
    assert fast.nfe == ref.nfe and [r.nfe for r in fast.rows] == [r.nfe for r in ref.rows]
    assert fast.tokens_per_step == ref.tokens_per_step
    assert fast.token_forwards <= ref.token_forwards


@pytest.mark.parametrize("sampler", ["threshold", "low_confidence", "maskgit_plus", "origin", "random"])
def test_random_draws_unchanged_at_temperature_one(tiny_model, sampler, plain):
    """Zero logits off the candidates keep every draw's shape, so a seeded sample is the plain path's."""
    kw = dict(temperature=1.0, seed=3, steps=24) if sampler != "threshold" else dict(temperature=1.0, seed=3)
    fast = _decode(tiny_model, MIXED, sampler, "dual", **kw)
    plain(tiny_model)
    ref = _decode(tiny_model, MIXED, sampler, "dual", **kw)
    assert torch.equal(fast.sequences, ref.sequences) and fast.nfe == ref.nfe


@pytest.mark.parametrize("sampler", ["entropy_threshold", "local_leap", "maskgit_plus", "entropy", "learned_filter"])
def test_other_samplers_same_tokens_as_the_plain_path(tiny_model, sampler, plain):
    kw = {} if sampler in ("entropy_threshold", "local_leap") else {"steps": 12}
    if sampler in ("maskgit_plus", "entropy"):
        kw["block_length"] = None
    fast = _decode(tiny_model, MIXED, sampler, "prefix", **kw)
    plain(tiny_model)
    ref = _decode(tiny_model, MIXED, sampler, "prefix", **kw)
    assert torch.equal(fast.sequences, ref.sequences) and fast.nfe == ref.nfe


def test_classifier_free_guidance_same_tokens(llada, plain):
    kw = dict(cfg_scale=1.5)
    fast = _decode(llada, MIXED, "threshold", "dual", **kw)
    plain(llada)
    ref = _decode(llada, MIXED, "threshold", "dual", **kw)
    assert torch.equal(fast.sequences, ref.sequences) and fast.nfe == ref.nfe


# ------------------------------------------------------------------------------------- against the references


def _reference(llada, llada_dir, sampler, cache, gen, block):
    """Tokens and NFE of the re-stated Fast-dLLM / LLaDA loop for (sampler, cache) on EQUAL."""
    cfg = json.loads((llada_dir / "config.json").read_text())
    sd = dict(llada.state_dict())
    calls = []

    def fwd(ids, past=None, replace=None):
        calls.append(1)
        return llada_cached_forward(sd, cfg, ids, past=past, replace=replace)

    mask = llada.mask_token_id
    opt = {"threshold": {"threshold": THRESHOLD}, "factor": {"factor": 1.0}, "low_confidence": {"steps": gen}}[sampler]
    if cache == "none" and sampler == "low_confidence":
        x = llada_generate(lambda ids: fwd(ids)[0], EQUAL, gen, gen, block, mask)
    elif cache == "none":
        x, _ = fastdllm_generate(lambda ids: fwd(ids)[0], EQUAL, gen, block, mask, **opt)
    else:
        x, _ = (prefix_cache_generate if cache == "prefix" else dual_cache_generate)(
            fwd, EQUAL, gen, block, mask, **opt
        )
    return x, len(calls)


@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
def test_equal_batch_matches_the_reference_loops(llada, llada_dir, sampler, cache, narrowed):
    gen, block = 24, 8
    x, nfe = _reference(llada, llada_dir, sampler, cache, gen, block)
    out = _decode(llada, EQUAL, sampler, cache, gen_length=gen, block_length=block)
    assert narrowed["slots"] > 0 and (narrowed["rows"] > 0 or sampler == "low_confidence")
    assert torch.equal(out.sequences, x) and out.nfe == nfe


# ------------------------------------------------------------------------------------------------ the pieces


@pytest.mark.parametrize("which", ["llada", "dream"])
def test_hidden_states_of_some_rows_equal_all_rows_then_taken(which, llada, dream):
    model = {"llada": llada, "dream": dream}[which]
    pos = torch.arange(IDS.shape[1]).expand_as(IDS)
    full = model.hidden_states(IDS, pos)
    rows = torch.tensor([[6, 7, 9, 9], [4, 5, 7, 0]])
    torch.testing.assert_close(model.hidden_states(IDS, pos, rows=rows), take_rows(full, rows), rtol=0, atol=1e-6)
    torch.testing.assert_close(model.hidden_states(IDS, pos, rows=slice(2, 8)), full[:, 2:8], rtol=0, atol=1e-6)


@pytest.mark.parametrize("which", ["llada", "dream"])
@pytest.mark.parametrize("compute", ["slice", "index"])
def test_denoise_read_gives_the_region_logits_there_and_zeros_elsewhere(which, compute, llada, dream):
    model = {"llada": llada, "dream": dream}[which]
    b, t = IDS.shape
    pos = torch.arange(t).expand(b, t)
    comp = slice(0, t) if compute == "slice" else torch.arange(t).expand(b, t)
    region = (0, t) if which == "dream" else (4, t)  # Dream's slot 0 is predicted by hidden state 0 (clamped)
    full = model.denoise(IDS, pos, compute=comp, region=region)
    read = torch.tensor([[0, 2, 6, 6], [3, 1, 5, 2]])
    got = model.denoise(IDS, pos, compute=comp, region=region, read=read)
    kept = torch.zeros(full.shape[:2], dtype=torch.bool).scatter_(1, read, True)
    torch.testing.assert_close(got[kept], full[kept], rtol=0, atol=1e-5)
    assert not got[~kept].any()


def test_access_rows_write_only_those_rows_and_spread_queries_to_them():
    store = KVStore(2, 4, 2, 10, 3, dtype=torch.float32, device="cpu")
    rows = torch.tensor([3, 1])
    kv = KVAccess(store, rows=rows)  # a forward of the store's rows 3 and 1
    k, v = torch.randn(2, 2, 4, 3), torch.randn(2, 2, 4, 3)
    keys, values = kv.update(1, slice(2, 6), k, v)
    ids = torch.tensor([[0, 4, 4], [9, 5, 7]])
    k2 = torch.randn(2, 2, 3, 3)
    k2[0, :, 2] = k2[0, :, 1]  # a repeated slot carries the same K/V (the index padding)
    kv.update(0, ids, k2, k2)
    assert keys.shape[0] == 4  # reads are the whole batch, never a copy of the rows
    assert torch.equal(kv.own_rows(keys)[:, :, 2:6], k) and torch.equal(kv.own_rows(values)[:, :, 2:6], v)
    q = torch.randn(2, 5)
    assert torch.equal(kv.spread(q)[rows], q) and not kv.spread(q)[[0, 2]].any()
    assert kv.spread(torch.zeros(2, 5, dtype=torch.bool), True)[[0, 2]].all()
    whole = KVAccess(store)
    assert whole.spread(q) is q and whole.own_rows(q) is q
    assert not store.k[:, [0, 2]].any() and not store.v[:, [0, 2]].any()
    assert torch.equal(store.k[1, 3, :, 2:6], k[0]) and torch.equal(store.k[1, 1, :, 2:6], k[1])
    for j, r in enumerate(rows.tolist()):
        for q in range(3):
            assert torch.equal(store.k[0, r, :, ids[j, q]], k2[j, :, q])


def test_unwritten_access_attends_to_fresh_kv_and_leaves_the_store_as_it_was():
    """``write=False`` (a plan that keeps the cache): the keys read back carry the fresh K/V at the forward's rows
    and slots, the store itself keeps its old ones, and nothing of the forward stays behind in it."""
    store = KVStore(2, 3, 2, 8, 4, dtype=torch.float32, device="cpu")
    store.k.normal_(), store.v.normal_()
    before_k, before_v = store.k.clone(), store.v.clone()
    rows = torch.tensor([2])
    k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4)
    keys, values = KVAccess(store, rows=rows, write=False).update(1, slice(4, 7), k, v)
    assert torch.equal(keys[2, :, 4:7], k[0]) and torch.equal(values[2, :, 4:7], v[0])
    assert torch.equal(keys[:2], before_k[1, :2]) and torch.equal(keys[2, :, :4], before_k[1, 2, :, :4])
    assert torch.equal(store.k, before_k) and torch.equal(store.v, before_v)


def test_the_store_keeps_no_per_call_state():
    """The store is storage only: its K/V buffers and nothing a forward sets and resets."""
    store = KVStore(2, 3, 2, 8, 4, dtype=torch.float32, device="cpu")
    assert set(vars(store)) == {"k", "v"}
    copy = store.take_rows(torch.tensor([0, 0, 2]))
    assert set(vars(copy)) == {"k", "v"} and copy.k.shape[1] == 3


def test_versus_reference_benchmark_runs_and_finds_identical_tokens(llada_dir, capsys):
    bench = load_script("benchmarks/bench_speed.py")
    argv = ["--versus-reference", "--model", str(llada_dir), "--vr-configs", "32x1,32x2", "--vr-steps", "32"]
    assert bench.main(argv + ["--repeats", "1", "--warmup", "0", "--threads", "1"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["all_identical"] and out["torch_threads"] == 1 and len(out["results"]) == 10
    rows = {r["row"] for r in out["results"]}
    assert rows == {"llada_generate", "threshold", "threshold+prefix", "threshold+dual", "fixed+dual"}
    assert all(r["nfe_reference"] == r["nfe_ours"] > 0 for r in out["results"])
    assert {(d["gen_length"], d["batch"]) for d in out["threshold_dual_over_threshold"]} == {(32, 1), (32, 2)}

    # --vr-rows picks rows (the dual-over-none ratio needs both of its rows); a bad name fails before any work
    assert (
        bench.main([*argv[:4], "32x1", "--vr-rows", "threshold+prefix,threshold", "--repeats", "1", "--warmup", "0"])
        == 0
    )
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [r["row"] for r in out["results"]] == ["threshold", "threshold+prefix"] == out["rows"]
    assert out["all_identical"] and out["threshold_dual_over_threshold"] == []
    with pytest.raises(SystemExit, match=r"--vr-rows: unknown \['dual'\]; choose from llada_generate"):
        bench.main([*argv, "--vr-rows", "threshold,dual"])


def test_versus_reference_roofline_columns_and_half_precision(llada_dir, capsys):
    """The roofline fields are the weight bytes x NFE over the median seconds (and their share of --peak-gbps); a
    bfloat16 run reports its identity instead of refusing; a random model of another size is built in the dtype."""
    bench = load_script("benchmarks/bench_speed.py")
    vr = bench.versus_reference
    argv = ["--versus-reference", "--model", str(llada_dir), "--vr-configs", "32x1", "--vr-rows", "threshold+dual"]
    argv += ["--repeats", "1", "--warmup", "0", "--threads", "1"]
    assert bench.main([*argv, "--peak-gbps", "40"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    model = dlm_decode.load_model(llada_dir, tokenizer=False)[0]
    emb = model.get_input_embeddings().weight.numel() * 4
    wbytes = sum(p.numel() * 4 for p in model.parameters()) - emb
    assert out["weight_bytes_per_forward"] == wbytes and out["peak_gbps"] == 40.0 and out["dtype"] == "float32"
    (r,) = out["results"]
    for side in ("reference", "ours"):
        gbps = wbytes * r[f"nfe_{side}"] / r[f"seconds_{side}"][0] / 1e9
        assert r[f"weight_gbps_{side}"] == pytest.approx(gbps) and r[f"roofline_{side}"] == pytest.approx(gbps / 40)
        assert r[f"ms_per_forward_{side}"] == pytest.approx(1e3 * r[f"seconds_{side}"][0] / r[f"nfe_{side}"])
    assert r["forward_speedup"] == pytest.approx(r["ms_per_forward_reference"] / r["ms_per_forward_ours"])
    assert vr.peak_gbps("cpu", None) == (None, None)  # no peak known on a CPU: the share columns print "-"
    assert bench.main([*argv, "--dtype", "bfloat16"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["dtype"] == "bfloat16" and out["weight_bytes_per_forward"] == wbytes // 2
    assert out["results"][0]["roofline_ours"] is None and isinstance(out["results"][0]["identical"], bool)
    args = bench.parse_args(["--versus-reference", "--vr-configs", "32x1", "--dtype", "bfloat16"])
    args.vr_size = "tiny"  # random_models.RANDOM_SHAPES: d 128, 2 layers, vocabulary 512
    tiny, described = vr.load(args)
    assert next(tiny.parameters()).dtype == torch.bfloat16 and "tiny widths" in described
    assert tiny.get_input_embeddings().weight.shape == (512, 128) and tiny.mask_token_id == 511


def test_region_end_follows_every_block_end_change(llada, monkeypatch):
    """The step's sync brings back the widest block end; a block end set anew (a sampler's variable block, a cut)
    drops that copy, so ``region`` never reads a stale one."""
    cursor = BlockCursor(next_start=torch.zeros(2, dtype=torch.long))
    cursor.block_end, cursor.widest_end = torch.tensor([5, 9]), 9
    cursor.block_end = torch.tensor([5, 7])
    assert cursor.widest_end is None
    original, seen = DecodeState.region, []

    def checked(self):
        got = original(self)
        assert got == (self.block_start, int(self.block_end.max()))
        seen.append(got)
        return got

    monkeypatch.setattr(DecodeState, "region", checked)
    opts = {"delimiter_ids": tuple(range(3, 63)), "delimiter_threshold": 0.05}
    out = dlm_decode.generate(llada, MIXED, sampler="adaptive_block", sampler_options=opts, gen_length=24)
    assert seen and any(s != 8 for sizes in out.scratch["adaptive_block"] for s in sizes if s > 0)


def test_bench_fused_projections_compares_equal_outputs_and_ends_in_one_json_line(capsys):
    bench = load_script("benchmarks/bench_fused_projections.py")
    torch.manual_seed(0)
    x, ws = torch.randn(4, 16), [torch.randn(8, 16), torch.randn(24, 16)]
    r = bench.compare(x, ws, repeats=1, calls=2)
    # the flag reports what the two ways give (not bitwise equal at every shape: BLAS blocks by output width)
    fused = torch.nn.functional.linear(x, torch.cat(ws)).split([8, 24], -1)
    expected = all(torch.equal(torch.nn.functional.linear(x, w), f) for w, f in zip(ws, fused, strict=True))
    assert r["bitwise_equal"] is expected and r["calls"] == 2 and r["separate_us"] > 0 and r["fused_us"] > 0
    assert bench.compare(x, ws[:1], repeats=1, calls=1)["bitwise_equal"] is True  # one weight: the same call
    out = bench.main(["--sizes", "demo", "--rows", "2", "--repeats", "1", "--calls", "1", "--threads", "1"])
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last == out and last["torch_threads"] == 1
    assert [(r["rows"], r["what"]) for r in last["results"]] == [(2, "qkv"), (2, "gate_up")]
    with pytest.raises(SystemExit):
        bench.main(["--sizes", "huge"])
    with pytest.raises(SystemExit):
        bench.main(["--rows", "a,b"])
