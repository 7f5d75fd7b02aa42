"""Benchmark scripts checked on the CPU.

- ``benchmarks/bench_block_diffusion.py``'s GPU pieces (issue 48): the random model built in place at LLaDA2.0-mini's
  widths, and the roofline's bytes a forward, counted from the experts the forwards reach, on a model whose routing is
  forced so the count is known.
- ``benchmarks/profile_decode.py``: the profile of a decode on a random tiny LLaDA, its summary and its errors.
- ``benchmarks/bench_serving.py``: the serving benchmark at tiny sizes (every setup agrees on every answer)."""

from __future__ import annotations

import json
import sys
from argparse import Namespace
from pathlib import Path

import pytest
import torch
from llada2_reference import EOS, MASK, write_llada2

import dlm_decode
from dlm_decode.models.loading import load_model
from dlm_decode.models.moe import Router, SparseMoE

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_block_diffusion as bench  # noqa: E402

from tests.conftest import load_script  # noqa: E402

pytestmark = [pytest.mark.usefixtures("one_thread")]


def _args(**over) -> Namespace:
    base = dict(threshold=0.95, gen=32, block=16, steps=16, prompt=16, device="cpu", dtype="float32", peak_gbps=None)
    return Namespace(**(base | over))


@torch.no_grad()
def test_forward_bytes_counts_the_experts_reached(tmp_path):
    """Selection bias on experts 0-2 (two of the four groups, top 3 of the 4 experts they allow): every token of
    every forward reaches exactly those three in each of the two routed layers."""
    model, _ = load_model(write_llada2(tmp_path / "m", seed=1))
    for r in model.modules():
        if isinstance(r, Router):
            r.expert_bias[:3] = 100.0
    moes = [m for m in model.modules() if isinstance(m, SparseMoE)]
    assert len(moes) == 2 and len(moes[0].experts) == 8
    emb = model.get_input_embeddings().weight
    routed = {id(p) for m in moes for p in m.experts.parameters()}
    fixed = sum(p.numel() * 4 for p in model.parameters() if p is not emb and id(p) not in routed)
    expert = sum(p.numel() * 4 for p in moes[0].experts[0].parameters())
    n_layers, heads, hd = model.kv_shape()
    prompts = [list(range(5, 21))]
    args = _args()
    kv = 2 * n_layers * heads * 48 * hd * 4  # the store's 48 slots (prompt 16 + gen 32), K and V, batch 1
    assert bench.forward_bytes(model, "ours", prompts, args, (MASK, EOS)) == fixed + kv + 2 * 3 * expert
    assert bench.forward_bytes(model, "reference", prompts, args, (MASK, EOS)) == fixed + 2 * 3 * expert
    for r in model.modules():
        if isinstance(r, Router):
            r.expert_bias.zero_()  # free routing reaches more of them
    assert bench.forward_bytes(model, "reference", prompts, args, (MASK, EOS)) > fixed + 2 * 3 * expert


