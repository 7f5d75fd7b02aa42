"""Where a decode's time goes: ``torch.profiler`` over one ``dlm_decode.generate`` call on a random LLaDA of a
published width (``random_models.py``), after one untimed warm-up call.

    python benchmarks/profile_decode.py --shape llada-8b --device cuda --dtype bfloat16 --cache none,dual

For each cache it prints the operators with the most device (or, on the CPU, self) time and the share of the wall
time the device was busy (a low share means the loop waits on the host: launches, syncs, Python). Before that, the
median time of one bare forward at the full width (prompt + gen) and at one block (``bench_attention.median_ms``)
and, on CUDA, a bare bf16 matmul's TFLOP/s at the MLP's shape as the machine's own yardstick. One JSON line last.

``--op-sites N`` also decodes once more under a dispatch mode that counts every ATen operator the call dispatches,
and prints the operators per forward and the N lines of ``dlm_decode`` that dispatch the most (on a host-bound
decode, where each operator costs a few microseconds of dispatch whatever its size, this says which code to thin)."""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_attention import median_ms  # noqa: E402
from random_models import RANDOM_SHAPES, random_ids, random_llada  # noqa: E402

import dlm_decode  # noqa: E402
from dlm_decode.cli import add_compile_arg  # noqa: E402
from dlm_decode.models.loading import check_device  # noqa: E402

