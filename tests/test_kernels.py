"""Tests for the masked-attention kernel, its PyTorch twin and the backend dispatch.

Run: ``python -m pytest tests/test_kernels.py -q`` (CPU, Triton interpreter; about half a minute). GPU checks,
bf16 included (wrong under the interpreter), carry ``-m gpu`` and skip themselves without CUDA.

Kernel vs twin uses FlashAttention's rule: ``max|kernel - ref_fp32| <= 2 * max|ref_lowprecision - ref_fp32| + 1e-5``
where ``ref_fp32`` is the twin on fp32 upcasts.
"""

from __future__ import annotations

import itertools
import math
import os

import pytest
import torch

from dlm_decode.kernels import dispatch
from dlm_decode.kernels.dispatch import check_triton_backend, masked_attention
from dlm_decode.kernels.reference import attention_reference

# Without CUDA the kernel runs in Triton's interpreter, whose flag is read when the kernel is decorated (and again
# by Triton's lazy imports at launch): set it before the kernel module is imported and leave it set.
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
try:
    from dlm_decode.kernels import triton_attention
except ImportError:
    triton_attention = None

needs_triton = pytest.mark.skipif(triton_attention is None, reason="triton is not installed")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
MODES = ("plain", "mask", "index", "index+mask")


@pytest.fixture
def kernel_device() -> str:
    """Device the kernel tests run on; skip if a CPU run would not go through the interpreter."""
    if triton_attention is None:
        pytest.skip("triton is not installed")
    if torch.cuda.is_available():
        return "cuda"
    if type(triton_attention._masked_attention_fwd).__name__ != "InterpretedFunction":
        pytest.skip("kernel module was imported before TRITON_INTERPRET=1 was set")
    return "cpu"


def make_inputs(b, h, hk, n_q, s, d, dtype, mode, seed=0, device="cpu", n_index=None):
    """q, k, v and the key_index / key_mask kwargs for one mode; gathers repeat slots and are unsorted."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, n_q, d, generator=gen)
    k = torch.randn(b, hk, s, d, generator=gen)
    v = torch.randn(b, hk, s, d, generator=gen)
    kwargs = {}
    n_keys = s
    if "index" in mode:
        n_keys = s // 2 + 5 if n_index is None else n_index
        key_index = torch.randint(0, s, (b, n_keys), generator=gen)
        key_index[:, 1] = key_index[:, 0]  # a repeated slot
        key_index[:, 2], key_index[:, -1] = s - 1, 0  # last slot early, first slot last
        kwargs["key_index"] = key_index.to(device)
    if "mask" in mode:
        kwargs["key_mask"] = (torch.rand(b, n_keys, generator=gen) < 0.6).to(device)
    return *(t.to(device=device, dtype=dtype) for t in (q, k, v)), kwargs


def explicit_attention(q, k, v, key_mask=None, key_index=None, scale=None):
    """softmax(q k^T * scale + bias) v in float64, written out with indexing and an explicit GQA repeat."""
    q, k, v = q.double(), k.double(), v.double()
    if key_index is not None:
        k = torch.stack([k[i][:, key_index[i]] for i in range(k.shape[0])])
        v = torch.stack([v[i][:, key_index[i]] for i in range(v.shape[0])])
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ k.transpose(-1, -2) * scale  # [B, H, Q, N]
    if key_mask is not None:
        scores = scores.masked_fill(~key_mask[:, None, None, :], float("-inf"))
    probs = scores.softmax(-1).nan_to_num(0.0)  # a fully hidden row is NaN -> no keys -> zeros
    return probs @ v


def assert_matches_twin(out, q, k, v, **kwargs):
    """FlashAttention's 2x rule against the twin, plus dtype/shape/NaN checks."""
    assert out.dtype == q.dtype and out.shape == q.shape
    assert not torch.isnan(out).any()
    ref32 = attention_reference(q.float(), k.float(), v.float(), **kwargs)
    ref_lp = attention_reference(q, k, v, **kwargs).float()
    err = (out.float() - ref32).abs().max().item()
    budget = 2 * (ref_lp - ref32).abs().max().item() + 1e-5
    assert err <= budget, f"max error {err:.3e} > budget {budget:.3e}"


