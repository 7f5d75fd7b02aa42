"""``generate(compile=...)``: the layers' pieces through ``torch.compile`` decode the eager path's tokens and NFE, and a
compile that fails falls back to eager with one warning (tiny random LLaDA and Dream checkpoints, fp32).

The fast tests need no C++ compiler: the fallback is simulated, and dynamo's capture of the pieces (one graph each,
dynamic sizes) is checked with its ``eager`` backend, which traces without generating code. The inductor tests
(``slow``: compiling takes tens of seconds on a CPU) compare the real compiled kernels with the eager path, and skip,
saying why, where inductor cannot compile here. Speed is ``benchmarks/bench_speed.py --versus-reference --compile``.
"""

from __future__ import annotations

import functools
import json
import warnings

import pytest
import torch
from conftest import SHARED_DATA, decode_small

import dlm_decode
from dlm_decode.cli import main
from dlm_decode.models import compiled
from dlm_decode.models.common import EAGER

pytestmark = pytest.mark.usefixtures("one_thread")

MIXED = [[5, 9, 17, 3, 40, 22], [7, 2, 33], [11, 30, 30, 8, 19], [4, 4]]  # mixed lengths: padding, compaction
ONE = [[5, 9, 17, 3, 40, 22]]
CASES = [  # (sampler, cache): threshold without a cache, with prefix and with dual cache; the fixed schedule
    ("threshold", "none"),
    ("threshold", "prefix"),
    ("threshold", "dual"),
    ("low_confidence", "none"),
    ("low_confidence", "dual"),
]


def _same(a, b) -> None:
    assert torch.equal(a.sequences, b.sequences)
    assert a.nfe == b.nfe and [r.nfe for r in a.rows] == [r.nfe for r in b.rows]
    assert a.token_forwards == b.token_forwards


@pytest.fixture
def fresh():
    """``fresh(model)``: the model without compiled pieces or a compile setting (the models are shared by the
    session); whatever the test leaves on it is removed afterwards and the earlier state put back."""
    kept = []
    keys = ("_compiled_layers", "layer_pieces")

    def clear(model):
        kept.append((model, {k: model.__dict__.pop(k) for k in keys if k in model.__dict__}))
        return model

    yield clear
    for model, before in kept:
        for k in keys:
            model.__dict__.pop(k, None)
        model.__dict__.update(before)


@pytest.fixture
def broken(monkeypatch):
    """Every compiled piece raises as a failed compile would (no C++ compiler); counts the attempts."""
    calls = {"n": 0}

    def fail(*args, **kwargs):
        calls["n"] += 1
        raise RuntimeError("simulated: InvalidCxxCompiler: No working C++ compiler found")

    monkeypatch.setattr(compiled, "_compiled", lambda mode, backend: (fail, fail))
    return calls


# ------------------------------------------------------------------------------------------------ fallback (fast)


@pytest.mark.parametrize("sampler,cache", CASES)
def test_failed_compile_falls_back_to_the_eager_tokens_with_one_warning(tiny_model, sampler, cache, fresh, broken):
    fresh(tiny_model)
    eager = decode_small(tiny_model, MIXED, sampler, cache)
    with pytest.warns(RuntimeWarning, match="torch.compile of the decoding forward failed.*decoding eagerly") as rec:
        out = decode_small(tiny_model, MIXED, sampler, cache, compile=True)
    assert len([w for w in rec if issubclass(w.category, RuntimeWarning)]) == 1
    _same(out, eager)
    pieces = tiny_model.__dict__["_compiled_layers"]["default"]
    assert "InvalidCxxCompiler" in pieces.error
    assert broken["n"] == 1  # the first piece failed; nothing compiled is tried again
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second call neither warns nor retries
        again = decode_small(tiny_model, MIXED, sampler, cache, compile=True)
    _same(again, eager)
    assert broken["n"] == 1
    assert "layer_pieces" not in tiny_model.__dict__  # the call's setting ends with it


def test_failed_torch_compile_itself_falls_back(llada, fresh, monkeypatch):
    """``torch.compile`` raising where it is called (an unsupported Python, say) is a failure like any other."""
    fresh(llada)
    compiled._compiled.cache_clear()

    def unsupported(*args, **kwargs):
        raise RuntimeError("simulated: torch.compile is not supported on this Python")

    monkeypatch.setattr(torch, "compile", unsupported)
    eager = decode_small(llada, ONE, "threshold", "dual")
    with pytest.warns(RuntimeWarning, match="not supported on this Python"):
        out = decode_small(llada, ONE, "threshold", "dual", compile=True)
    _same(out, eager)
    compiled._compiled.cache_clear()  # no wrapper built under the patch outlives the test


def test_bad_compile_values_fail_before_any_work(llada):
    for bad in ("reduce-overhead", "max-autotune", "fast", 1):
        with pytest.raises(ValueError, match="compile must be True, False or one of"):
            dlm_decode.generate(llada, ONE, gen_length=8, compile=bad)
    assert compiled.resolve_mode(True) == "default" and compiled.resolve_mode(False) is None
    assert compiled.resolve_mode("max-autotune-no-cudagraphs") == "max-autotune-no-cudagraphs"


