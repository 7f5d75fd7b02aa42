"""Step graphs (``generate(cuda_graphs=True)``, ``models/graphs.py``) decode the same tokens and NFE as the eager loop.

On the CPU nothing is captured, but the fixed-shape path runs as on a GPU: a shape's first call eagerly, then its
inputs copied into the entry's buffers and the recorded forward called on them; so a step input the graph would not
see (a buffer left stale) shows here as a changed token. The counts prove that replays happened. The CUDA capture
itself runs in the ``gpu``-marked test at the end (skipped without CUDA).
"""

from __future__ import annotations

import pytest
import torch
from conftest import decode_small

import dlm_decode
from dlm_decode.cache import KVStore
from dlm_decode.cache.store import KVAccess
from dlm_decode.models.graphs import StepGraphs

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.filterwarnings("ignore:cuda_graphs=True on a cpu model"),  # said once in its own test below
]

MIXED = [[5, 9, 17, 3, 40, 22], [7, 2, 33], [11, 30, 30, 8, 19], [4, 4]]  # left padding: a key mask every step


def _decode(model, sampler, cache, **kw):
    return decode_small(model, MIXED, sampler, cache, **kw)


@pytest.mark.parametrize("sampler", ["threshold", "low_confidence"])
@pytest.mark.parametrize("cache", ["none", "prefix", "dual", "window"])
def test_graphed_steps_decode_the_eager_tokens(tiny_model, sampler, cache):
    eager = _decode(tiny_model, sampler, cache)
    graphed = _decode(tiny_model, sampler, cache, cuda_graphs=True)
    assert torch.equal(graphed.sequences, eager.sequences)
    assert graphed.nfe == eager.nfe and graphed.tokens_per_step == eager.tokens_per_step
    g = graphed.graphs
    assert g["eager"] + g["captured"] + g["replayed"] <= graphed.nfe
    if cache == "window":  # its computed slots move every step: no shape repeats, nothing graphed
        assert g["replayed"] == 0
    else:
        assert g["replayed"] > 0 and g["captured"] > 0  # the comparison exercised replays
    assert eager.graphs == {} and tiny_model.step_graphs is None  # off again after the call


def test_dual_cache_replays_all_but_two_steps_of_a_block(llada):
    """Batch of one, fixed schedule: per block a full refresh (a shape met once: eager), then the cached steps of one
    shape: the first eager, the second captured, the rest replayed."""
    out = dlm_decode.generate(
        llada, [[5, 9, 17, 3]], sampler="low_confidence", cache="dual", gen_length=24, block_length=8, steps=24,
        cuda_graphs=True,
    )  # fmt: skip
    blocks, steps = 3, 8
    assert out.nfe == blocks * steps
    want = {"eager": blocks * 2, "captured": blocks, "replayed": blocks * (steps - 3), "error": None}
    assert out.graphs == want


def test_classifier_free_guidance_decodes_alike(llada):
    """Classifier-free guidance doubles the rows: a fixed shape too."""
    kw = dict(cfg_scale=1.5)
    graphed = _decode(llada, "threshold", "dual", cuda_graphs=True, **kw)
    assert graphed.graphs["replayed"] > 0
    assert torch.equal(graphed.sequences, _decode(llada, "threshold", "dual", **kw).sequences)


def test_draft_and_verify_copies_are_never_graphed(llada):
    """A draft-and-verify sampler's forwards run on copies of the store (one per draft): all eager, same tokens."""
    eager = _decode(llada, "lossless", "dual")
    graphed = _decode(llada, "lossless", "dual", cuda_graphs=True)
    assert torch.equal(graphed.sequences, eager.sequences) and graphed.nfe == eager.nfe


def test_a_failed_capture_warns_and_decodes_the_rest_eagerly(llada, monkeypatch):
    import dlm_decode.models.graphs as graphs

    def broken(e, forward):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(graphs, "_can_capture", lambda canvas: True)
    monkeypatch.setattr(graphs.StepGraphs, "_capture", staticmethod(broken))
    with pytest.warns(RuntimeWarning, match="CUDA graph capture failed, decoding eagerly: RuntimeError: operation"):
        out = _decode(llada, "threshold", "dual", cuda_graphs=True)
    assert out.graphs["captured"] == out.graphs["replayed"] == 0 and "stream is capturing" in out.graphs["error"]
    assert torch.equal(out.sequences, _decode(llada, "threshold", "dual").sequences)


def test_takes_refuses_what_a_graph_cannot_serve(llada):
    store = KVStore(2, 1, 2, 10, 8, dtype=torch.float32, device="cpu")
    g = StepGraphs(store)
    canvas = torch.zeros(1, 10, dtype=torch.long)
    assert not g.takes(canvas, slice(2, 6), store, None, None)  # under autograd (training)
    with torch.no_grad():  # as in generate
        assert g.takes(canvas, slice(2, 6), store, None, None)
        assert g.takes(canvas, slice(2, 6), store, slice(0, 8), None)
        assert not g.takes(canvas, torch.tensor([[2, 3]]), store, None, None)  # slot ids: per-step shapes
        assert not g.takes(canvas, slice(2, 6), store, torch.tensor([[0, 1]]), None)  # gathered keys
        assert not g.takes(canvas, slice(2, 6), store, None, torch.tensor([[0]]))  # a read subset
        assert not g.takes(canvas, slice(2, 6), store.take_rows(torch.tensor([0])), None, None)  # a draft's copy
        assert g.takes(canvas, slice(2, 6), KVAccess(store), None, None)
        assert not g.takes(canvas, slice(2, 6), KVAccess(store, write=False), None, None)  # a frozen store
        assert not g.takes(canvas, slice(2, 6), KVAccess(store, rows=torch.tensor([0])), None, None)  # some rows


