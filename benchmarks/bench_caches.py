"""Cache benchmark: every registered cache with ``low_confidence`` and ``threshold`` against no cache, in one run.

    python benchmarks/bench_caches.py                      # gen 256 and 1024, batch 1 and 8, 3 repeats
    python benchmarks/bench_caches.py --quick              # smoke run: gen 64, batch 1 and 4, 1 repeat
    python benchmarks/bench_caches.py --model DIR --gen-lengths 256 --batches 8 --caches none,dual,dkv_decode
    python benchmarks/bench_caches.py --model random:llada-8b --dtype bfloat16 --device cuda   # LLaDA-8B widths, GPU

Model: ``--model`` (a checkpoint directory or demo name); by default the shipped ``demo-llada`` when present, else a
random tiny LLaDA built in memory (the run says which); ``random:llada-8b[:LAYERS]`` builds random weights with
LLaDA-8B's published widths (optionally fewer layers) on ``--device`` in ``--dtype``: real costs, meaningless tokens
(with random weights ``threshold`` commits few tokens per step, and near-ties make agreement low). Prompts: random
token ids of mixed lengths (batch 8: lengths 12..40; batch 1: the first), fixed by ``--seed``; with a tokenizer the
demo model gets chat prompts instead.
``low_confidence`` runs ``steps = gen_length`` (one token per step, the Fast-dLLM baseline), ``threshold`` its default
0.9; block length 32; fp32 unless ``--dtype``; temperature 0.

Per (gen length, batch, sampler, cache): one untimed warm-up generate (same shapes), then ``--repeats`` timed ones;
figures are medians. Time is ``GenerateOutput.seconds`` (the decode loop; tokenization excluded). Reported: tokens/s
(generated slots / s), NFE, token-forwards per generated token (query slots the model computed / generated slots),
peak memory of one extra untimed pass (CUDA: ``torch.cuda.max_memory_allocated`` minus the allocation before; CPU:
peak resident set size polled every millisecond from ``/proc/self/statm`` minus the RSS before -- approximate,
allocator reuse hides some), the K/V store size, agreement (share of generated tokens equal to the no-cache output of
the same sampler in this run), and ratios to that no-cache run (speed-up, NFE, token-forwards). On a busy CPU set
``--threads 1`` (default on CPU) for small models. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks' shared modules

from random_models import RANDOM_SHAPES, random_llada  # noqa: E402

import dlm_decode  # noqa: E402
from dlm_decode.cache import CACHES  # noqa: E402

SAMPLERS = ("low_confidence", "threshold")
CHATS = [
    "Repeat the list: 4 9 2 7 1 8 3.",
    "What is 17 + 25? Answer with the number only.",
    "Sort these letters: d a c b e.",
    "Name three colours.",
    "Reverse the word: diffusion.",
    "Count from 1 to 10.",
    "Write the sequence 2 4 6 8 and continue it.",
    "Say hello in one word.",
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="checkpoint directory or demo name (default: demo-llada if shipped)")
    p.add_argument("--gen-lengths", default="256,1024")
    p.add_argument("--batches", default="1,8")
    p.add_argument(
        "--caches",
        # every cache the bidirectional samplers run with (not sub_block: Fast-dLLM v2's sampler only)
        default=",".join(["none"] + sorted(c for c in CACHES if c != "none" and not CACHES[c].samplers)),
        help="comma-separated; a cache may carry options as NAME[KEY=VALUE;KEY=VALUE], e.g. window[prune_refresh=true]",
    )
    p.add_argument("--samplers", default=",".join(SAMPLERS))
    p.add_argument("--block-length", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16 (model weights and activations)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default 1 on CPU)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="gen 64, batch 1 and 4, 1 repeat")
    a = p.parse_args(argv)
    if a.quick:
        a.gen_lengths, a.batches, a.repeats = "64", "1,4", 1
    return a


# Random LLaDA shapes: the tiny one (CPU smoke runs) and LLaDA-8B's published widths (GPU runs; ``--layers`` may cut
# the depth, which scales every cache's cost alike). Random weights: the costs are real, the tokens meaningless.
def load(args: argparse.Namespace) -> tuple[Any, Any, str]:
    name = args.model
    if name is None:
        try:
            model, tok = dlm_decode.load_model("demo-llada", device=args.device)
            return model, tok, "demo-llada"
        except FileNotFoundError:
            return random_llada(args.device), None, "random tiny LLaDA built in memory (demo-llada is not shipped)"
    if name.startswith("random:"):
        shape, _, layers = name[len("random:") :].partition(":")
        if shape not in RANDOM_SHAPES:
            raise SystemExit(f"--model random:SHAPE[:LAYERS]: SHAPE is one of {sorted(RANDOM_SHAPES)}, got {shape!r}")
        model = random_llada(args.device, shape, int(layers) if layers else None, args.dtype)
        n = sum(p.numel() for p in model.parameters())
        return model, None, f"random LLaDA, {shape} widths, {model.config.n_layers} layers, {n / 1e9:.2f}B params"
    model, tok = dlm_decode.load_model(name, dtype=args.dtype, device=args.device)
    return model, tok, str(name)


def prompts(model: Any, tok: Any, batch: int, seed: int) -> tuple[list, bool]:
    if tok is not None:
        return CHATS[:batch], True
    g = torch.Generator().manual_seed(seed)
    vocab, mask = model.get_input_embeddings().weight.shape[0], model.mask_token_id
    lengths = [12 + (7 * i) % 29 for i in range(batch)]  # 12, 19, 26, 33, 40, 18, ...
    rows = []
    for n in lengths:
        ids = torch.randint(2, vocab, (n,), generator=g)
        rows.append([int(t) if t != mask else 3 for t in ids])
    return rows, False


class PeakMemory:
    """Peak allocation above the starting point: CUDA allocator statistics, or polled RSS on CPU."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")
        self.peak = 0

    def _rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def __enter__(self) -> PeakMemory:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        else:
            self.base, self.peak_rss, self.stop = self._rss(), 0, False
            self.thread = threading.Thread(target=self._poll, daemon=True)
            self.thread.start()
        return self

    def _poll(self) -> None:
        while not self.stop:
            self.peak_rss = max(self.peak_rss, self._rss())
            time.sleep(0.001)

    def __exit__(self, *exc: object) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated() - self.base
        else:
            self.stop = True
            self.thread.join()
            self.peak = max(self.peak_rss, self._rss()) - self.base