def test_mini_model_has_the_published_widths():
    """Two layers of LLaDA2.0-mini with 16 experts, built in place (no checkpoint), MASK's lm_head row zeroed; on a CPU
    in float32 the looped expert path is the one measured."""
    args = _args(layers=2, experts=16, block=32)
    model = bench.mini_model(args)
    c = model.config
    assert (c.hidden_size, c.vocab_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (
        2048, 157184, 16, 4, 128,
    )  # fmt: skip
    assert (c.num_experts, c.num_experts_per_tok, c.n_group, c.topk_group, c.moe_intermediate_size) == (
        16,
        8,
        8,
        4,
        512,
    )
    moe = model.model.layers[1].mlp
    assert (
        isinstance(moe, SparseMoE)
        and moe.shared_experts is not None
        and not isinstance(model.model.layers[0].mlp, SparseMoE)
    )
    assert model.lm_head.weight[model.mask_token_id].abs().sum() == 0 and model.lm_head.weight.std() > 0.01
    assert args.expert_path == "looped"
    with torch.no_grad():
        logits = model(torch.arange(8)[None], block_length=32).logits
    assert logits.shape == (1, 8, 157184) and torch.isfinite(logits).all()


def test_profile_counts_the_decodes_forwards_and_prints_json_last(capsys):
    prof = load_script("benchmarks/profile_decode.py")
    models = load_script("benchmarks/random_models.py")
    out = prof.main(["--shape", "tiny", "--gen", "64", "--cache", "none,dual", "--rows", "4", "--repeats", "2"])
    printed = capsys.readouterr().out.strip().splitlines()
    assert json.loads(printed[-1]) == json.loads(json.dumps(out))
    # the same decode run outside the profiler: the NFE the profile reports is the decode's own
    model = models.random_llada("cpu", "tiny")
    prompt = models.random_ids(model, 1, prof.PROMPT, torch.Generator().manual_seed(0))
    for row in out["caches"]:
        ref = dlm_decode.generate(
            model,
            prompt,
            sampler="threshold",
            cache=row["cache"],
            gen_length=64,
            block_length=prof.BLOCK,
            temperature=0.0,
        )
        assert row["nfe"] == ref.nfe >= 2  # at least one forward per block
        assert 0 < row["busy_s"] and 0 < row["busy_share"] <= 1.5 and row["wall_s"] > 0
    assert [r["cache"] for r in out["caches"]] == ["none", "dual"]
    assert out["bare_forward_ms_128"] > 0 and out["bare_forward_ms_32"] > 0
    assert any(line.lstrip().startswith("aten::mm") for line in printed)  # the operator table was printed


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--cache", "none,bogus"], ["--cache", "bogus", "dual"]),
        (["--cache", ","], ["--cache"]),
        (["--sampler", "nope"], ["--sampler", "nope", "threshold"]),
    ],
)
def test_profile_refuses_unknown_names_before_building_a_model(argv, words, monkeypatch):
    prof = load_script("benchmarks/profile_decode.py")
    monkeypatch.setattr(prof, "random_llada", lambda *a, **k: pytest.fail("built a model before checking arguments"))
    with pytest.raises(SystemExit) as e:
        prof.main(argv)
    assert all(w in str(e.value) for w in words)


def test_op_sites_count_the_forwards_matmuls_exactly(capsys):
    # every forward of the tiny LLaDA (2 layers) dispatches one matmul per projection (q, k, v, out, and the MLP's
    # three) in each layer plus the LM head: 7 * 2 + 1 = 15, whatever the cache; nothing else in a threshold decode
    # multiplies matrices
    prof = load_script("benchmarks/profile_decode.py")
    out = prof.main(
        ["--shape", "tiny", "--gen", "64", "--cache", "none,dual", "--rows", "2", "--repeats", "1"]
        + ["--op-sites", "5"]
    )
    printed = capsys.readouterr().out
    for row in out["caches"]:
        assert row["ops_nfe"] == row["nfe"]
        assert row["ops"]["aten.mm.default"] == 15 * row["nfe"]
        assert row["ops_per_forward"] == pytest.approx(sum(row["ops"].values()) / row["nfe"])
        assert len(row["op_sites"]) == 5 and all(n > 0 for n in row["op_sites"].values())
        assert any(site.startswith("models/") for site in row["op_sites"])  # the layers dispatch most
    assert printed.count("per forward  dispatched from (dlm_decode/...)") == 2


def test_op_sites_must_not_be_negative(monkeypatch):
    prof = load_script("benchmarks/profile_decode.py")
    monkeypatch.setattr(prof, "random_llada", lambda *a, **k: pytest.fail("built a model before checking arguments"))
    with pytest.raises(SystemExit, match="--op-sites must be >= 0"):
        prof.main(["--op-sites", "-1"])


