"""Triton kernel for masked, gathered, bidirectional GQA attention; its specification is ``reference.py``.

Queries at a subset of canvas slots q [B, H, Q, D] attend to keys/values k, v [B, Hk, S, D], optionally
gathered through ``key_index`` [B, W] and hidden by ``key_mask`` ([B, S], or [B, W] with an index):

    out[b, h, i] = sum_w softmax_w(q[b,h,i] . k[b, h//g, idx[b,w]] * scale + bias[b,w]) v[b, h//g, idx[b,w]]

Design (FlashAttention-2 forward, no causal mask):
- One program per (tile of BLOCK_M query rows, batch row b, kv head). The rows of a tile are the
  ``g = H / Hk`` query heads that share the kv head, flattened with the queries (row = j * Q + i), so each
  K/V tile is loaded once for the whole GQA group and ``tl.dot`` gets M = g * Q rows even when Q is small.
- The program walks the keys in tiles of BLOCK_N; a gathered tile loads its slot ids from ``key_index`` and
  reads K/V rows through them (any order, repeats allowed). Hidden and out-of-range keys are never loaded
  (so garbage in unused cache slots can't leak in) and get score -inf.
- Online softmax in base 2 with fp32 accumulators; a row that has seen only hidden keys keeps max = -inf,
  which is replaced by 0 before exponentiating (no ``-inf - -inf = NaN``), and its final normaliser 0 is
  replaced by 1, so a query with no visible key returns zeros.
- fp32 inputs use IEEE ``tl.dot`` (no TF32) to match the fp32 twin; fp16/bf16 inputs run the tensor cores
  with P cast to the value dtype, as FlashAttention does. The output has the input dtype.
- Head dims 1..128 are padded to a power of two >= 16 (masked loads), so D = 40 or 80 work.

``key_index`` values must lie in [0, S); they are not checked (that would need a device sync).
Import this module only where Triton is installed; ``dispatch.masked_attention`` does so lazily. To run on CPU
tensors set ``TRITON_INTERPRET=1`` before importing it (the flag is read when the kernel is decorated).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

MAX_HEAD_DIM = 128
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# Reductions and zeros go through core builtins (tl.reduce, tl.full), not tl.max/tl.sum/tl.zeros: those are @jit
# functions decorated when triton is first imported (often by torch._dynamo, before TRITON_INTERPRET is set), and
# an interpreted kernel can't call compiled-mode jit functions. The combine functions are the ones tl.max/tl.sum
# use (same GPU code), and the interpreter recognises them and reduces with numpy instead of element by element.
@triton.jit
def _own_max_combine(a, b):
    return tl.maximum(a, b)


@triton.jit
def _own_sum_combine(a, b):
    return a + b


_max_combine = getattr(tl.standard, "_elementwise_max", _own_max_combine)
_sum_combine = getattr(tl.standard, "_sum_combine", _own_sum_combine)


@triton.jit
def _masked_attention_fwd(
    Q, K, V, Out, KeyIndex, KeyMask,
    qk_scale,  # scale * log2(e): the softmax runs in base 2
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    stride_ib, stride_in, stride_mb, stride_mn,
    HK, N_Q, N_KEYS, HEAD_DIM,
    GROUP: tl.constexpr, HAS_INDEX: tl.constexpr, HAS_MASK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // HK).to(tl.int64)  # int64: offsets of large caches overflow int32
    hk = (pid_bh % HK).to(tl.int64)

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # row = j * N_Q + i over the GROUP heads of kv head hk
    row_ok = rows < GROUP * N_Q
    head = hk * GROUP + rows // N_Q
    qi = rows % N_Q
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    io_mask = row_ok[:, None] & d_ok[None, :]

    q_ptrs = Q + b * stride_qb + head[:, None] * stride_qh + qi[:, None] * stride_qm + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=io_mask, other=0.0)  # [M, D]

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)
    acc = tl.full([BLOCK_M, BLOCK_D], 0.0, tl.float32)
    k_base = K + b * stride_kb + hk * stride_kh
    v_base = V + b * stride_vb + hk * stride_vh

    for start in range(0, N_KEYS, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        key_ok = offs_n < N_KEYS
        if HAS_INDEX:
            slot = tl.load(KeyIndex + b * stride_ib + offs_n * stride_in, mask=key_ok, other=0).to(tl.int64)
        else:
            slot = offs_n.to(tl.int64)
        if HAS_MASK:
            visible = tl.load(KeyMask + b * stride_mb + offs_n * stride_mn, mask=key_ok, other=0)
            key_ok = key_ok & (visible != 0)
        kv_mask = key_ok[:, None] & d_ok[None, :]
        k = tl.load(k_base + slot[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision="ieee")  # [M, N] fp32
        qk = tl.where(key_ok[None, :], qk * qk_scale, float("-inf"))

        m_new = tl.maximum(m_i, tl.reduce(qk, 1, _max_combine))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no visible key yet
        p = tl.exp2(qk - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.reduce(p, 1, _sum_combine)
        v = tl.load(v_base + slot[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        m_i = m_new

    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # l == 0: no visible key -> zeros
    o_ptrs = Out + b * stride_ob + head[:, None] * stride_oh + qi[:, None] * stride_om + offs_d[None, :] * stride_od
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=io_mask)


def supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the kernel handles these inputs (dtype and head dim); ``dispatch`` falls back to the twin if not."""
    d = q.shape[-1]
    return q.dtype in SUPPORTED_DTYPES and q.dtype == k.dtype == v.dtype and 1 <= d <= MAX_HEAD_DIM