def parse_cache(spec: str) -> tuple[str, dict[str, str]]:
    """``window[prune_refresh=true;window_tokens=32]`` -> ("window", options); checked like ``--cache-opt``."""
    from dlm_decode.cache import get_cache
    from dlm_decode.options import parse_kv

    name, _, rest = spec.partition("[")
    opts = parse_kv([kv for kv in rest.rstrip("]").split(";") if kv])
    get_cache(name, opts)  # unknown names, options and bad values raise here
    return name, opts


def run_one(model, tok, rows, chat, sampler, cache, gen, block, device) -> Any:
    name, opts = cache  # parse_cache's result
    kw = dict(sampler=sampler, cache=name, cache_options=opts, gen_length=gen, block_length=min(block, gen))
    kw.update(tokenizer=tok, chat=chat)
    if sampler == "low_confidence":
        kw["steps"] = gen
    out = dlm_decode.generate(model, rows, **kw)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.device == "cpu":
        torch.set_num_threads(args.threads or 1)
    elif args.threads:
        torch.set_num_threads(args.threads)
    model, tok, model_name = load(args)
    print(f"model: {model_name}; device {args.device}; torch threads {torch.get_num_threads()}")
    caches = [c for c in args.caches.split(",") if c]
    if "none" not in caches:
        caches.insert(0, "none")
    specs = {c: parse_cache(c) for c in caches}  # unknown names and bad options fail before any work
    results: list[dict[str, Any]] = []
    cw = max(12, *(len(c) for c in caches))
    header = (
        f"{'gen':>5} {'B':>2} {'sampler':<15} {'cache':<{cw}} {'tok/s':>9} {'x none':>7} {'NFE':>5} "
        f"{'fwd/tok':>8} {'x fwd':>6} {'peak MB':>8} {'KV MB':>7} {'agree':>6}"
    )
    print(header)
    for gen in (int(x) for x in args.gen_lengths.split(",")):
        for batch in (int(x) for x in args.batches.split(",")):
            rows, chat = prompts(model, tok, batch, args.seed)
            for sampler in args.samplers.split(","):
                base: dict[str, Any] | None = None
                for cache in caches:
                    once = functools.partial(
                        run_one, model, tok, rows, chat, sampler, specs[cache], gen, args.block_length, args.device
                    )
                    once()  # warm-up
                    outs = [once() for _ in range(args.repeats)]
                    with PeakMemory(args.device) as mem:
                        once()
                    out = outs[0]
                    secs = statistics.median(o.seconds for o in outs)
                    n_gen = batch * gen
                    r = {
                        "gen_length": gen,
                        "batch": batch,
                        "sampler": sampler,
                        "cache": cache,
                        "tokens_per_s": n_gen / secs,
                        "seconds": secs,
                        "nfe": out.nfe,
                        "token_forwards_per_token": out.token_forwards / n_gen,
                        "peak_mem_mb": mem.peak / 2**20,
                        "kv_mb": out.cache_bytes / 2**20,
                        "refreshes": out.refreshes,
                        "tokens": out.generated.cpu(),
                    }
                    if cache == "none":
                        base = r
                    r["speedup"] = r["tokens_per_s"] / base["tokens_per_s"]
                    r["nfe_ratio"] = r["nfe"] / base["nfe"]
                    r["forward_ratio"] = r["token_forwards_per_token"] / base["token_forwards_per_token"]
                    r["agreement"] = float((r["tokens"] == base["tokens"]).float().mean())
                    print(
                        f"{gen:>5} {batch:>2} {sampler:<15} {cache:<{cw}} {r['tokens_per_s']:>9.1f} "
                        f"{r['speedup']:>7.2f} {r['nfe']:>5} {r['token_forwards_per_token']:>8.1f} "
                        f"{r['forward_ratio']:>6.2f} {r['peak_mem_mb']:>8.1f} {r['kv_mb']:>7.2f} "
                        f"{r['agreement']:>6.2f}",
                        flush=True,
                    )
                    results.append(r)
    for r in results:
        del r["tokens"]
    summary = {
        "benchmark": "bench_caches",
        "model": model_name,
        "device": args.device,
        "torch_threads": torch.get_num_threads(),
        "repeats": args.repeats,
        "block_length": args.block_length,
        "peak_memory": "cuda max_memory_allocated"
        if args.device.startswith("cuda")
        else "polled RSS (/proc/self/statm)",
        "results": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()} for r in results],
    }
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    from dlm_decode.cli import run_script

    run_script(main, "benchmarks/bench_caches.py")