# ---------------------------------------------------------------- the twin against an explicit softmax


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (6, 1)])
def test_twin_matches_explicit_float64(mode, heads):
    q, k, v, kwargs = make_inputs(2, *heads, 7, 33, 16, torch.float64, mode)
    if "mask" in mode:
        kwargs["key_mask"][1] = False  # a row with no visible key
    torch.testing.assert_close(attention_reference(q, k, v, **kwargs), explicit_attention(q, k, v, **kwargs))
    out32 = attention_reference(q.float(), k.float(), v.float(), scale=0.3, **kwargs)
    torch.testing.assert_close(out32.double(), explicit_attention(q, k, v, scale=0.3, **kwargs), atol=1e-5, rtol=0)


# ---------------------------------------------------------------- kernel vs twin (interpreter on CPU)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize(
    "n_q, s, heads, mode", list(itertools.product([1, 7, 32], [17, 97, 130], [(4, 4), (4, 2)], MODES))
)
def test_kernel_matches_twin(kernel_device, dtype, n_q, s, heads, mode):
    q, k, v, kwargs = make_inputs(2, *heads, n_q, s, 64, dtype, mode, seed=s + n_q, device=kernel_device)
    assert_matches_twin(triton_attention.masked_attention_triton(q, k, v, **kwargs), q, k, v, **kwargs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("d", [16, 40, 64, 80, 128])
def test_kernel_head_dims(kernel_device, dtype, d):
    q, k, v, kwargs = make_inputs(2, 4, 2, 7, 97, d, dtype, "index+mask", device=kernel_device)
    assert_matches_twin(triton_attention.masked_attention_triton(q, k, v, **kwargs), q, k, v, **kwargs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("mode", ["mask", "index+mask"])
def test_kernel_hidden_rows_give_zeros(kernel_device, dtype, mode):
    q, k, v, kwargs = make_inputs(3, 4, 2, 7, 130, 64, dtype, mode, device=kernel_device)
    mask = kwargs["key_mask"]
    mask[0] = False  # no visible key: zeros
    mask[1, :70] = False  # the whole first key tile hidden, later tiles visible: the -inf max carries over
    out = triton_attention.masked_attention_triton(q, k, v, **kwargs)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert_matches_twin(out, q, k, v, **kwargs)


def test_kernel_never_reads_hidden_or_wide_gathers(kernel_device):
    """NaN in hidden cache slots stays out; W > S gathers (heavy repeats) work; a custom scale is honoured."""
    q, k, v, kwargs = make_inputs(2, 4, 2, 5, 17, 64, torch.float32, "index+mask", device=kernel_device, n_index=40)
    hidden_slots = torch.ones(2, 17, dtype=torch.bool, device=kernel_device)
    for b in range(2):
        hidden_slots[b, kwargs["key_index"][b][kwargs["key_mask"][b]]] = False
    k_nan = k.masked_fill(hidden_slots[:, None, :, None], float("nan"))
    out = triton_attention.masked_attention_triton(q, k_nan, v, scale=0.2, **kwargs)
    assert_matches_twin(out, q, k, v, scale=0.2, **kwargs)


def test_kernel_strided_views(kernel_device):
    """KV caches are often [B, S, Hk, D] views into a longer buffer: strides, not copies."""
    q, k, v, kwargs = make_inputs(2, 4, 2, 7, 97, 64, torch.float32, "index+mask", device=kernel_device)
    k_buf = torch.zeros(2, 120, 2, 64, device=kernel_device)
    v_buf = torch.zeros(2, 120, 2, 64, device=kernel_device)
    k_buf[:, :97] = k.transpose(1, 2)
    v_buf[:, :97] = v.transpose(1, 2)
    k_view, v_view = k_buf[:, :97].transpose(1, 2), v_buf[:, :97].transpose(1, 2)
    q_view = q.transpose(1, 2).contiguous().transpose(1, 2)
    assert not k_view.is_contiguous() and not q_view.is_contiguous()
    out = triton_attention.masked_attention_triton(q_view, k_view, v_view, **kwargs)
    assert_matches_twin(out, q, k, v, **kwargs)


def test_kernel_empty_inputs(kernel_device):
    q, k, v, _ = make_inputs(1, 2, 2, 3, 9, 16, torch.float32, "plain", device=kernel_device)
    assert triton_attention.masked_attention_triton(q[:, :, :0], k, v).shape == (1, 2, 0, 16)
    no_keys = torch.empty(1, 0, dtype=torch.long, device=kernel_device)
    assert torch.equal(triton_attention.masked_attention_triton(q, k, v, key_index=no_keys), torch.zeros_like(q))


@needs_triton
def test_kernel_rejects_bad_inputs():
    q, k, v, _ = make_inputs(1, 4, 2, 3, 9, 160, torch.float32, "plain")
    with pytest.raises(ValueError, match=r"head dim 160 not supported.*1\.\.128"):
        triton_attention.masked_attention_triton(q, k, v)
    q, k, v, _ = make_inputs(1, 4, 3, 3, 9, 16, torch.float32, "plain")
    with pytest.raises(ValueError, match="multiple of kv heads"):
        triton_attention.masked_attention_triton(q, k, v)
    q, k, v, _ = make_inputs(1, 4, 2, 3, 9, 16, torch.float32, "plain")
    with pytest.raises(ValueError, match="one dtype"):
        triton_attention.masked_attention_triton(q, k.half(), v)
    with pytest.raises(ValueError, match="key_mask must be bool"):
        triton_attention.masked_attention_triton(q, k, v, key_mask=torch.ones(1, 8, dtype=torch.bool))
    with pytest.raises(ValueError, match="key_index must be"):
        triton_attention.masked_attention_triton(q, k, v, key_index=torch.zeros(2, 4, dtype=torch.long))


# ---------------------------------------------------------------- dispatch


def test_dispatch_auto_on_cpu_is_the_twin():
    q, k, v, kwargs = make_inputs(2, 4, 2, 7, 33, 16, torch.float32, "index+mask")
    expected = attention_reference(q, k, v, **kwargs)
    assert torch.equal(masked_attention(q, k, v, **kwargs), expected)
    assert torch.equal(masked_attention(q, k, v, backend="torch", **kwargs), expected)


def test_dispatch_rejects_unknown_backend():
    q, k, v, _ = make_inputs(1, 2, 2, 3, 9, 16, torch.float32, "plain")
    with pytest.raises(ValueError, match="'auto', 'torch', 'triton'"):
        masked_attention(q, k, v, backend="flash")


@needs_triton
def test_dispatch_triton_on_cpu_needs_the_interpreter():
    q = torch.zeros(1, 2, 3, 16)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        check_triton_backend(q, environ={})
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        check_triton_backend(q, environ={"TRITON_INTERPRET": "0"})
    assert check_triton_backend(q, environ={"TRITON_INTERPRET": "1"}) is triton_attention


def test_dispatch_without_triton(monkeypatch):
    monkeypatch.setattr(dispatch, "_triton_module", lambda: None)
    q, k, v, kwargs = make_inputs(1, 4, 2, 3, 9, 16, torch.float32, "mask")
    with pytest.raises(RuntimeError, match="needs Triton"):
        masked_attention(q, k, v, backend="triton", **kwargs)
    assert torch.equal(masked_attention(q, k, v, **kwargs), attention_reference(q, k, v, **kwargs))


def test_dispatch_triton_backend_runs_the_kernel(kernel_device, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    q, k, v, kwargs = make_inputs(2, 4, 2, 7, 33, 40, torch.float16, "index+mask", device=kernel_device)
    out = masked_attention(q, k, v, backend="triton", **kwargs)
    assert torch.equal(out, triton_attention.masked_attention_triton(q, k, v, **kwargs))
    assert_matches_twin(out, q, k, v, **kwargs)


# ---------------------------------------------------------------- GPU only


def naive_low_precision(q, k, v, key_mask=None, key_index=None, scale=None):
    """FlashAttention's ``attention_ref(upcast=False)``: matmuls in the input dtype, softmax in fp32."""
    if key_index is not None:
        k = torch.stack([k[i][:, key_index[i]] for i in range(k.shape[0])])
        v = torch.stack([v[i][:, key_index[i]] for i in range(v.shape[0])])
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q * scale) @ k.transpose(-1, -2)
    if key_mask is not None:
        scores = scores.masked_fill(~key_mask[:, None, None, :], float("-inf"))
    probs = scores.float().softmax(-1).nan_to_num(0.0).to(q.dtype)
    return probs @ v


@pytest.mark.gpu
@needs_cuda
@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("n_q, s, heads, d", [(32, 1025, (32, 8), 128), (97, 2048, (16, 16), 64), (1, 300, (8, 2), 80)])
def test_kernel_gpu(dtype, mode, n_q, s, heads, d):
    q, k, v, kwargs = make_inputs(2, *heads, n_q, s, d, dtype, mode, device="cuda")
    out = triton_attention.masked_attention_triton(q, k, v, **kwargs)
    assert out.dtype == dtype and not torch.isnan(out).any()
    ref32 = attention_reference(q.float(), k.float(), v.float(), **kwargs)
    ref_lp = naive_low_precision(q, k, v, **kwargs).float() if dtype != torch.float32 else ref32
    err = (out.float() - ref32).abs().max().item()
    budget = 2 * (ref_lp - ref32).abs().max().item() + 1e-5
    assert err <= budget, f"max error {err:.3e} > budget {budget:.3e}"


@pytest.mark.gpu
@needs_cuda
@needs_triton
def test_dispatch_auto_on_cuda_uses_the_kernel():
    q, k, v, kwargs = make_inputs(2, 4, 2, 7, 130, 64, torch.bfloat16, "index+mask", device="cuda")
    out = masked_attention(q, k, v, **kwargs)
    assert torch.equal(out, triton_attention.masked_attention_triton(q, k, v, **kwargs))


def test_dispatch_triton_refuses_inputs_that_need_gradients(monkeypatch):
    # the kernel has no backward: a training forward through it would silently drop the attention's gradients
    monkeypatch.setattr(dispatch, "_triton_module", lambda: triton_attention)
    q, k, v, kwargs = make_inputs(1, 2, 2, 3, 9, 16, torch.float32, "mask")
    q.requires_grad_(True)
    with pytest.raises(ValueError, match="no backward"):
        masked_attention(q, k, v, backend="triton", **kwargs)


@pytest.mark.gpu
@needs_cuda
@needs_triton
def test_dispatch_auto_on_cuda_trains_through_the_twin():
    """With gradients wanted, ``auto`` on CUDA takes the PyTorch path: every input gets the twin's gradient."""
    q, k, v, kwargs = make_inputs(2, 4, 2, 7, 130, 64, torch.float32, "index+mask", device="cuda")
    grads = []
    for fn in (masked_attention, attention_reference):
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        out = fn(*leaves, **kwargs)
        out.square().sum().backward()
        grads.append([t.grad for t in leaves])
    for got, want in zip(*grads, strict=True):
        assert got is not None and got.abs().sum() > 0
        torch.testing.assert_close(got, want)
    with torch.no_grad():  # decoding still reaches the kernel
        out = masked_attention(q, k, v, **kwargs)
    assert torch.equal(out, triton_attention.masked_attention_triton(q, k, v, **kwargs))
