"""Speed benchmark: every registered sampler x cache pair against the baseline, in one run, on ParallelBench chats.

    python benchmarks/bench_speed.py --model demo-llada                    # every pair, 16 prompts, gen 64, batch 8
    python benchmarks/bench_speed.py --model demo-llada --quick            # a few pairs, 4 prompts, 1 repeat
    python benchmarks/bench_speed.py --model DIR --samplers threshold,factor --caches none,dual --batch-size 1
    python benchmarks/bench_speed.py --versus-reference --vr-configs 256x1,256x8,1024x1 --repeats 5 --threads 1

``--versus-reference`` is a different benchmark: ``dlm_decode.generate`` against the re-stated Fast-dLLM / LLaDA
loops for the same algorithms, with token identity checked (``versus_reference.py`` beside this file says how).

Prompts are waiting-line and puzzle chats regenerated with ``--seed`` (official test samples excluded; task configs
and names come from the ParallelBench data directory). The baseline is ``low_confidence`` with ``steps = gen_length``
(one token per step) and no cache, i.e. LLaDA's ``generate``. Each pair first decodes the whole prompt set
``--warmup`` times untimed (at least once: the first pass measures memory and finds pairs that do not apply); then
each of the ``--repeats`` timed passes decodes it once with every pair in turn (the order reversed on odd passes), so
the ratios to the baseline compare runs taken side by side; every figure is the median over repeats with the min-max
spread. Reported per pair: NFE (mean forwards per row), tokens per step (gen_length / NFE), tokens/s
(generated tokens / decoding seconds, i.e. ``GenerateOutput.seconds``, tokenization excluded), latency per row
(decoding seconds / rows; a batch's rows finish together), token-forwards per generated token (query slots the
model computed / generated tokens: 1 slot per step per canvas slot without a cache), peak memory, K/V cache bytes,
score (ParallelBench metric x 100 on the prompt set), its change from the baseline, the share of rows whose tokens
equal the baseline's, and ratios to the baseline (speed-up in tokens/s, NFE, token-forwards).

Peak memory: on CUDA ``torch.cuda.max_memory_allocated`` during the call minus the allocation before it; on CPU the
peak resident set size (``/proc/self/statm``, polled every millisecond by a thread) during the call minus the RSS
just before it, after ``malloc_trim(0)`` returned freed heap pages to the OS (glibc). Model weights are not counted.
``--compile [MODE]``: every pair decodes with ``torch.compile``d layer pieces (``dlm_decode/models/compiled.py``),
compiled during the warm-up passes; to compare with eager in one run, use ``--versus-reference --compile``, which
times the compiled and the eager ``generate`` interleaved. Fixed-budget samplers other than the baseline run ``--k``
tokens per step (default 1). A pair that does not apply to
the model (an option it lacks, a sampler that needs a trained filter) is reported as skipped with the reason.
The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))  # versus_reference beside this file

import versus_reference  # noqa: E402

import dlm_decode  # noqa: E402
from dlm_decode.cache import CACHES  # noqa: E402
from dlm_decode.cli import add_compile_arg  # noqa: E402
from dlm_decode.models.compiled import set_compile  # noqa: E402
from dlm_decode.models.layout import LAYOUTS  # noqa: E402
from dlm_decode.options import parse_kv  # noqa: E402
from dlm_decode.parallelbench.metrics import score_sample  # noqa: E402
from dlm_decode.parallelbench.runner import load_tasks, render_table  # noqa: E402
from dlm_decode.samplers import SAMPLERS, get_sampler  # noqa: E402

BASELINE = ("low_confidence", "none")
DEFAULT_TASKS = "waiting_line/copy,waiting_line/reverse,waiting_line/shuffle,puzzle/sudoku_n4_12"
QUICK_SAMPLERS, QUICK_CACHES = "low_confidence,threshold,factor", "none,prefix,dual"


def _add_versus_reference_args(p: argparse.ArgumentParser) -> None:
    """``--versus-reference`` and the options that only it reads (``--vr-*``, ``--peak-gbps``)."""
    p.add_argument(
        "--versus-reference",
        action="store_true",
        help="time dlm_decode against the re-stated reference loops instead (see versus_reference.py)",
    )
    p.add_argument("--vr-configs", default="256x1,256x8,1024x1", help="with --versus-reference: GENxBATCH,...")
    p.add_argument(
        "--vr-rows",
        default=None,
        help="with --versus-reference: comma-separated rows (default all: "
        + ",".join(r.name for r in versus_reference.ROWS)
        + ")",
    )
    p.add_argument("--vr-steps", type=int, default=256, help="with --versus-reference: the fixed schedule's steps")
    p.add_argument(
        "--vr-graphs",
        action="store_true",
        help="with --versus-reference: a further side, generate(cuda_graphs=True) (step graphs; versus_reference.py)",
    )
    p.add_argument(
        "--vr-size",
        default="demo",
        choices=versus_reference.SIZES,
        help="with --versus-reference and no --model: the random LLaDA's size (demo: d 256, 6 layers; llada-8b: "
        "LLaDA-8B's widths, built on --device in --dtype, for a GPU)",
    )
    p.add_argument(
        "--peak-gbps",
        type=float,
        default=None,
        help="with --versus-reference: the device's peak memory bandwidth in GB/s for the roofline columns "
        "(default: looked up for known CUDA devices, none on CPU)",
    )
    p.add_argument(
        "--vr-layout",
        default="auto",
        choices=LAYOUTS,
        help="with --versus-reference: our side's weight layout (load_model's layout; dlm_decode/models/layout.py); "
        "the reference always gets the checkpoint's row-major tensors",
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model",
        default=None,
        help="demo name or checkpoint directory (with a tokenizer); default demo-llada, or with --versus-reference a "
        "random demo-size LLaDA",
    )
    p.add_argument("--data", default=None, help="ParallelBench data directory (task configs and names)")
    p.add_argument("--tasks", default=DEFAULT_TASKS, help="tasks the prompts are drawn from (round robin)")
    p.add_argument("--prompts", type=int, default=16, help="prompt-set size")
    p.add_argument("--seed", type=int, default=4_000_037, help="prompt generation seed")
    _add_versus_reference_args(p)
    p.add_argument("--gen-length", type=int, default=64)
    p.add_argument("--block-length", type=int, default=None, help="default: each sampler's own (32 or gen)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--samplers", default=None, help="comma-separated (default: every registered sampler)")
    p.add_argument("--caches", default=None, help="comma-separated (default: every registered cache)")
    p.add_argument("--sampler-opt", action="append", default=[], metavar="SAMPLER.KEY=VALUE")
    p.add_argument("--cache-opt", action="append", default=[], metavar="CACHE.KEY=VALUE")
    p.add_argument("--k", type=int, default=1, help="tokens per step of fixed-budget samplers (not the baseline)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    add_compile_arg(
        p,
        "; here every pair runs compiled, compiling in the warm-up passes; with --versus-reference a third side, "
        "interleaved with the eager one",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"4 prompts, gen 32, 1 repeat; samplers {QUICK_SAMPLERS}, caches {QUICK_CACHES} unless given",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.prompts, args.gen_length, args.repeats = min(args.prompts, 4), 32, 1
        args.batch_size = min(args.batch_size, 4)
        args.samplers = args.samplers or QUICK_SAMPLERS
        args.caches = args.caches or QUICK_CACHES
    if args.repeats < 1 or args.warmup < 0 or args.prompts < 1 or args.batch_size < 1 or args.vr_steps < 1:
        p.error("--repeats, --prompts, --batch-size and --vr-steps must be >= 1 and --warmup >= 0")
    if args.compile and args.warmup < 1:
        p.error("--compile needs --warmup >= 1 (compiling happens there, untimed)")
    if args.vr_graphs and not args.versus_reference:
        p.error("--vr-graphs needs --versus-reference (it adds a side to that comparison)")
    if not args.versus_reference:
        args.model = args.model or "demo-llada"
    return args


# ------------------------------------------------------------------------------------------------ memory


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakMemory:
    """Peak memory above the level at entry (see the module docstring): ``.bytes`` after the ``with`` block."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.bytes: int | None = None

    def __enter__(self) -> PeakMemory:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
            return self
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except OSError:
            pass
        try:
            self.base = self.peak = _rss()
        except OSError:  # no /proc: not measured
            self.base = None
            return self
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()
        return self

    def _poll(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, _rss())
            time.sleep(0.001)

    def __exit__(self, *exc: Any) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            self.bytes = torch.cuda.max_memory_allocated() - self.base
        elif self.base is not None:
            self.stop.set()
            self.thread.join()
            self.bytes = max(0, max(self.peak, _rss()) - self.base)


