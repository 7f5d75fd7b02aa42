"""``bench_speed.py --versus-reference``: ``dlm_decode.generate`` against the reference loops it re-states, same
algorithm, same tokens, same NFE (temperature 0; fp32 unless ``--dtype``).

    python benchmarks/bench_speed.py --versus-reference --vr-configs 256x1,256x8,1024x1 --repeats 5 --warmup 1 \\
        --threads 1
    python benchmarks/bench_speed.py --versus-reference --model DIR ...   # an LLaDA checkpoint, not random weights

Model: without ``--model``, a random LLaDA of demo size (d_model 256, 6 layers, 8 heads, MLP 768, vocabulary 2048)
written in the official format to a temporary directory the way the tests write theirs (``tests/checkpoints.py``)
and loaded with ``dlm_decode.load_model``; ``--model`` loads an LLaDA checkpoint instead (Fast-dLLM's loops are
LLaDA's). Prompts: random token ids, 64 per row, fixed by ``--seed``; every row of a batch has the same length
because the reference has no padding.

The reference side is the test suite's re-statements of the published loops: LLaDA ``generate``
(``tests/reference_generate.py``: ``llada_generate``), Fast-dLLM ``generate`` with a threshold (``fastdllm_generate``),
``generate_with_prefix_cache`` and ``generate_with_dual_cache`` (``tests/reference_cached_generate.py``). They run
over ``llada_cached_forward``: a plain LLaDA forward over the checkpoint tensors that keeps Fast-dLLM's cache
mechanics (K/V cached before RoPE, the whole key sequence rotated every call), here with SDPA attention and
``F.silu`` as the official modeling file. Batches > 1 run as the reference runs them: one batched forward per step
and a Python loop over the rows for the selection. Rows per configuration (gen length x batch; block 32):

* ``llada_generate``: LLaDA ``generate``, ``low_confidence``, ``--vr-steps`` steps, no cache (the baseline);
* ``threshold``: threshold 0.9, no cache; ``threshold+prefix``, ``threshold+dual``: with Fast-dLLM's caches;
* ``fixed+dual``: the fixed schedule (``low_confidence``, ``--vr-steps`` steps) with the dual cache.

``--vr-steps`` (default 256, at most the gen length: one token per step at gen 256) is the fixed schedule's total.
Each repeat runs every configuration and row, reference and ours back to back (the order alternates per repeat);
``--warmup`` passes run first, untimed. Time is wall-clock around the whole call on both sides (ours includes its
request checks and output building; CUDA is synchronised). Per row: NFE of each side (the reference's counted as
calls of its forward), tokens/s of each side (median over repeats), whether the tokens are identical, and the ratio
ours / reference; per configuration the ``threshold+dual`` / ``threshold`` tokens/s ratio of each side. The last line
printed is one JSON object, with the torch thread count.

Our side's model is loaded with ``load_model``'s default weight layout (column-major on CPU in float32,
``dlm_decode/models/layout.py``; ``--vr-layout`` picks another); the reference side gets the checkpoint's row-major
tensors, as ``from_pretrained`` hands them to the reference code. The JSON records our layout (``weight_layout``).

``--dtype bfloat16`` / ``float16`` run both sides in that precision (both compute the same formulas in a different
order, so half-precision roundings can part their tokens where float32 keeps them: the identity column reports it,
and a row whose NFE differ compares different work).

Roofline: at batch 1 a forward streams every weight once (LLaDA-8B: 16 GB in bf16), so each row also reports the
weight bytes each side moves per second (the parameters but the input embedding table, times its NFE, over its median
seconds) and, when the peak bandwidth is known (``--peak-gbps``, or ``PEAK_GBPS`` by CUDA device name), that as a share
of it. ``--vr-size llada-8b --dtype bfloat16 --device cuda`` builds a random LLaDA of LLaDA-8B's shape on the GPU for
that measurement (``benchmarks/gpu_checks.sh``, stage ``versus8b``).

``--compile [MODE]`` adds a third side, ``dlm_decode.generate(compile=MODE)`` (``dlm_decode/models/compiled.py``),
interleaved with the other two in every repeat (the order rotates); per row its tokens/s, whether its tokens and NFE
equal the eager side's, and compiled / eager tokens/s, by wall-clock and by the process's CPU time (steadier where
other jobs load the machine). Compiling happens in the warm-up passes (at least one is needed), outside the timed
repeats; the JSON reports dynamo's compile seconds (``_compile.compile_inner``, summed), the graphs compiled, and each
configuration's first-pass seconds of every side.

``--vr-graphs`` adds another such side, ``dlm_decode.generate(cuda_graphs=True)`` (``dlm_decode/models/graphs.py``:
a block's cached steps replayed as CUDA graphs on a GPU; the same fixed-shape steps, uncaptured, on a CPU): its
tokens/s over eager and over the reference, its ms per forward and roofline share, and whether its tokens equal the
eager side's. Graphs live for one call, so each timed call records its own (a block's second cached step).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the reference re-statements

from checkpoints import llada_config, llada_state_dict, write_checkpoint  # noqa: E402
from reference_cached_generate import dual_cache_generate, llada_cached_forward, prefix_cache_generate  # noqa: E402
from reference_generate import fastdllm_generate, llada_generate  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks' shared modules
from random_models import RANDOM_SHAPES, random_ids, random_llada  # noqa: E402

import dlm_decode  # noqa: E402
from dlm_decode.models.compiled import resolve_mode  # noqa: E402
from dlm_decode.models.layout import layout_of, resolve_layout, set_layout  # noqa: E402
from dlm_decode.models.loading import parse_dtype  # noqa: E402
from dlm_decode.parallelbench.runner import render_table  # noqa: E402

PROMPT_LENGTH, BLOCK_LENGTH, THRESHOLD = 64, 32, 0.9
DEMO_SIZE = {k: v for k, v in RANDOM_SHAPES["demo"].items() if k != "vocab_size"}
DEMO_VOCAB = RANDOM_SHAPES["demo"]["vocab_size"]
# --vr-size: "demo" is written as an official checkpoint and loaded (``load``); the others are random_models built
SIZES = ("demo", *(s for s in RANDOM_SHAPES if s != "demo"))
# peak memory bandwidth (GB/s) of the accelerators the roofline column knows by name; --peak-gbps overrides
PEAK_GBPS = {"H200": 4800.0, "H100 PCIe": 2000.0, "H100": 3350.0, "A100-SXM4-80GB": 2039.0, "A100-SXM4-40GB": 1555.0}


@dataclass(frozen=True)
class Row:
    """One algorithm, run by the reference and by ``dlm_decode.generate``."""

    name: str
    sampler: str
    cache: str
    reference: str  # which re-stated loop: llada, fastdllm, prefix, dual

    @property
    def fixed(self) -> bool:
        return self.sampler == "low_confidence"


ROWS = (
    Row("llada_generate", "low_confidence", "none", "llada"),
    Row("threshold", "threshold", "none", "fastdllm"),
    Row("threshold+prefix", "threshold", "prefix", "prefix"),
    Row("threshold+dual", "threshold", "dual", "dual"),
    Row("fixed+dual", "low_confidence", "dual", "dual"),
)


def parse_configs(spec: str) -> list[tuple[int, int]]:
    """``"256x1,1024x8"`` -> [(gen length, batch), ...]; gen lengths are multiples of the block (32)."""
    out = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        gen, sep, batch = part.partition("x")
        if not sep or not gen.isdigit() or not batch.isdigit() or int(gen) < 1 or int(batch) < 1:
            raise SystemExit(f"--vr-configs expects GENxBATCH entries such as 256x1, got {part!r}")
        if int(gen) % BLOCK_LENGTH:
            raise SystemExit(f"--vr-configs: gen length {gen} is not a multiple of the block length {BLOCK_LENGTH}")
        out.append((int(gen), int(batch)))
    if not out:
        raise SystemExit("--vr-configs is empty")
    return out


def parse_rows(spec: str | None) -> tuple[Row, ...]:
    """``"threshold,threshold+dual"`` -> those ``ROWS`` in table order; None or "" -> every row."""
    if not spec:
        return ROWS
    names = [p.strip() for p in spec.split(",") if p.strip()]
    known = {r.name for r in ROWS}
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise SystemExit(f"--vr-rows: unknown {unknown or [spec]}; choose from {', '.join(r.name for r in ROWS)}")
    return tuple(r for r in ROWS if r.name in names)


def fixed_steps(gen: int, steps: int) -> int:
    """The fixed schedule's total steps at gen length ``gen``: ``steps`` capped at ``gen``, a multiple of the blocks."""
    blocks = gen // BLOCK_LENGTH
    total = min(steps, gen)
    if total % blocks:
        raise SystemExit(f"--vr-steps {steps}: at gen length {gen} the steps must be a multiple of {blocks} blocks")
    return total


