"""Decoding on CUDA through the Triton kernel: every cache, the tiny LLaDA and Dream checkpoints, fp32 and bf16.

The kernel's unit tests (``test_kernels.py``) check single attention calls; these check it inside the decode loop,
with the key indexes and masks the cache policies really build (padded rows, gathered windows, partial stores).
Reference: the same decode on the same GPU with every attention forced through the PyTorch twin. All tests carry
``-m gpu`` and skip themselves without CUDA or Triton.
"""

from __future__ import annotations

import functools

import pytest
import torch

import dlm_decode
import dlm_decode.models.common as common
from dlm_decode.cache import CACHES
from dlm_decode.kernels.dispatch import masked_attention

try:
    import triton  # noqa: F401
except ImportError:
    triton = None

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(triton is None, reason="triton is not installed"),
]

PROMPTS = [[5, 9, 17, 3, 40, 22], [7, 2, 33], [11, 30, 30, 8, 19]]  # mixed lengths: left padding + key mask


def _decode(model, sampler, cache, backend, monkeypatch, **kw):
    """One generate call with every attention of the model sent to ``backend``."""
    with monkeypatch.context() as m:
        m.setattr(common, "masked_attention", functools.partial(masked_attention, backend=backend))
        return dlm_decode.generate(
            model, PROMPTS, sampler=sampler, cache=cache, gen_length=32, block_length=8, temperature=0.0, **kw
        )


@pytest.fixture(scope="module", params=["llada", "dream"])
def cuda_model(request, llada_dir, dream_dir):
    path = {"llada": llada_dir, "dream": dream_dir}[request.param]
    return dlm_decode.load_model(path, device="cuda")[0]


@pytest.mark.parametrize("sampler", ["low_confidence", "threshold"])
# sub_block runs with the fast_dllm_v2 sampler only (Fast-dLLM v2), not on these LLaDA / Dream models
@pytest.mark.parametrize("cache", sorted(c for c in CACHES if not CACHES[c].samplers))
def test_fp32_decode_with_kernel_matches_the_twin(cuda_model, sampler, cache, monkeypatch):
    kw = {"steps": 32} if sampler == "low_confidence" else {}
    fast = _decode(cuda_model, sampler, cache, "triton", monkeypatch, **kw)
    twin = _decode(cuda_model, sampler, cache, "torch", monkeypatch, **kw)
    assert all(r.error is None for r in fast.rows)
    assert torch.equal(fast.sequences.cpu(), twin.sequences.cpu())
    assert fast.nfe == twin.nfe


@pytest.mark.parametrize("cache", ["none", "dual", "window"])
def test_bf16_decode_with_kernel(llada_dir, cache, monkeypatch):
    """bf16: the kernel and the twin round differently, so tokens may split at near ties; nearly all must agree."""
    model = dlm_decode.load_model(llada_dir, device="cuda", dtype="bfloat16")[0]
    fast = _decode(model, "threshold", cache, "triton", monkeypatch)
    twin = _decode(model, "threshold", cache, "torch", monkeypatch)
    assert all(r.error is None for r in fast.rows)
    mask_id = model.mask_token_id
    assert not (fast.generated == mask_id).any()
    agree = (fast.generated.cpu() == twin.generated.cpu()).float().mean().item()
    assert agree >= 0.9, f"only {agree:.2%} of bf16 tokens agree between the kernel and the twin"


def test_auto_backend_takes_the_kernel_in_decoding(llada_dir, monkeypatch):
    """``backend="auto"`` (what the models use) sends CUDA attention to the Triton kernel, not the twin."""
    from dlm_decode.kernels import triton_attention

    model = dlm_decode.load_model(llada_dir, device="cuda")[0]
    calls = []
    original = triton_attention.masked_attention_triton

    def counting(*a, **k):
        calls.append(1)
        return original(*a, **k)

    monkeypatch.setattr(triton_attention, "masked_attention_triton", counting)
    dlm_decode.generate(model, PROMPTS, sampler="threshold", cache="dual", gen_length=16, block_length=8)
    assert calls, "no attention call reached the Triton kernel on CUDA"