MEMORY_METHOD = {
    "cuda": "torch.cuda.max_memory_allocated during the warm-up pass minus the allocation before it",
    "cpu": "peak RSS (/proc/self/statm polled every 1 ms) during the warm-up pass minus RSS before it, after "
    "malloc_trim(0)",
}


# ------------------------------------------------------------------------------------------------ running


def _opts(specs: list[str], registry: dict[str, str], kind: str) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for spec in specs:
        name, _, rest = spec.partition(".")
        if not rest or name not in registry:
            raise SystemExit(f"--{kind}-opt expects {kind.upper()}.KEY=VALUE with a registered {kind}, got {spec!r}")
        out.setdefault(name, {}).update(parse_kv([rest]))
    return out


def _names(spec: str | None, registry: dict[str, str], kind: str) -> list[str]:
    names = [n.strip() for n in spec.split(",") if n.strip()] if spec else list(registry)
    bad = [n for n in names if n not in registry]
    if bad:
        raise SystemExit(f"unknown {kind}(s) {', '.join(bad)}; valid: {', '.join(registry)}")
    return names


def decode_all(model, tok, chats, kw: dict[str, Any], batch_size: int) -> dict[str, Any]:
    """Decode every prompt once in batches; totals and per-row results."""
    seconds, forwards, cache_bytes, ids, texts, nfe = 0.0, 0, 0, [], [], []
    for i in range(0, len(chats), batch_size):
        out = dlm_decode.generate(model, chats[i : i + batch_size], tokenizer=tok, chat=True, **kw)
        seconds += out.seconds
        forwards += out.token_forwards
        cache_bytes = max(cache_bytes, out.cache_bytes)
        ids += [r.generated_ids for r in out.rows]
        texts += [r.text or "" for r in out.rows]
        nfe += [r.nfe for r in out.rows]
    return {
        "seconds": seconds,
        "forwards": forwards,
        "cache_bytes": cache_bytes,
        "ids": ids,
        "texts": texts,
        "nfe": nfe,
    }