def test_cpu_model_is_told_nothing_is_captured(llada):
    with pytest.warns(RuntimeWarning, match="cuda_graphs=True on a cpu model: nothing is captured there"):
        out = _decode(llada, "threshold", "dual", cuda_graphs=True)
    assert out.graphs["captured"] > 0  # the fixed-shape path still ran (uncaptured)


def test_cuda_graphs_must_be_a_bool(llada):
    with pytest.raises(ValueError, match="cuda_graphs must be True or False"):
        dlm_decode.generate(llada, [[5, 9]], gen_length=8, cuda_graphs="yes")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("cache", ["none", "dual", "prefix"])
def test_cuda_capture_decodes_the_eager_tokens(llada_dir, cache):
    model = dlm_decode.load_model(llada_dir, device="cuda")[0]
    eager = _decode(model, "threshold", cache)
    graphed = _decode(model, "threshold", cache, cuda_graphs=True)
    assert graphed.graphs["error"] is None and graphed.graphs["replayed"] > 0
    assert torch.equal(graphed.sequences.cpu(), eager.sequences.cpu()) and graphed.nfe == eager.nfe


def test_versus_reference_graphed_side(llada_dir, capsys):
    """``bench_speed.py --versus-reference --vr-graphs``: a third side with the step graphs, same tokens as eager
    (on a CPU the same fixed-shape steps, uncaptured), its ratios and roofline fields; the flag alone is refused."""
    import json

    from conftest import load_script

    bench = load_script("benchmarks/bench_speed.py")
    argv = ["--versus-reference", "--model", str(llada_dir), "--vr-configs", "32x1", "--vr-rows", "threshold+dual"]
    assert (
        bench.main([*argv, "--repeats", "1", "--warmup", "0", "--threads", "1", "--vr-graphs", "--peak-gbps", "40"])
        == 0
    )
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    (r,) = out["results"]
    assert out["graphed_all_identical"] and r["graphed_identical_to_ours"] and r["nfe_graphed"] == r["nfe_ours"]
    assert r["graphed_over_ours"] == pytest.approx(r["tokens_per_s_graphed"] / r["tokens_per_s_ours"])
    assert r["graphed_over_reference"] == pytest.approx(r["tokens_per_s_graphed"] / r["tokens_per_s_reference"])
    assert r["ms_per_forward_graphed"] == pytest.approx(1e3 * r["seconds_graphed"][0] / r["nfe_graphed"])
    gbps = out["weight_bytes_per_forward"] * r["nfe_graphed"] / r["seconds_graphed"][0] / 1e9
    assert r["roofline_graphed"] == pytest.approx(gbps / 40)
    with pytest.raises(SystemExit):
        bench.parse_args(["--vr-graphs"])
    assert "--vr-graphs needs --versus-reference" in capsys.readouterr().err


def test_cli_generate_cuda_graphs_reports_its_counts(llada_dir, capsys):
    import json

    from dlm_decode.cli import main

    argv = ["generate", str(llada_dir), "--input-ids", "5,6,7", "--cache", "dual", "--gen-length", "16"]
    argv += ["--block-length", "8", "--json"]
    assert main(argv) == 0
    eager = json.loads(capsys.readouterr().out)
    assert main([*argv, "--cuda-graphs"]) == 0
    graphed = json.loads(capsys.readouterr().out)
    assert "graphs" not in eager and graphed["graphs"]["replayed"] > 0 and graphed["graphs"]["error"] is None
    assert [r["generated_ids"] for r in graphed["rows"]] == [r["generated_ids"] for r in eager["rows"]]


def _llada2(tmp_path, device="cpu", dtype=torch.float32):
    from llada2_reference import MASK, write_llada2

    model = dlm_decode.load_model(write_llada2(tmp_path / "m", seed=0), device=device, dtype=dtype)[0]
    with torch.no_grad():
        model.lm_head.weight[MASK] = 0.0  # the reference may commit MASK, ours never does
    return model


BLOCK_PROMPTS = [list(range(5, 25)), list(range(30, 50))]


@pytest.mark.parametrize("cache", ["prefix", "none"])
def test_block_causal_steps_are_graphed_with_the_eager_tokens(tmp_path, cache):
    """Block diffusion (``llada2``, the block-causal mask passed through the graph's key): the steps inside a block
    replay, with the eager loop's tokens and forwards."""
    model = _llada2(tmp_path)
    kw = dict(sampler="llada2", cache=cache, gen_length=64, block_length=16, steps=16)
    eager = dlm_decode.generate(model, BLOCK_PROMPTS, **kw)
    graphed = dlm_decode.generate(model, BLOCK_PROMPTS, cuda_graphs=True, **kw)
    assert [r.generated_ids for r in graphed.rows] == [r.generated_ids for r in eager.rows]
    assert graphed.nfe == eager.nfe > 8
    assert graphed.graphs["replayed"] > 0 and graphed.graphs["captured"] > 0 and graphed.graphs["error"] is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_capture_of_block_diffusion_with_grouped_experts(tmp_path):
    """bf16 on CUDA routes through the grouped expert path (no host sync), so the exact cache's steps capture."""
    model = _llada2(tmp_path, device="cuda", dtype=torch.bfloat16)
    kw = dict(sampler="llada2", cache="prefix", gen_length=64, block_length=16, steps=16)
    eager = dlm_decode.generate(model, BLOCK_PROMPTS, **kw)
    graphed = dlm_decode.generate(model, BLOCK_PROMPTS, cuda_graphs=True, **kw)
    assert graphed.graphs["error"] is None and graphed.graphs["replayed"] > 0
    assert [r.generated_ids for r in graphed.rows] == [r.generated_ids for r in eager.rows]