def _validate(q, k, v, key_mask, key_index) -> int:
    """Raise ValueError on inputs the kernel can't take; return the number of attended keys (S or W)."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be 4-D [B, H, Q, D] / [B, Hk, S, D], got {q.shape}, {k.shape}, {v.shape}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    bsz, h, _, d = q.shape
    if k.shape[0] != bsz or k.shape[3] != d:
        raise ValueError(f"k {tuple(k.shape)} does not match q {tuple(q.shape)} in batch or head dim")
    if h % k.shape[1] != 0:
        raise ValueError(f"query heads ({h}) must be a multiple of kv heads ({k.shape[1]})")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"q, k, v must share one dtype among {SUPPORTED_DTYPES}, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not 1 <= d <= MAX_HEAD_DIM:
        raise ValueError(f"head dim {d} not supported: the Triton kernel takes head dims 1..{MAX_HEAD_DIM}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    n_keys = k.shape[2]
    if key_index is not None:
        if key_index.dim() != 2 or key_index.shape[0] != bsz:
            raise ValueError(f"key_index must be [B, W] with B={bsz}, got {tuple(key_index.shape)}")
        if key_index.dtype.is_floating_point or key_index.dtype == torch.bool:
            raise ValueError(f"key_index must hold integers, got {key_index.dtype}")
        n_keys = key_index.shape[1]
    if key_mask is not None:
        if key_mask.dtype != torch.bool or tuple(key_mask.shape) != (bsz, n_keys):
            raise ValueError(
                f"key_mask must be bool [B, {'W' if key_index is not None else 'S'}] = [{bsz}, {n_keys}], "
                f"got {key_mask.dtype} {tuple(key_mask.shape)}"
            )
    return n_keys


def _block_d(head_dim: int) -> int:
    """Head dim padded to a power of two >= 16 (tl.dot's minimum); loads past ``head_dim`` are masked."""
    return max(16, triton.next_power_of_2(head_dim))


@dataclass(frozen=True)
class KernelConfig:
    """Launch parameters; ``block_m`` rows (GQA heads x queries) and ``block_n`` keys per tile, both >= 16."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int = 2


def default_config(rows: int, head_dim: int, dtype: torch.dtype, gathered: bool = False) -> KernelConfig:
    """The launch heuristic for ``rows`` = g * Q query rows (``benchmarks/tune_attention.py`` measures others).

    fp32 runs IEEE FMA dots (the exact path, not the fast one): smaller tiles keep its shared memory under 64 KiB.
    """
    block_d = _block_d(head_dim)
    wide = dtype == torch.float32
    cap = (64 if block_d <= 64 else 32) if wide else (128 if block_d <= 64 else 64)
    block_m = min(cap, max(16, triton.next_power_of_2(rows)))
    block_n = 32 if wide else 64
    num_warps = 4 if block_m * block_d <= 64 * 128 else 8
    # 16-bit without a gather: a third pipeline stage was 4-20% faster with the same tiles on an H100 (dual-b8,
    # dream-dual-b8, full-b8 in record gpu-h100/tune.log, commit 49d62a1); with a 1024-key gather it was slower
    return KernelConfig(block_m, block_n, num_warps, num_stages=3 if not (wide or gathered) else 2)


def masked_attention_triton(
    q: torch.Tensor,  # [B, H, Q, D]
    k: torch.Tensor,  # [B, Hk, S, D]
    v: torch.Tensor,  # [B, Hk, S, D]
    *,
    key_mask: torch.Tensor | None = None,  # [B, S] or [B, W] bool, True = visible
    key_index: torch.Tensor | None = None,  # [B, W] integer slot ids into S
    scale: float | None = None,
    config: KernelConfig | None = None,  # launch parameters; None: ``default_config``
) -> torch.Tensor:  # [B, H, Q, D], dtype of q
    """The kernel behind ``masked_attention(backend="triton")``; same semantics as ``attention_reference``."""
    n_keys = _validate(q, k, v, key_mask, key_index)
    bsz, h, n_q, d = q.shape
    hk = k.shape[1]
    group = h // hk
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if out.numel() == 0:
        return out
    if n_keys == 0:
        return out.zero_()
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    cfg = config or default_config(group * n_q, d, q.dtype, gathered=key_index is not None)
    if cfg.block_m < 16 or cfg.block_n < 16:
        raise ValueError(f"block_m and block_n must be >= 16 (tl.dot), got {cfg}")
    block_d = _block_d(d)
    # Unused pointer arguments get q (never read: the HAS_* flags compile those loads away).
    index = key_index if key_index is not None else q
    mask = key_mask.view(torch.uint8) if key_mask is not None else q  # bool -> uint8 without a copy
    index_strides = (key_index.stride(0), key_index.stride(1)) if key_index is not None else (0, 0)
    mask_strides = (key_mask.stride(0), key_mask.stride(1)) if key_mask is not None else (0, 0)
    grid = (triton.cdiv(group * n_q, cfg.block_m), bsz * hk)
    _masked_attention_fwd[grid](
        q,
        k,
        v,
        out,
        index,
        mask,
        scale * math.log2(math.e),
        *q.stride(),
        *k.stride(),
        *v.stride(),
        *out.stride(),
        *index_strides,
        *mask_strides,
        hk,
        n_q,
        n_keys,
        d,
        GROUP=group,
        HAS_INDEX=key_index is not None,
        HAS_MASK=key_mask is not None,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_D=block_d,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return out