def warm_pair(model, tok, chats, kw, args) -> int | None:
    """The untimed warm-up passes of one pair (at least one); the peak memory bytes of the first."""
    device = next(model.parameters()).device
    mem = None
    for w in range(max(args.warmup, 1)):
        with PeakMemory(device) as pm:
            decode_all(model, tok, chats, kw, args.batch_size)
        if w == 0:
            mem = pm.bytes
    return mem


def summarize_pair(runs: list[dict[str, Any]], mem: int | None, samples, args) -> dict[str, Any]:
    """One pair's row from its timed runs (medians and spreads over repeats; the first run's tokens and score)."""
    n, gen = len(samples), args.gen_length
    run = runs[0]
    tps = [n * gen / r["seconds"] for r in runs]
    lat = [r["seconds"] / n for r in runs]
    scores = [score_sample(name, text, s)["score"] for (name, s), text in zip(samples, run["texts"], strict=True)]
    nfe = sum(run["nfe"]) / n
    return {
        "nfe": nfe,
        "tokens_per_step": gen / nfe if nfe else None,
        "tokens_per_s": statistics.median(tps),
        "tokens_per_s_spread": [min(tps), max(tps)],
        "latency_s_per_row": statistics.median(lat),
        "latency_s_per_row_spread": [min(lat), max(lat)],
        "token_forwards_per_token": run["forwards"] / (n * gen),
        "peak_mem_mb": None if mem is None else mem / 2**20,
        "cache_mb": run["cache_bytes"] / 2**20,
        "score": 100.0 * sum(scores) / n,
        "_ids": run["ids"],
    }


def _warm_pairs(
    model: Any, tok: Any, chats: list, pairs: list, common: dict, s_opts: dict, c_opts: dict, args: argparse.Namespace
) -> tuple[dict, dict, dict]:
    """Warm up (and check) every (sampler, cache) pair -> each pair's row head as far as its settings go, the decoding
    options of the pairs that apply, and their memory; a pair the request checks refuse is a skipped row."""
    heads: dict[tuple[str, str], dict[str, Any]] = {}
    kws: dict[tuple[str, str], dict[str, Any]] = {}
    mems: dict[tuple[str, str], int | None] = {}
    for s, c in pairs:
        kw = common | {"sampler": s, "sampler_options": s_opts.get(s, {}), "cache": c, "cache_options": c_opts.get(c)}
        fixed = get_sampler(s, s_opts.get(s)).traits.fixed_budget
        kw["steps"] = args.gen_length if (s, c) == BASELINE or not fixed else args.gen_length // args.k
        heads[(s, c)] = {"sampler": s, "cache": c, "steps": kw["steps"] if fixed else None}
        print(f"bench: warm-up {s} / {c}", file=sys.stderr)
        try:
            mems[(s, c)] = warm_pair(model, tok, chats, kw, args)
        except ValueError as e:
            if (s, c) == BASELINE:
                raise SystemExit(f"the baseline failed: {e}") from None
            heads[(s, c)]["skipped"] = str(e).splitlines()[0]
            continue
        kws[(s, c)] = kw
    return heads, kws, mems


