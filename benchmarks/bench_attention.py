"""Benchmark of the masked-attention Triton kernel against its PyTorch twin and plain SDPA.

On CUDA it times three ways to compute the same attention (queries at Q canvas slots over W gathered keys with a
key mask, GQA): the Triton kernel, the twin (``attention_reference``: gather + GQA repeat + SDPA + NaN guard),
and ``F.scaled_dot_product_attention`` on keys gathered beforehand (gather excluded: the floor for torch).
Each time is the median of ``--repeats`` runs after ``--warmup`` untimed ones; ratios are time / SDPA time.
Without CUDA it says so and times only the twin. The last line printed is one JSON object.

    python benchmarks/bench_attention.py                        # decode-step shape, bf16 on CUDA
    python benchmarks/bench_attention.py --window 0 --keys 4096 # attend to all S slots, no gather
    python benchmarks/bench_attention.py --batch 1 --heads 4 --kv-heads 2 --keys 256 --window 128 --head-dim 64
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from dlm_decode.kernels.reference import attention_reference, gather_keys  # noqa: E402

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=8, help="B")
    p.add_argument("--heads", type=int, default=32, help="H, query heads")
    p.add_argument("--kv-heads", type=int, default=8, help="Hk, key/value heads (H must be a multiple)")
    p.add_argument("--queries", type=int, default=32, help="Q, query positions (a decoding block)")
    p.add_argument("--keys", type=int, default=2048, help="S, cache slots")
    p.add_argument("--window", type=int, default=1024, help="W, keys gathered through key_index (0: all S)")
    p.add_argument("--head-dim", type=int, default=128, help="D")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="fp32 on CPU regardless")
    p.add_argument("--visible", type=float, default=0.9, help="fraction of keys the mask leaves visible")
    p.add_argument("--repeats", type=int, default=None, help="timed runs (default 50 on CUDA, 5 on CPU)")
    p.add_argument("--warmup", type=int, default=None, help="untimed runs first (default 10 on CUDA, 1 on CPU)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def median_ms(fn: Callable[[], object], repeats: int, warmup: int, cuda: bool) -> float:
    """Median wall time of ``fn`` in ms; warm-up runs (compilation, autotuning, caches) are not timed."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    dtype = DTYPES[args.dtype] if cuda else torch.float32
    repeats = args.repeats if args.repeats is not None else (50 if cuda else 5)
    warmup = args.warmup if args.warmup is not None else (10 if cuda else 1)
    if args.heads % args.kv_heads:
        raise SystemExit(f"--heads ({args.heads}) must be a multiple of --kv-heads ({args.kv_heads})")

    gen = torch.Generator().manual_seed(args.seed)
    b, h, hk, n_q, s, d = args.batch, args.heads, args.kv_heads, args.queries, args.keys, args.head_dim
    q = torch.randn(b, h, n_q, d, generator=gen).to(device, dtype)  # [B, H, Q, D]
    k = torch.randn(b, hk, s, d, generator=gen).to(device, dtype)  # [B, Hk, S, D]
    v = torch.randn(b, hk, s, d, generator=gen).to(device, dtype)  # [B, Hk, S, D]
    key_index = None
    n_keys = s
    if args.window:
        n_keys = args.window
        key_index = torch.stack([torch.randperm(s, generator=gen)[:n_keys] for _ in range(b)]).to(device)  # [B, W]
    key_mask = (torch.rand(b, n_keys, generator=gen) < args.visible).to(device)  # [B, W] or [B, S]
    kwargs = dict(key_mask=key_mask, key_index=key_index)
    scale = 1.0 / math.sqrt(d)

    result = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "dtype": str(dtype).removeprefix("torch."),
        "shape": dict(B=b, H=h, Hk=hk, Q=n_q, S=s, W=args.window, D=d),
        "visible": args.visible,
        "repeats": repeats,
        "warmup": warmup,
    }
    if not cuda:
        print("no CUDA device: timing only the PyTorch twin (the Triton kernel needs a GPU)", flush=True)
    result["twin_ms"] = median_ms(lambda: attention_reference(q, k, v, **kwargs), repeats, warmup, cuda)
    if not cuda:
        print(json.dumps(result))
        return result

    from dlm_decode.kernels.triton_attention import masked_attention_triton

    kg, vg = (gather_keys(k, key_index), gather_keys(v, key_index)) if key_index is not None else (k, v)
    mask4 = key_mask[:, None, None, :]  # [B, 1, 1, W]

    def sdpa():
        return F.scaled_dot_product_attention(q, kg, vg, attn_mask=mask4, scale=scale, enable_gqa=h != hk)

    def kernel():
        return masked_attention_triton(q, k, v, **kwargs)

    ref = attention_reference(q.float(), k.float(), v.float(), **kwargs)
    result["kernel_max_abs_err_vs_fp32_twin"] = (kernel().float() - ref).abs().max().item()
    result["twin_max_abs_err_vs_fp32_twin"] = (attention_reference(q, k, v, **kwargs).float() - ref).abs().max().item()
    result["kernel_ms"] = median_ms(kernel, repeats, warmup, cuda)
    result["sdpa_ms"] = median_ms(sdpa, repeats, warmup, cuda)
    result["kernel_over_sdpa"] = result["kernel_ms"] / result["sdpa_ms"]
    result["twin_over_sdpa"] = result["twin_ms"] / result["sdpa_ms"]
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    from dlm_decode.cli import run_script

    run_script(main, "benchmarks/bench_attention.py")