def test_forward_bound_splits_each_decode_into_its_forwards_and_the_host(capsys):
    """``forward_bound.py`` times the same three decodes as ``bench_block_diffusion.py`` with the model's entry points
    clocked: every forward of each way is counted once (ours' and the reference's as many as their decodes report,
    the SDAR-style loop's one more a block plus the prefill), the forwards take part of each decode and not all of
    it, the tokens agree, and the clock leaves the model's methods as they were."""
    fb = load_script("benchmarks/forward_bound.py")
    assert fb.main(["--hidden", "64", "--batches", "1", "--gen", "32", "--repeats", "1", "--rows", "1,32"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    run = out["runs"]["batch 1"]
    assert run["same_tokens"] is True
    prompts = bench.random_prompts(1, 64, MASK - 1)
    model = bench.random_model(64, Namespace(layers=None, vocab=512))
    args = _args(gen=32, block=32, steps=32, prompt=64)
    nfe = {w: bench.run_once(w, model, prompts, args)[2] for w in ("ours", "reference", "sdar")}
    assert run["forward_calls"] == nfe
    assert nfe["sdar"] == nfe["ours"] + 1 + 1  # one answer block (gen 32): its extra forward, and the prefill
    for way in ("ours", "reference", "sdar"):
        part = run[way]
        assert 0 < part["forward_s"] < part["seconds"] and 0 < part["host_share"] < 1
    assert run["reference_over_ours_forwards"] > run["reference_over_ours"]  # our forwards alone beat our decode
    assert set(out["rows_s"]) == {"1", "32"} and out["threads"] == 1
    with fb.ForwardClock(model) as clock:
        bench.run_once("ours", model, prompts, args)
    assert clock.calls == nfe["ours"] and "denoise" not in vars(model) and "forward" not in vars(model)


def test_forward_bound_refuses_bad_numbers_before_building_a_model(monkeypatch, capsys):
    fb = load_script("benchmarks/forward_bound.py")
    monkeypatch.setattr(fb, "random_model", lambda *a: pytest.fail("built a model"))
    for argv, words in ((["--batches", "1,x"], "comma-separated"), (["--rows", "0"], ">= 1")):
        with pytest.raises(SystemExit):
            fb.main(argv)
        assert words in capsys.readouterr().err


def test_bench_engine_runs_every_part_and_prints_json_last(capsys):
    """bench_engine.py at tiny sizes: the three offline ways give the same tokens, the online part reports the
    latency percentiles of both ways at each load, and the last line is the JSON with the thread count."""
    bench_engine = load_script("benchmarks/bench_engine.py")
    argv = ["--width", "64", "--layers", "1", "--vocab", "256", "--requests", "4", "--online-requests", "3"]
    argv += ["--prompt-lengths", "8-24", "--gen-lengths", "32-64", "--max-batch", "2", "--repeats", "1"]
    assert bench_engine.main(argv + ["--loads", "1.0"]) == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    off = last["offline"]
    assert off["same_tokens"] is True and last["threads"] == torch.get_num_threads()
    assert last["admission"] == "longest" and last["online_requests"] == 3
    assert set(off["tokens_per_s"]) == {"engine", "static", "alone"} and off["tokens"] > 0
    assert off["kv_bytes"]["engine_arena"] > 0
    on = last["online"]["1"]
    assert on["engine"]["latency"]["p95"] >= on["engine"]["latency"]["p50"] > 0
    assert on["static"]["queueing"]["p50"] >= 0
    assert last["capacity_rps"] == off["capacity_rps"]


def test_bench_engine_takes_a_given_capacity_and_skips_the_offline_part(capsys):
    """``--capacity``: the online loads are fractions of the given rate (its arrivals that rate's), no offline part."""
    bench_engine = load_script("benchmarks/bench_engine.py")
    argv = ["--width", "64", "--layers", "1", "--vocab", "256", "--online-requests", "3", "--capacity", "50"]
    argv += ["--prompt-lengths", "8-24", "--gen-lengths", "32-32", "--max-batch", "2", "--loads", "0.5"]
    assert bench_engine.main(argv) == 0
    out = capsys.readouterr().out
    last = json.loads(out.strip().splitlines()[-1])
    assert "offline" not in last and "offline:" not in out and last["capacity_rps"] == 50.0
    assert last["online"]["0.5"]["rate_rps"] == 25.0


@pytest.mark.parametrize(
    "argv, words",
    [(["--gen-lengths", "40-64"], "multiple of the block"), (["--prompt-lengths", "9"], "LO-HI"),
     (["--loads", "0.5,x"], "--loads"), (["--max-batch", "0"], "--max-batch"),
     (["--model", "random:llada-9b"], "random:SHAPE takes one of"), (["--dtype", "int8"], "--dtype must be"),
     (["--device", "cuda"], "need --model random:SHAPE"), (["--capacity", "0"], "--capacity must be"),
     (["--capacity", "2", "--online-requests", "0"], "needs --online-requests"),
     (["--admission", "random"], "--admission must be one of arrival, longest")],
)  # fmt: skip
def test_bench_engine_refuses_bad_options_before_building_a_model(argv, words, monkeypatch):
    bench_engine = load_script("benchmarks/bench_engine.py")
    monkeypatch.setattr(bench_engine, "build_model", lambda args: pytest.fail("built a model"))
    with pytest.raises(ValueError, match=words):
        bench_engine.main(argv)


def test_bench_engine_takes_a_published_shape_on_a_device(capsys):
    """``--model random:SHAPE`` (the GPU target's LLaDA-8B widths, here the tiny shape on the CPU): the engine's
    tokens equal static batches' and alone's, the JSON records the shape's width, device and dtype."""
    bench_engine = load_script("benchmarks/bench_engine.py")
    argv = ["--model", "random:tiny", "--layers", "1", "--requests", "3", "--online-requests", "0", "--repeats", "1"]
    argv += ["--prompt-lengths", "8-24", "--gen-lengths", "32-64", "--max-batch", "2", "--cache", "dual"]
    assert bench_engine.main(argv) == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["offline"]["same_tokens"] is True and last["offline"]["tokens"] > 0
    assert (last["width"], last["layers"], last["device"], last["dtype"]) == (128, 1, "cpu", "float32")


def test_serving_benchmark_runs_every_setup_and_prints_json_last(capsys):
    """``benchmarks/bench_serving.py`` at tiny sizes: a row per setup and client count, the same answers from the
    engine in-process, the server and the one-row server, and its JSON last."""
    pytest.importorskip("fastapi")
    bench = load_script("benchmarks/bench_serving.py")
    argv = ["--clients", "1,3", "--requests", "3", "--rate", "100", "--gen-length", "16", "--max-batch", "2"]
    out = bench.main(argv)
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == out
    got = [(r["setup"], r["clients"]) for r in out["results"]]
    assert got == [(s, c) for c in (1, 3) for s in ("engine", "http", "http-batch1")]
    assert out["answers_equal"] and out["threads"] == torch.get_num_threads()
    for r in out["results"]:
        assert r["req_per_s"] > 0 and 0 < r["p50_s"] <= r["p95_s"] and r["tokens_per_s"] >= 0
    with pytest.raises(SystemExit):
        bench.main(["--setups", "engine,nope"])


def test_block_causal_bench_runs_both_families_and_prints_json_last(capsys):
    """``benchmarks/bench_block_causal.py`` at tiny sizes: every way gives ours' tokens, the forward counts are the
    references' minus exactly what our exact cache saves (SDAR: the prompt's prefill and one ``store_kv`` forward per
    decoded block; Fast-dLLM v2: the prefill of a prompt ending mid-block and the write after the last block), every
    decode's forwards are clocked inside its seconds, and the last line is the JSON with the thread count."""
    bc = load_script("benchmarks/bench_block_causal.py")
    argv = ["--hidden", "128", "--layers", "1", "--vocab", "512", "--prompt", "12", "--gen", "24", "--repeats", "1"]
    assert bc.main(argv + ["--fdllm-block", "8", "--small-block", "4", "--batches", "1,2"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["torch_threads"] == torch.get_num_threads() and out["threads"] == 1
    assert set(out["runs"]) == {f"{f} batch {b}" for f in ("sdar", "fast_dllm_v2") for b in (1, 2)}
    for label, run in out["runs"].items():
        assert run["same_tokens"] is True, label
        for w, secs in run["seconds"].items():
            assert 0 < run["forward_s"][w] < secs and run["ms_per_forward"][w] > 0
        for w in set(run["nfe"]) - {"ours"}:
            assert run[f"ours_over_{w}"] == pytest.approx(run["seconds"][w] / run["seconds"]["ours"])
            assert run[f"forwards_saved_vs_{w}"] == pytest.approx(run["nfe"][w] / run["nfe"]["ours"])
    sdar, fd = out["runs"]["sdar batch 1"], out["runs"]["fast_dllm_v2 batch 1"]
    blocks = -(-sdar["tokens"] // 4)  # prompt 12 ends on a block of 4: the answer's blocks, each with its store
    assert sdar["nfe"]["reference"] == sdar["nfe"]["ours"] + 1 + blocks == sdar["nfe"]["reference_batched"]
    assert fd["nfe"]["reference"] - fd["nfe"]["ours"] == 1 + (fd["tokens"] == 24)  # no stop: the last write too
    assert set(out["runs"]["sdar batch 2"]["nfe"]) == {"ours", "reference", "reference_batched"}


def test_bench_multi_block_runs_every_case_and_prints_json_last(capsys):
    """``benchmarks/bench_multi_block.py --quick``: every case at batch 1 and 2 decodes every slot both ways; the
    exact ``prefix`` cache under D2F's attention gives the no-cache tokens both ways; multi-block takes fewer forwards
    than block by block somewhere; the ratios and the bound follow from the numbers; the JSON is the last line."""
    mb = load_script("benchmarks/bench_multi_block.py")
    assert mb.main(["--quick", "--blocks", "8"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["threads"] == 1 and out["torch_threads"] == 1 and out["gen"] == 32
    runs = out["runs"]
    assert set(runs) == {f"{c} batch {b} block 8" for c in mb.CASES for b in (1, 2)}
    for label, e in runs.items():
        batch = int(label.split()[2])
        assert e["all_decoded"] and e["tokens"] == {"blocks": 32 * batch, "multi": 32 * batch}, label
        assert e["nfe_ratio"] == e["nfe"]["blocks"] / e["nfe"]["multi"]
        assert e["time_ratio"] == pytest.approx(e["seconds"]["blocks"] / e["seconds"]["multi"])
        assert e["bound"] == ("forwards" if e["time_ratio"] >= 0.9 * e["nfe_ratio"] else "per-forward work")
        assert e["slots_per_forward"]["multi"] >= e["logit_slots_per_forward"]["multi"] > 0
    for b in (1, 2):
        assert runs[f"d2f_prefix batch {b} block 8"]["same_tokens_as_d2f_none"] == {"blocks": True, "multi": True}
    assert any(e["nfe"]["multi"] < e["nfe"]["blocks"] for e in runs.values())


def test_bench_multi_block_at_thresholds_1_is_block_by_block(capsys):
    """``--add 1 --dec 1``: the multi way opens a block only when the last is done, so it decodes what block by
    block decodes, with as many forwards, in every case."""
    mb = load_script("benchmarks/bench_multi_block.py")
    assert mb.main(["--quick", "--blocks", "16", "--batches", "2", "--add", "1", "--dec", "1"]) == 0
    runs = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["runs"]
    assert len(runs) == len(mb.CASES)
    for label, e in runs.items():
        assert e["same_tokens"] and e["nfe"]["multi"] == e["nfe"]["blocks"], label


@pytest.mark.parametrize(
    "argv, words",
    [(["--ways", "reference"], "give ours"), (["--families", "llada"], "--families"), (["--hidden", "100"], "128"),
     (["--prompt", "64"], "one-block prompt"), (["--batches", "1,x"], "--batches")],
)  # fmt: skip
def test_block_causal_bench_refuses_bad_options_before_building_a_model(argv, words, monkeypatch, capsys):
    bc = load_script("benchmarks/bench_block_causal.py")
    monkeypatch.setattr(bc, "build", lambda *a: pytest.fail("built a model"))
    with pytest.raises(SystemExit):
        bc.main(argv)
    assert words in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, words",
    [(["--gen", "40", "--blocks", "32"], "multiple of every block"), (["--cases", "d2f_prefix,nope"], "unknown nope"),
     (["--batches", "1,x"], "comma-separated"), (["--repeats", "0"], ">= 1")],
)  # fmt: skip
def test_bench_multi_block_refuses_bad_options_before_building_a_model(argv, words, monkeypatch, capsys):
    mb = load_script("benchmarks/bench_multi_block.py")
    monkeypatch.setattr(mb, "build", lambda *a: pytest.fail("built a model"))
    with pytest.raises(SystemExit):
        mb.main(argv)
    assert words in capsys.readouterr().err


def test_lm_head_rows_reports_each_row_count_and_the_gain_at_eight_times_the_rows(capsys):
    """``lm_head_rows.py`` at a tiny head: one entry per row count, a row's milliseconds and GFLOP/s consistent with
    each other, the gain where 8x the rows was measured (and only there), and the JSON last with the thread count."""
    script = load_script("benchmarks/lm_head_rows.py")
    assert script.main(["--vocab", "300", "--width", "16", "--rows", "1,2,8", "--repeats", "2"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(out["rows"]) == {"1", "2", "8"} and out["threads"] == 1 and out["layout"] == "decode"
    for row in out["rows"].values():  # GFLOP/s = 2 R d V / (ms a row * R / 1000) / 1e9
        assert row["gflops"] == pytest.approx(2 * 16 * 300 / (row["ms_a_row"] / 1000) / 1e9)
    assert "gain_at_8x" in out["rows"]["1"] and "gain_at_8x" not in out["rows"]["2"]
    one, eight = out["rows"]["1"]["ms_a_row"], out["rows"]["8"]["ms_a_row"]
    assert out["rows"]["1"]["gain_at_8x"] == pytest.approx(one / eight)


def test_lm_head_rows_refuses_bad_row_counts(capsys):
    script = load_script("benchmarks/lm_head_rows.py")
    bad = [(["--rows", "1,x"], "comma-separated"), (["--rows", "0"], ">= 1"), (["--width", "0"], ">= 1")]
    for argv, words in bad + [(["--layout", "rows"], "invalid choice")]:
        with pytest.raises(SystemExit):
            script.main(argv)
        assert words in capsys.readouterr().err