def _rows_against_baseline(
    pairs: list, heads: dict, kws: dict, timed: dict, mems: dict, samples: list, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Each pair's row: its timed summary and its ratios to the baseline (the first pair) taken in the same run."""
    results: list[dict[str, Any]] = []
    base: dict[str, Any] = {}
    base_ids: list[list[int]] = []
    for p in pairs:
        row = heads[p]
        if p not in kws:
            results.append(row)
            continue
        row |= summarize_pair(timed[p], mems[p], samples, args)
        ids = row.pop("_ids")
        if not base:
            base, base_ids = row, ids
        row["same_as_baseline"] = sum(a == b for a, b in zip(ids, base_ids, strict=True)) / len(ids)
        row["score_delta"] = row["score"] - base["score"]
        row["speedup"] = row["tokens_per_s"] / base["tokens_per_s"]
        row["nfe_ratio"] = row["nfe"] / base["nfe"]
        row["forwards_ratio"] = row["token_forwards_per_token"] / base["token_forwards_per_token"]
        results.append(row)
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.versus_reference:
        print(json.dumps(versus_reference.main(args)))
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    samplers = _names(args.samplers, SAMPLERS, "sampler")
    caches = _names(args.caches, CACHES, "cache")
    s_opts, c_opts = _opts(args.sampler_opt, SAMPLERS, "sampler"), _opts(args.cache_opt, CACHES, "cache")
    names = [t.strip() for t in args.tasks.split(",") if t.strip()]
    tasks = load_tasks(args.data, names, limit=args.prompts, generate_seed=args.seed, exclude_official=True)
    picked = [(tasks[i % len(tasks)], i // len(tasks)) for i in range(args.prompts)]  # round robin over tasks
    chats = [t.messages(j) for t, j in picked]
    samples = [(t.config, t.samples[j]) for t, j in picked]
    model, tok = dlm_decode.load_model(args.model, dtype=args.dtype, device=args.device)
    pieces = set_compile(model, args.compile)
    if tok is None:
        raise SystemExit(f"{args.model} ships no tokenizer: the benchmark decodes chat prompts")
    common = {"gen_length": args.gen_length, "block_length": args.block_length, "temperature": 0.0, "seed": 0}
    pairs = [BASELINE] + [(s, c) for s in samplers for c in caches if (s, c) != BASELINE]
    # every pair is warmed up (and checked) first; then each repeat runs every pair once, the order reversed on odd
    # repeats, so a pair's ratio to the baseline compares runs taken side by side, not minutes apart
    heads, kws, mems = _warm_pairs(model, tok, chats, pairs, common, s_opts, c_opts, args)
    timed: dict[tuple[str, str], list[dict[str, Any]]] = {p: [] for p in kws}
    for r in tqdm(range(args.repeats), desc="timed passes", disable=None):
        for p in list(kws) if r % 2 == 0 else list(reversed(kws)):
            timed[p].append(decode_all(model, tok, chats, kws[p], args.batch_size))
    results = _rows_against_baseline(pairs, heads, kws, timed, mems, samples, args)
    print(format_results(results))
    device = next(model.parameters()).device
    print(
        json.dumps(
            {
                "bench": "speed",
                "model": str(args.model),
                "device": str(device),
                "dtype": args.dtype,
                "torch_threads": torch.get_num_threads(),
                "compile": args.compile,
                "compile_error": getattr(pieces, "error", None),
                "tasks": names,
                "prompts": len(chats),
                "gen_length": args.gen_length,
                "block_length": args.block_length,
                "batch_size": args.batch_size,
                "k": args.k,
                "repeats": args.repeats,
                "warmup": args.warmup,
                "memory": MEMORY_METHOD["cuda" if device.type == "cuda" else "cpu"],
                "baseline": {"sampler": BASELINE[0], "cache": BASELINE[1], "steps": args.gen_length},
                "results": results,
            }
        )
    )
    return 0


def format_results(results: list[dict[str, Any]]) -> str:
    def f(v: Any, d: int = 2) -> str:
        return "-" if v is None else f"{v:.{d}f}"

    head = ["sampler", "cache", "NFE", "tok/step", "tok/s", "x base", "s/row", "fwd/tok", "peak MB", "KV MB"]
    head += ["score", "d score", "same"]
    body = []
    for r in results:
        if r.get("skipped"):
            body.append([r["sampler"], r["cache"], "skipped: " + r["skipped"][:60]] + [""] * 10)
            continue
        body.append(
            [
                r["sampler"],
                r["cache"],
                f(r["nfe"], 1),
                f(r["tokens_per_step"]),
                f(r["tokens_per_s"], 1),
                f(r["speedup"]),
                f(r["latency_s_per_row"], 3),
                f(r["token_forwards_per_token"]),
                f(r["peak_mem_mb"], 1),
                f(r["cache_mb"], 1),
                f(r["score"], 1),
                f(r["score_delta"], 1),
                f(r["same_as_baseline"]),
            ]
        )
    return render_table(head, body)


if __name__ == "__main__":
    from dlm_decode.cli import run_script

    run_script(main, "benchmarks/bench_speed.py")