def load(args: argparse.Namespace) -> tuple[Any, str]:
    """The model (eval; ``--dtype``; linear weights laid out as ``--vr-layout`` says) and a description of it.

    ``--vr-size demo`` (default) is written as an official checkpoint and loaded with ``load_model``, as the tests do;
    another size is ``random_models.random_llada`` of that shape (LLaDA-8B's, ``llada-8b``, is built on the device:
    its 16 GB in bf16 would take minutes to write and read back), then laid out the same way."""
    layout = getattr(args, "vr_layout", "auto")
    dtype = getattr(args, "dtype", "float32")
    size = getattr(args, "vr_size", "demo")
    if size not in SIZES:
        raise SystemExit(f"--vr-size must be one of {', '.join(SIZES)}, got {size!r}")
    if args.model is None and size != "demo":
        model = random_llada(args.device, size, None, dtype)
        set_layout(model, resolve_layout(layout, args.device, parse_dtype(dtype)))
        n = sum(p.numel() for p in model.parameters())
        return model, f"random LLaDA, {size} widths, {model.config.n_layers} layers, {n / 1e9:.2f}B params"
    if args.model is None:
        sizes = {"vocab_size": DEMO_VOCAB, "embedding_size": DEMO_VOCAB, "mask_token_id": DEMO_VOCAB - 1}
        cfg = llada_config(**DEMO_SIZE, **sizes, max_sequence_length=4096)
        with tempfile.TemporaryDirectory() as tmp:
            path = write_checkpoint(Path(tmp) / "llada", cfg, llada_state_dict(cfg))
            model = dlm_decode.load_model(path, dtype=dtype, device=args.device, tokenizer=False, layout=layout)[0]
        return model, "random LLaDA, demo size (d 256, 6 layers, 8 heads, MLP 768, vocab 2048)"
    model = dlm_decode.load_model(args.model, dtype=dtype, device=args.device, tokenizer=False, layout=layout)[0]
    if model.config.model_type != "llada" or model.config.weight_tying:
        raise SystemExit("--versus-reference needs an LLaDA checkpoint without weight tying (the reference's model)")
    return model, str(args.model)