PROMPT, BLOCK = 64, 32


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def profile_cache(model: Any, prompt: torch.Tensor, args: argparse.Namespace, cache: str) -> dict[str, Any]:
    """Profile one generate call with ``cache``; print its top operators; return its summary."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    def run() -> Any:
        return dlm_decode.generate(
            model,
            prompt,
            sampler=args.sampler,
            cache=cache,
            gen_length=args.gen,
            block_length=BLOCK,
            temperature=0.0,
            compile=args.compile or False,
            cuda_graphs=args.graphs,
        )

    run()  # warm-up: kernels (and with --compile the graphs) compiled, allocator grown
    cuda = args.device.startswith("cuda")
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    _sync(args.device)
    t = time.perf_counter()
    with profile(activities=acts) as prof:
        out = run()
        _sync(args.device)
    wall = time.perf_counter() - t
    table = prof.key_averages()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    if cuda:  # the kernels' own time; an operator's device time repeats its kernels', so operators are left out
        busy = sum(e.self_device_time_total for e in prof.events() if e.device_type == DeviceType.CUDA) / 1e6
    else:  # the operators' self time on the host
        busy = sum(e.self_cpu_time_total for e in table) / 1e6
    print(
        f"\n== cache={cache} sampler={args.sampler}: NFE {out.nfe}, wall {wall:.3f} s under the profiler, "
        f"{'device' if cuda else 'cpu'} self time {busy:.3f} s ({busy / wall:.0%} of wall)"
    )
    print(table.table(sort_by=key, row_limit=args.rows, max_name_column_width=60))
    summary = {"cache": cache, "nfe": out.nfe, "wall_s": wall, "busy_s": busy, "busy_share": busy / wall}
    if args.graphs:  # kernels replayed from a graph are traced where the profiler's CUPTI sees graph nodes
        summary["graphs"] = out.graphs
        print(f"step graphs: {out.graphs}")
    if args.op_sites:
        summary |= count_ops(run, args.op_sites)
    return summary


def count_ops(run: Any, top: int) -> dict[str, Any]:
    """Run ``run()`` once counting the ATen operators it dispatches, by operator and by the innermost ``dlm_decode``
    source line that dispatched them ("other" when none: e.g. code of torch's own); print and return the counts per
    forward (``run``'s output NFE)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    ops: Counter[str] = Counter()
    sites: Counter[str] = Counter()
    package = str(Path(dlm_decode.__file__).resolve().parent)

    class Counting(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            ops[str(func)] += 1
            frames = [f for f in traceback.extract_stack(limit=16) if f.filename.startswith(package)]
            where = f"{Path(frames[-1].filename).relative_to(package)}:{frames[-1].lineno}" if frames else "other"
            sites[where] += 1
            return func(*args, **(kwargs or {}))

    with Counting():
        nfe = run().nfe
    total = sum(ops.values())
    print(f"operators dispatched: {total} in {nfe} forwards, {total / nfe:.1f} per forward")
    print("per forward  operator")
    for name, n in ops.most_common(top):
        print(f"{n / nfe:11.1f}  {name}")
    print("per forward  dispatched from (dlm_decode/...)")
    for where, n in sites.most_common(top):
        print(f"{n / nfe:11.1f}  {where}")
    return {
        "ops_nfe": nfe,
        "ops_per_forward": total / nfe,
        "ops": dict(ops.most_common()),
        "op_sites": dict(sites.most_common(top)),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="tiny", choices=sorted(RANDOM_SHAPES))
    p.add_argument("--layers", type=int, default=None, help="fewer layers than the shape's (a quicker look)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--sampler", default="threshold")
    p.add_argument("--cache", default="none,dual", help="comma-separated caches to profile, each in turn")
    p.add_argument("--gen", type=int, default=256)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--rows", type=int, default=18, help="operators printed per table")
    p.add_argument("--repeats", type=int, default=5, help="bare-forward timings (median)")
    p.add_argument(
        "--op-sites",
        type=int,
        default=0,
        metavar="N",
        help="also count the ATen operators of one more decode per cache: per forward, the N most frequent and the N "
        "dlm_decode source lines that dispatch the most",
    )
    p.add_argument("--graphs", action="store_true", help="decode with step graphs (generate(cuda_graphs=True))")
    add_compile_arg(p, "; here every profiled decode (the bare forwards stay eager)")
    args = p.parse_args(argv)
    caches = [c for c in args.cache.split(",") if c]
    unknown = [c for c in caches if c not in dlm_decode.CACHES]
    if not caches or unknown:
        raise SystemExit(f"--cache: comma-separated names from {', '.join(dlm_decode.CACHES)}; got {args.cache!r}")
    if args.op_sites < 0:
        raise SystemExit(f"--op-sites must be >= 0 (0: no counts), got {args.op_sites}")
    if args.sampler not in dlm_decode.SAMPLERS:
        raise SystemExit(f"--sampler must be one of {', '.join(dlm_decode.SAMPLERS)}, got {args.sampler!r}")
    try:
        check_device(args.device, "--device")
    except ValueError as e:
        raise SystemExit(str(e)) from None
    cuda = args.device.startswith("cuda")
    t = time.perf_counter()
    model = random_llada(args.device, args.shape, args.layers, args.dtype)
    built = time.perf_counter() - t
    g = torch.Generator().manual_seed(0)
    prompt = random_ids(model, args.batch, PROMPT, g)
    result: dict[str, Any] = {
        "bench": "profile_decode",
        "shape": args.shape,
        "layers": model.config.n_layers,
        "device": args.device,
        "dtype": args.dtype,
        "batch": args.batch,
        "gen": args.gen,
        "threads": torch.get_num_threads(),
        "build_s": built,
        "compile": args.compile,
        "graphs": args.graphs,
    }
    if cuda:
        result["gpu"] = torch.cuda.get_device_name()
    with torch.no_grad():
        for n in (PROMPT + args.gen, BLOCK):
            ids = random_ids(model, args.batch, n, g)
            result[f"bare_forward_ms_{n}"] = median_ms(lambda ids=ids: model(ids), args.repeats, 1, cuda)
            print(f"bare forward, {n} tokens: {result[f'bare_forward_ms_{n}']:.2f} ms")
        if cuda:
            d, h = model.config.d_model, model.config.mlp_hidden_size
            a = torch.randn(args.batch * (PROMPT + args.gen), d, device=args.device, dtype=model.dtype)
            w = torch.randn(d, h, device=args.device, dtype=model.dtype)
            ms = median_ms(lambda: a @ w, 20, 1, cuda)
            result["matmul_tflops"] = 2 * a.shape[0] * d * h / ms / 1e9
            print(f"bare matmul [{a.shape[0]}x{d}]x[{d}x{h}]: {result['matmul_tflops']:.0f} TFLOP/s")
        result["caches"] = [profile_cache(model, prompt, args, c) for c in caches]
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    from dlm_decode.cli import run_script

    run_script(main, "benchmarks/profile_decode.py")