def test_set_compile_is_the_models_default_and_generate_overrides_it(llada, fresh, broken):
    fresh(llada)
    pieces = compiled.set_compile(llada, True)
    assert llada.layer_pieces is pieces and isinstance(pieces, compiled.CompiledLayers)
    decode_small(llada, ONE, "threshold", "none", compile=False)  # eager for this call: no compile attempted
    assert broken["n"] == 0 and llada.layer_pieces is pieces
    with pytest.warns(RuntimeWarning, match="decoding eagerly"):
        decode_small(llada, ONE, "threshold", "none")  # None: the model's setting
    assert broken["n"] == 1 and llada.layer_pieces is pieces
    assert compiled.set_compile(llada, False) is EAGER and llada.layer_pieces is EAGER


def test_training_runs_the_eager_pieces(llada, fresh, broken):
    """With gradients on, the compiled pieces are never tried (``recipes/train_demo`` calls ``hidden_states``)."""
    fresh(llada)
    compiled.set_compile(llada, True)
    ids = torch.tensor([[5, 9, 17, 3]])
    with torch.enable_grad():
        llada.hidden_states(ids, torch.arange(4)[None])
    assert broken["n"] == 0


def test_cli_generate_compile_flag(llada_dir, capsys, broken):
    argv = ["generate", str(llada_dir), "--input-ids", "5,6,7", "--sampler", "threshold", "--cache", "dual"]
    argv += ["--gen-length", "16", "--block-length", "8", "--json"]
    assert main(argv) == 0
    eager = json.loads(capsys.readouterr().out)
    with pytest.warns(RuntimeWarning, match="decoding eagerly"):
        assert main([*argv, "--compile"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rows"][0]["generated_ids"] == eager["rows"][0]["generated_ids"] and out["nfe"] == eager["nfe"]
    with pytest.raises(SystemExit):  # argparse: CUDA-graph modes are no choice
        main([*argv, "--compile", "reduce-overhead"])


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="official ParallelBench data not present")
def test_cli_parallelbench_compile_flag(tok_dir, capsys, broken):
    argv = ["parallelbench", "--model", str(tok_dir), "--data", str(SHARED_DATA), "--limit", "1"]
    argv += ["--tasks", "waiting_line/copy", "--cache", "dual", "--json"]
    assert main(argv) == 0
    eager = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    with pytest.warns(RuntimeWarning, match="decoding eagerly"):
        assert main([*argv, "--compile"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["compile"] == "default" and eager["compile"] is None
    assert out["tasks"][0]["nfe"] == eager["tasks"][0]["nfe"] and out["tasks"][0]["score"] == eager["tasks"][0]["score"]


# ------------------------------------------------------------------------------------------------ dynamo capture (fast)


@pytest.mark.parametrize("sampler,cache", [("threshold", "none"), ("threshold", "dual"), ("low_confidence", "prefix")])
def test_dynamo_captures_each_piece_in_one_graph(tiny_model, sampler, cache, fresh):
    """Dynamo's ``eager`` backend: the pieces trace with ``fullgraph=True`` (a graph break would raise and fall back,
    so ``error`` stays None only without one) and the tokens are the eager path's."""
    fresh(tiny_model)
    eager = decode_small(tiny_model, MIXED, sampler, cache)
    pieces = compiled.CompiledLayers(backend="eager")
    tiny_model.layer_pieces = pieces  # what ``set_compile`` does, with the tracing-only backend
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        out = decode_small(tiny_model, MIXED, sampler, cache)
    assert pieces.error is None
    _same(out, eager)


# ------------------------------------------------------------------------------------------------ inductor (slow)


@functools.cache
def _inductor_unavailable() -> str | None:
    """Why inductor cannot compile on this machine (None: it can), from a one-line function."""
    try:
        f = torch.compile(lambda x: torch.nn.functional.silu(x) * 2 + 1, dynamic=True, fullgraph=True)
        x = torch.randn(3, 5)
        torch.testing.assert_close(f(x), torch.nn.functional.silu(x) * 2 + 1)
    except Exception as e:  # no C++ compiler, an unsupported platform
        return f"inductor cannot compile here: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return None


@pytest.mark.slow
@pytest.mark.parametrize("prompts", [ONE, MIXED], ids=["batch1", "mixed4"])
@pytest.mark.parametrize("sampler,cache", CASES)
def test_inductor_compiled_decodes_the_eager_tokens(tiny_model, sampler, cache, prompts, fresh):
    reason = _inductor_unavailable()
    if reason:
        pytest.skip(reason)
    fresh(tiny_model)
    eager = decode_small(tiny_model, prompts, sampler, cache)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a fallback would warn: this test is about the compiled path
        out = decode_small(tiny_model, prompts, sampler, cache, compile=True)
    assert tiny_model.__dict__["_compiled_layers"]["default"].error is None
    _same(out, eager)