def weight_bytes_per_forward(model: Any) -> int:
    """Bytes of parameters a forward reads: every one but the input embedding table, of which it gathers a few rows
    (the roofline's numerator: at batch 1 a forward streams the weights once)."""
    emb = model.get_input_embeddings().weight
    return sum(p.numel() * p.element_size() for p in model.parameters() if p is not emb)


def peak_gbps(device: str, given: float | None) -> tuple[float | None, str | None]:
    """(peak memory bandwidth in GB/s, where it came from): ``--peak-gbps``, or the CUDA device's name looked up in
    ``PEAK_GBPS`` (longest matching key first); (None, None) when unknown (CPU, an unlisted GPU)."""
    if given is not None:
        return given, "--peak-gbps"
    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        return None, None
    name = torch.cuda.get_device_name(torch.device(device))
    for key in sorted(PEAK_GBPS, key=len, reverse=True):
        if key in name:
            return PEAK_GBPS[key], f"{name} (PEAK_GBPS[{key!r}])"
    return None, None


def prompts(model: Any, batch: int, seed: int) -> torch.Tensor:
    """[batch, 64] random ids, never MASK; the same for every row count (row i is the same in every batch)."""
    return random_ids(model, batch, PROMPT_LENGTH, torch.Generator().manual_seed(seed))


