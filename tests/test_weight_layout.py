"""The decode weight layout (``models/layout.py``) and the roll form of RoPE change no value and no token.

No wall-clock assertions: speed is ``benchmarks/bench_weight_layout.py`` and ``bench_speed.py --versus-reference``.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import SHARED_DATA, load_script

import dlm_decode
from dlm_decode.models.common import apply_rope, rope_cos_sin
from dlm_decode.models.layout import is_column_major, layout_of, resolve_layout, set_layout
from dlm_decode.parallelbench.runner import load_tasks, run_task

pytestmark = pytest.mark.usefixtures("one_thread")


def _linears(model):
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear)]


def test_set_layout_moves_memory_not_values(llada_dir):
    model = dlm_decode.load_model(llada_dir, tokenizer=False, layout="official")[0]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert layout_of(model) == "official"
    n = len(_linears(model))
    assert set_layout(model, "decode") == n and layout_of(model) == "decode"
    assert all(is_column_major(m.weight) and not m.weight.is_contiguous() for m in _linears(model))
    assert set_layout(model, "decode") == 0  # already there
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert set_layout(model, "official") == n and layout_of(model) == "official"
    assert all(m.weight.is_contiguous() for m in _linears(model))
    with pytest.raises(ValueError, match="layout must be one of"):
        set_layout(model, "columns")


def test_load_model_chooses_the_layout_from_device_and_dtype(llada_dir, tmp_path):
    assert resolve_layout("auto", "cpu", torch.float32) == "decode"
    assert resolve_layout("auto", "cpu", torch.bfloat16) == "official"  # measured slower there
    assert resolve_layout("auto", "cuda", torch.float32) == "official"
    assert layout_of(dlm_decode.load_model(llada_dir, tokenizer=False)[0]) == "decode"
    assert layout_of(dlm_decode.load_model(llada_dir, tokenizer=False, dtype="bfloat16")[0]) == "official"
    assert layout_of(dlm_decode.load_model(llada_dir, tokenizer=False, layout="official")[0]) == "official"
    # a bad layout is refused before any weight is read (the weights here are damaged)
    (tmp_path / "config.json").write_text((llada_dir / "config.json").read_text())
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match=r"layout must be one of \('auto', 'decode', 'official'\), got 'rows'"):
        dlm_decode.load_model(tmp_path, tokenizer=False, layout="rows")


def test_decode_layout_model_saves_the_official_tensors(llada_dir, tmp_path):
    model = dlm_decode.load_model(llada_dir, tokenizer=False)[0]
    assert layout_of(model) == "decode"
    model.save_pretrained(tmp_path)
    again = dlm_decode.load_model(tmp_path, tokenizer=False, layout="official")[0]
    a, b = model.state_dict(), again.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_decode_layout_logits_match_official_layout(tiny_model):
    model = tiny_model
    ids = torch.tensor([[5, 9, 17, 3, 40, 22, 7, 2, 33, 12, 4, 8]])
    set_layout(model, "official")
    try:
        ref = model(ids).logits
        set_layout(model, "decode")
        out = model(ids).logits
    finally:
        set_layout(model, "decode")  # the session fixture's layout, as load_model gave it
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert out.abs().max() > 0.1  # the logits are not trivially equal


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_roll_form_equals_rotate_half_bitwise(dtype):
    """``apply_rope`` (roll, sign folded into sin) gives the bits of the textbook rotate-half formula."""
    g = torch.Generator().manual_seed(0)
    pos = torch.tensor([[0, 1, 5, 63, 64, 300, 4095]])
    cos, sin = rope_cos_sin(pos, 32, 500000.0)  # [1, 1, 7, 32]
    assert torch.equal(sin[..., :16], -sin[..., 16:])  # the sign lives in the first half
    c, s = cos[..., :16], sin[..., 16:]  # the plain tables
    plain_cos, plain_sin = torch.cat([c, c], -1), torch.cat([s, s], -1)
    x = (torch.randn(1, 4, 7, 32, generator=g) * 3).to(dtype)

    def rotate_half(t):
        return torch.cat([-t[..., 16:], t[..., :16]], -1)

    for full in (True, False):
        if full:
            xf = x.float()
            want = (xf * plain_cos + rotate_half(xf) * plain_sin).to(dtype)
        else:
            pc, ps = plain_cos.to(dtype), plain_sin.to(dtype)
            want = x * pc + rotate_half(x) * ps
        got = apply_rope(x, cos, sin, full)
        assert got.dtype == dtype and torch.equal(got, want)
    assert not torch.equal(apply_rope(x, cos, sin, True), x)  # it did rotate


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="official ParallelBench data not present")
def test_demo_model_decodes_the_same_tokens_in_both_layouts():
    """The trained demo model on official samples, threshold + dual cache and one token per step without a cache:
    every output text and NFE equal in both layouts, and the answers solved (a real decode)."""
    model, tok = dlm_decode.load_model("demo-llada", layout="official")
    tasks = load_tasks(SHARED_DATA, ["waiting_line/copy", "waiting_line/reverse"], limit=4)
    runs = [{"sampler": "threshold", "cache": "dual"}, {}]
    outs = {}
    for layout in ("official", "decode"):
        set_layout(model, layout)
        assert layout_of(model) == layout
        outs[layout] = [run_task(model, tok, t, cfg, batch_size=4, progress=False) for t in tasks for cfg in runs]
    for a, b in zip(outs["official"], outs["decode"], strict=True):
        assert [o["text"] for o in a.outputs] == [o["text"] for o in b.outputs] and a.nfe == b.nfe
    assert all(r.score >= 75 for r in outs["decode"]), [r.score for r in outs["decode"]]


def test_bench_weight_layout_reports_both_layouts_and_ends_in_one_json_line(capsys):
    bench = load_script("benchmarks/bench_weight_layout.py")
    torch.manual_seed(0)
    x, w = torch.randn(1, 32, 64), torch.randn(48, 64)
    r = bench.compare(x, w, repeats=1, calls=2)
    col = w.t().contiguous().t()
    assert r["bitwise_equal"] is torch.equal(torch.nn.functional.linear(x, w), torch.nn.functional.linear(x, col))
    assert r["calls"] == 2 and r["row_us"] > 0 and r["column_us"] > 0
    out = bench.main(["--rows", "2", "--repeats", "1", "--calls", "1", "--threads", "1"])
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last == out and last["torch_threads"] == 1
    assert [(r["rows"], r["what"]) for r in last["results"]] == [(2, w) for w in ("qkvo", "gate_up", "down", "lm_head")]
    for bad in (["--sizes", "huge"], ["--rows", "a"], ["--dtypes", "int8"]):
        with pytest.raises(SystemExit):
            bench.main(bad)


def test_a_weight_tied_to_an_embedding_keeps_its_layout():
    """An LM head sharing the input embedding's table is left row-major (its row gathers want that); the others move."""
    from torch import nn

    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb, self.proj, self.head = nn.Embedding(50, 16), nn.Linear(16, 16), nn.Linear(16, 50, bias=False)
            self.head.weight = self.emb.weight

    model = Tied()
    assert set_layout(model, "decode") == 1
    assert (
        is_column_major(model.proj.weight)
        and model.emb.weight.is_contiguous()
        and model.head.weight is model.emb.weight
    )
    assert layout_of(model) == "decode"
