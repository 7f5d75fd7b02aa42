"""Launch-parameter sweep for the masked-attention Triton kernel (CUDA only).

For each case (the shapes the caches produce with LLaDA-8B / Dream-7B widths, bf16) it times the kernel under every
``KernelConfig`` of a small grid and under ``default_config``, next to ``F.scaled_dot_product_attention`` on the same
(pre-gathered) keys, and checks each config's output against the default's. Configs that fail to compile (shared
memory) are skipped. It prints a table per case and one JSON line last: per case the default's time, the best
config and its time, and SDPA's.

    python benchmarks/tune_attention.py                     # every case, the full grid
    python benchmarks/tune_attention.py --cases dual-b8,full-b8 --dtype fp16
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from dlm_decode.kernels.reference import gather_keys  # noqa: E402

# name: (B, H, Hk, Q, S, W, D); W = 0 attends to all S slots under a key mask, W > 0 gathers W of them
CASES = {
    "dual-b1": (1, 32, 32, 32, 1088, 0, 128),
    "dual-b8": (8, 32, 32, 32, 1088, 0, 128),
    "dream-dual-b8": (8, 28, 4, 32, 1088, 0, 128),
    "window-b8": (8, 32, 32, 16, 1088, 192, 128),
    "gather-b8": (8, 32, 8, 32, 2048, 1024, 128),
    "full-b8": (8, 32, 32, 1088, 1088, 0, 128),
}
GRID = dict(block_m=(32, 64, 128), block_n=(32, 64, 128), num_warps=(4, 8), num_stages=(2, 3))
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, from {sorted(CASES)}")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def inputs(case: tuple[int, ...], dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    b, h, hk, n_q, s, w, d = case
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, n_q, d, generator=g).to("cuda", dtype)
    k = torch.randn(b, hk, s, d, generator=g).to("cuda", dtype)
    v = torch.randn(b, hk, s, d, generator=g).to("cuda", dtype)
    index = torch.stack([torch.randperm(s, generator=g)[:w] for _ in range(b)]).cuda() if w else None
    mask = (torch.rand(b, w or s, generator=g) < 0.9).cuda()
    return q, k, v, index, mask


def tune_case(name: str, dtype: torch.dtype, seed: int) -> dict:
    """Time every config of ``GRID`` and the default on one case; print the five fastest."""
    from triton.testing import do_bench

    from dlm_decode.kernels.triton_attention import KernelConfig, default_config, masked_attention_triton

    b, h, hk, n_q, s, w, d = case = CASES[name]
    q, k, v, index, mask = inputs(case, dtype, seed)
    kg, vg = (gather_keys(k, index), gather_keys(v, index)) if index is not None else (k, v)
    sdpa_ms = do_bench(
        lambda: F.scaled_dot_product_attention(
            q, kg, vg, attn_mask=mask[:, None, None, :], scale=1 / math.sqrt(d), enable_gqa=h != hk
        )
    )

    def kernel(cfg=None):
        return masked_attention_triton(q, k, v, key_mask=mask, key_index=index, config=cfg)

    base_cfg = default_config((h // hk) * n_q, d, dtype, gathered=index is not None)
    ref = kernel()
    rows = []
    for bm, bn, nw, ns in itertools.product(*GRID.values()):
        cfg = KernelConfig(bm, bn, nw, ns)
        try:
            err = (kernel(cfg).float() - ref.float()).abs().max().item()
            ms = do_bench(lambda cfg=cfg: kernel(cfg))
        except Exception as e:  # noqa: BLE001  (out of shared memory and the like: not a candidate)
            print(f"  {cfg}: skipped ({type(e).__name__})")
            continue
        rows.append((ms, cfg, err))
    default_ms = do_bench(kernel)
    rows.sort(key=lambda r: r[0])
    print(
        f"{name} B{b} H{h} Hk{hk} Q{n_q} S{s} W{w} D{d}: SDPA {sdpa_ms * 1e3:.1f} us, default {base_cfg} "
        f"{default_ms * 1e3:.1f} us",
        flush=True,
    )
    for ms, cfg, err in rows[:5]:
        print(f"  {ms * 1e3:8.1f} us  x SDPA {ms / sdpa_ms:5.2f}  {cfg}  max diff vs default {err:.2e}")
    best_ms, best_cfg, _ = rows[0]
    return {
        "shape": dict(B=b, H=h, Hk=hk, Q=n_q, S=s, W=w, D=d),
        "sdpa_us": round(sdpa_ms * 1e3, 2),
        "default_us": round(default_ms * 1e3, 2),
        "default": asdict(base_cfg),
        "best_us": round(best_ms * 1e3, 2),
        "best": asdict(best_cfg),
    }


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("tune_attention.py needs a CUDA GPU (the kernel's launch parameters only matter there)")
    dtype = DTYPES[args.dtype]
    summary: dict = {"device": torch.cuda.get_device_name(), "dtype": args.dtype, "cases": {}}
    for name in args.cases.split(","):
        summary["cases"][name] = tune_case(name, dtype, args.seed)
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    from dlm_decode.cli import run_script

    run_script(main, "benchmarks/tune_attention.py")