class Counted:
    """The reference forward, counting its calls (the reference's NFE)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn, self.calls = fn, 0

    def __call__(self, *a: Any, **kw: Any) -> Any:
        self.calls += 1
        return self.fn(*a, **kw)


def reference_forward(model: Any) -> Callable[..., Any]:
    """``fwd(ids, past=None, replace=None) -> (logits, present)`` over the model's tensors (built once, untimed), laid
    out as the checkpoint stores them and as ``from_pretrained`` loads them for the reference code (row-major: copies
    where ``load_model`` chose the decode layout for our side, ``dlm_decode/models/layout.py``)."""
    weights = {k: v.contiguous() for k, v in model.state_dict().items()}
    return functools.partial(llada_cached_forward, weights, model.config.to_dict(), official_ops=True)


def run_reference(
    model: Any, forward: Callable[..., Any], row: Row, prompt: torch.Tensor, gen: int, steps: int
) -> tuple[torch.Tensor, int]:
    """(tokens [B, T], NFE) of the re-stated reference loop over ``forward`` (``reference_forward``)."""
    fwd = Counted(forward)
    mask = model.mask_token_id
    if row.reference == "llada":
        x = llada_generate(lambda ids: fwd(ids)[0], prompt, steps, gen, BLOCK_LENGTH, mask)
    elif row.reference == "fastdllm":
        x, _ = fastdllm_generate(lambda ids: fwd(ids)[0], prompt, gen, BLOCK_LENGTH, mask, threshold=THRESHOLD)
    else:
        loop = prefix_cache_generate if row.reference == "prefix" else dual_cache_generate
        kw = {"steps": steps} if row.fixed else {"threshold": THRESHOLD}
        x, _ = loop(fwd, prompt, gen, BLOCK_LENGTH, mask, **kw)
    return x, fwd.calls


def run_ours(
    model: Any,
    row: Row,
    prompt: torch.Tensor,
    gen: int,
    steps: int,
    compile: bool | str = False,
    cuda_graphs: bool = False,
) -> tuple[torch.Tensor, int]:
    """(tokens [B, T], NFE) of ``dlm_decode.generate`` for the same algorithm (``compile``, ``cuda_graphs``: its
    options)."""
    out = dlm_decode.generate(
        model,
        prompt,
        sampler=row.sampler,
        sampler_options=None if row.fixed else {"threshold": THRESHOLD},
        cache=row.cache,
        gen_length=gen,
        block_length=BLOCK_LENGTH,
        steps=steps if row.fixed else None,
        temperature=0.0,
        compile=compile,
        cuda_graphs=cuda_graphs,
    )
    return out.sequences, out.nfe


def timed(fn: Callable[[], tuple[torch.Tensor, int]], cuda: bool) -> tuple[float, float, torch.Tensor, int]:
    """(wall seconds, this process's CPU seconds, tokens, NFE) of one call."""
    if cuda:
        torch.cuda.synchronize()
    start, cpu = time.perf_counter(), time.process_time()
    x, nfe = fn()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start, time.process_time() - cpu, x.cpu(), nfe


def _compile_seconds() -> float | None:
    """Seconds dynamo has spent compiling in this process (its own metric; None where it keeps none)."""
    try:
        from torch._dynamo.utils import compilation_time_metrics
    except ImportError:
        return None
    return sum(compilation_time_metrics.get("_compile.compile_inner", []))


def _graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _sides(model: Any, compile: str | None, graphs: bool) -> tuple[list[tuple[str, Callable]], list[str]]:
    """The timed sides (name, call) and the names of those that are ours with one option more (the variants)."""
    sides: list[tuple[str, Callable]] = [
        ("reference", functools.partial(run_reference, model, reference_forward(model)))
    ]
    sides.append(("ours", functools.partial(run_ours, model)))
    variants = []  # sides that are ours with one option more: compared with ours and with the reference
    if compile:
        variants.append("compiled")
        sides.append(("compiled", functools.partial(run_ours, model, compile=compile)))
    if graphs:
        variants.append("graphed")
        sides.append(("graphed", functools.partial(run_ours, model, cuda_graphs=True)))
    return sides, variants


def _measure(args: argparse.Namespace, model: Any, sides: list[tuple[str, Callable]], cases: list) -> dict[str, dict]:
    """Every pass over every case and side (the order rotates per pass; the warm-up passes untimed) -> per case:
    ``times`` and ``cpu`` (timed seconds per side), ``first`` (first-pass seconds per side), ``seen`` ((ids, nfe) per
    side)."""
    cuda = next(model.parameters()).is_cuda
    names = [side for side, _ in sides]
    times: dict[int, dict[str, list[float]]] = {i: {side: [] for side in names} for i in range(len(cases))}
    cpu_times: dict[int, dict[str, list[float]]] = {i: {side: [] for side in names} for i in range(len(cases))}
    first: dict[int, dict[str, float]] = {i: {} for i in range(len(cases))}
    seen: dict[int, dict[str, Any]] = {}
    for rep in range(args.warmup + args.repeats):
        print(f"versus reference: pass {rep + 1}/{args.warmup + args.repeats}", file=sys.stderr)
        for i, (gen, batch, row) in enumerate(cases):
            prompt, steps = prompts(model, batch, args.seed), fixed_steps(gen, args.vr_steps)
            for side, fn in sides[rep % len(sides) :] + sides[: rep % len(sides)]:  # the order rotates per pass
                seconds, cpu, x, nfe = timed(functools.partial(fn, row, prompt, gen, steps), cuda)
                seen.setdefault(i, {})[side] = (x, nfe)
                first[i].setdefault(side, seconds)
                if rep >= args.warmup:
                    times[i][side].append(seconds)
                    cpu_times[i][side].append(cpu)
    return {"times": times, "cpu": cpu_times, "first": first, "seen": seen}


def _variant_fields(v: str, i: int, m: dict[str, dict], tps: dict[str, float], rl: tuple) -> dict[str, Any]:
    """One variant side's fields of case ``i``'s result (``rl``: weight bytes and peak for its roofline share)."""
    (v_x, v_nfe), (our_x, our_nfe) = m["seen"][i][v], m["seen"][i]["ours"]
    cpu = m["cpu"][i]
    return {
        f"nfe_{v}": v_nfe,
        f"tokens_per_s_{v}": tps[v],
        f"seconds_{v}": m["times"][i][v],
        f"{v}_identical_to_ours": bool(torch.equal(v_x, our_x)) and v_nfe == our_nfe,
        f"{v}_over_ours": tps[v] / tps["ours"],
        f"{v}_over_reference": tps[v] / tps["reference"],
        f"cpu_seconds_{v}": cpu[v],
        # CPU time of the process: steadier than wall-clock on a machine other jobs load
        f"{v}_over_ours_cpu": statistics.median(cpu["ours"]) / statistics.median(cpu[v]),
    } | side_roofline(v, rl[0], rl[1], v_nfe, m["times"][i][v])


def _results(
    args: argparse.Namespace, cases: list, m: dict[str, dict], names: list[str], variants: list[str], rl: tuple
) -> list[dict[str, Any]]:
    """One result per case: both sides' NFE, tokens/s and seconds, token identity, the speed-up, roofline, variants."""
    results = []
    for i, (gen, batch, row) in enumerate(cases):
        (ref_x, ref_nfe), (our_x, our_nfe) = m["seen"][i]["reference"], m["seen"][i]["ours"]
        tps = {side: gen * batch / statistics.median(m["times"][i][side]) for side in names}
        extra: dict[str, Any] = {}
        if variants:
            extra = {"cpu_seconds_ours": m["cpu"][i]["ours"], "first_pass_seconds": m["first"][i]}
        for v in variants:
            extra |= _variant_fields(v, i, m, tps, rl)
        results.append(
            {
                "gen_length": gen,
                "batch": batch,
                "row": row.name,
                "sampler": row.sampler,
                "cache": row.cache,
                "steps": fixed_steps(gen, args.vr_steps) if row.fixed else None,
                "nfe_reference": ref_nfe,
                "nfe_ours": our_nfe,
                "tokens_per_s_reference": tps["reference"],
                "tokens_per_s_ours": tps["ours"],
                "seconds_reference": m["times"][i]["reference"],
                "seconds_ours": m["times"][i]["ours"],
                "identical": bool(torch.equal(ref_x, our_x)) and ref_nfe == our_nfe,
                "speedup": tps["ours"] / tps["reference"],
            }
            | roofline(rl[0], rl[1], ref_nfe, our_nfe, m["times"][i])
            | extra
        )
    return results


def _dual_over_none(configs: list[tuple[int, int]], results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per configuration, ``threshold+dual`` / ``threshold`` tokens/s on each side (where both rows ran)."""
    out = []
    for gen, batch in configs:
        by = {r["row"]: r for r in results if (r["gen_length"], r["batch"]) == (gen, batch)}
        if "threshold+dual" not in by or "threshold" not in by:  # --vr-rows left one of them out
            continue
        dual, none = by["threshold+dual"], by["threshold"]
        out.append(
            {
                "gen_length": gen,
                "batch": batch,
                "reference": dual["tokens_per_s_reference"] / none["tokens_per_s_reference"],
                "ours": dual["tokens_per_s_ours"] / none["tokens_per_s_ours"],
            }
        )
    return out


def _variant_meta(model: Any, compile: str | None, graphs: bool, results: list, start: tuple) -> dict[str, Any]:
    """What the variant sides add to the JSON (and their tables, printed); ``start``: dynamo's compile seconds and
    graph count before the passes."""
    meta: dict[str, Any] = {}
    if compile:
        pieces = model.__dict__.get("_compiled_layers", {}).get(resolve_mode(compile))
        spent = _compile_seconds()
        meta = {
            "compile": resolve_mode(compile),
            "compile_error": None if pieces is None else pieces.error,
            "compile_seconds": None if spent is None else spent - start[0],
            "compiled_graphs": _graphs() - start[1],
            "compiled_all_identical": all(r["compiled_identical_to_ours"] for r in results),
        }
        print(format_compiled(results, meta))
    if graphs:
        meta["graphed_all_identical"] = all(r["graphed_identical_to_ours"] for r in results)
        print(format_graphed(results))
    return meta


def main(args: argparse.Namespace) -> dict[str, Any]:
    """Run the comparison, print the table; returns the JSON object (printed last by the caller)."""
    if args.threads:
        torch.set_num_threads(args.threads)
    configs = parse_configs(args.vr_configs)
    rows = parse_rows(getattr(args, "vr_rows", None))
    compile = getattr(args, "compile", None)
    graphs = getattr(args, "vr_graphs", False)
    if compile and args.warmup < 1:
        raise SystemExit("--compile needs --warmup >= 1: compiling happens in the warm-up passes, untimed")
    model, described = load(args)
    sides, variants = _sides(model, compile, graphs)
    cases = [(gen, batch, row) for gen, batch in configs for row in rows]
    start = (_compile_seconds(), _graphs()) if compile else (None, 0)
    measured = _measure(args, model, sides, cases)
    wbytes = weight_bytes_per_forward(model)
    peak, peak_source = peak_gbps(args.device, getattr(args, "peak_gbps", None))
    results = _results(args, cases, measured, [side for side, _ in sides], variants, (wbytes, peak))
    dual_over_none = _dual_over_none(configs, results)
    print(format_table(results, dual_over_none))
    variant_meta = _variant_meta(model, compile, graphs, results, start)
    return {
        "bench": "speed_versus_reference",
        "model": described,
        "device": str(next(model.parameters()).device),
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "weight_bytes_per_forward": wbytes,
        "peak_gbps": peak,
        "peak_gbps_source": peak_source,
        "torch_threads": torch.get_num_threads(),
        "weight_layout": layout_of(model),
        "prompt_length": PROMPT_LENGTH,
        "block_length": BLOCK_LENGTH,
        "threshold": THRESHOLD,
        "fixed_steps": args.vr_steps,
        "configs": [f"{g}x{b}" for g, b in configs],
        "rows": [r.name for r in rows],
        "repeats": args.repeats,
        "warmup": args.warmup,
        "seed": args.seed,
        "timing": "wall-clock around the whole call, median over repeats, both sides interleaved in one process",
        "all_identical": all(r["identical"] for r in results),
        "results": results,
        "threshold_dual_over_threshold": dual_over_none,
    } | variant_meta


def variant_table(results: list[dict[str, Any]], v: str, extra: dict[str, Callable[[dict], str]]) -> str:
    """The per-row table of a variant side ``v`` (``compiled``, ``graphed``) against the eager side: NFE, both
    tokens/s, the ratio, the ``extra`` columns (name -> cell of a result), token identity."""
    head = ["gen x batch", "row", "NFE", "tok/s eager", f"tok/s {v}", "x eager", *extra, "same tokens"]
    body = [
        [
            f"{r['gen_length']}x{r['batch']}",
            r["row"],
            str(r[f"nfe_{v}"]),
            f"{r['tokens_per_s_ours']:.1f}",
            f"{r[f'tokens_per_s_{v}']:.1f}",
            f"{r[f'{v}_over_ours']:.2f}",
            *(cell(r) for cell in extra.values()),
            "yes" if r[f"{v}_identical_to_ours"] else "NO",
        ]
        for r in results
    ]
    return render_table(head, body)


def format_graphed(results: list[dict[str, Any]]) -> str:
    extra = {
        "x ref": lambda r: f"{r['graphed_over_reference']:.2f}",
        "ms/fwd": lambda r: f"{r['ms_per_forward_graphed']:.2f}",
        "roof": lambda r: "-" if r["roofline_graphed"] is None else f"{100 * r['roofline_graphed']:.0f}%",
    }
    title = "cuda_graphs=True: dlm_decode.generate with step graphs / eager (graphs recorded in the warm-up passes too)"
    return title + "\n" + variant_table(results, "graphed", extra)


def format_compiled(results: list[dict[str, Any]], compiled: dict[str, Any]) -> str:
    table = variant_table(results, "compiled", {"x eager (CPU s)": lambda r: f"{r['compiled_over_ours_cpu']:.2f}"})
    spent = compiled["compile_seconds"]
    lines = [
        f"compile={compiled['compile']}: dlm_decode.generate compiled / eager (both timed after the warm-up passes)",
        table,
        f"compiling: {'-' if spent is None else f'{spent:.1f}'} s in the warm-up passes, "
        f"{compiled['compiled_graphs']} graphs"
        + (f"; FAILED, ran eagerly: {compiled['compile_error']}" if compiled["compile_error"] else ""),
    ]
    return "\n".join(lines)


def side_roofline(side: str, wbytes: int, peak: float | None, nfe: int, seconds: list[float]) -> dict[str, Any]:
    """One side's weight bytes streamed per second (``wbytes`` x NFE / median seconds), its share of the peak
    bandwidth when one is known, and its ms per forward."""
    median = statistics.median(seconds)
    gbps = wbytes * nfe / median / 1e9
    return {
        f"weight_gbps_{side}": gbps,
        f"roofline_{side}": None if peak is None else gbps / peak,
        f"ms_per_forward_{side}": 1e3 * median / max(nfe, 1),
    }


def roofline(
    wbytes: int, peak: float | None, ref_nfe: int, our_nfe: int, seconds: dict[str, list[float]]
) -> dict[str, Any]:
    """Weight bytes streamed per second by each side (``wbytes`` x NFE / median seconds), and their share of the peak
    bandwidth when one is known."""
    out = side_roofline("reference", wbytes, peak, ref_nfe, seconds["reference"])
    out |= side_roofline("ours", wbytes, peak, our_nfe, seconds["ours"])
    # per forward: the comparison that still holds where half-precision tokens (and so the NFE) part
    out["forward_speedup"] = out["ms_per_forward_reference"] / out["ms_per_forward_ours"]
    return out


def format_table(results: list[dict[str, Any]], dual_over_none: list[dict[str, Any]]) -> str:
    head = ["gen x batch", "row", "NFE ref", "NFE ours", "tok/s ref", "tok/s ours", "x ref", "identical"]
    head += ["ms/fwd ref", "ms/fwd ours", "GB/s ref", "GB/s ours", "roof ref", "roof ours"]

    def share(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.0f}%"

    body = [
        [
            f"{r['gen_length']}x{r['batch']}",
            r["row"],
            str(r["nfe_reference"]),
            str(r["nfe_ours"]),
            f"{r['tokens_per_s_reference']:.1f}",
            f"{r['tokens_per_s_ours']:.1f}",
            f"{r['speedup']:.2f}",
            "yes" if r["identical"] else "NO",
            f"{r['ms_per_forward_reference']:.2f}",
            f"{r['ms_per_forward_ours']:.2f}",
            f"{r['weight_gbps_reference']:.1f}",
            f"{r['weight_gbps_ours']:.1f}",
            share(r["roofline_reference"]),
            share(r["roofline_ours"]),
        ]
        for r in results
    ]
    lines = [render_table(head, body), "threshold+dual tok/s over threshold (no cache) tok/s:"]
    for d in dual_over_none:
        lines.append(f"  {d['gen_length']}x{d['batch']}: reference {d['reference']:.2f}, ours {d['ours']:.2f}")
    return "\n".join(lines)
