"""The continuous-batching engine against static batches (issue 74 item 7): offline throughput, online latency under
Poisson arrivals, and the K/V memory each holds.

    OMP_NUM_THREADS=1 python benchmarks/bench_engine.py --model llada --width 1024 --requests 24 --max-batch 8

A request stream (seeded): prompt lengths drawn from ``--prompt-lengths`` (default 16-512), gen lengths from
``--gen-lengths`` (32-256, multiples of the block 32), samplers alternating ``threshold`` (0.9) and
``low_confidence`` (steps = gen / 2), every request with the ``--cache`` (default ``prefix``). Models: a random LLaDA
(``--model llada``: d_model ``--width``, ``--layers``, vocab ``--vocab``; its weights in ``load_model``'s layout),
a random LLaDA2 (``--model llada2``: hidden ``--width``, 8 routed experts), a random LLaDA of a published shape on
``--device`` in ``--dtype`` (``--model random:llada-8b``: LLaDA-8B's widths, ``--layers`` of them; issue 74's GPU
target) or a shipped demo model (``--model demo-llada2``: ParallelBench-style prompts from the task generator, whose
answers stop at EOS in different blocks).

Offline (every request present at the start), three ways, the order rotating per repeat (interleaved), median:
* ``engine``: ``Engine(max_batch, admission).generate_many(stream)`` (``--admission``, default ``longest``: the
  longest requests start first, the order for an offline list; ``arrival``: as they came);
* ``static``: ``generate`` in static batches of ``max_batch`` requests grouped by options (the best a caller can do
  without the engine: one call takes one set of options), each group sorted by prompt length;
* ``alone``: ``generate`` one request at a time.
Tokens/s counts answer tokens (up to the first EOS). The three ways' tokens are compared (``same_tokens``).

Online: arrivals at ``--loads`` (default 0.5, 0.8, 1.0) of the engine's measured offline capacity (requests/s;
``--capacity`` gives it instead and skips the offline part), Poisson (seeded), ``--online-requests`` per load. The
engine runs in its background thread, first come first served (``admission="arrival"``, as a server runs it); the
static batcher takes the oldest waiting request's option group and runs it as soon as ``max_batch`` of them wait or
the oldest has waited ``--batch-wait`` (0.1 s). Per way: p50 / p95 / p99 latency (arrival to answer) and queueing
delay (arrival to the first forward), and the ratio of p95s.

Memory: the K/V bytes each way holds: the engine's arena (``max_batch`` rows of the longest canvas) against the
largest static batch's store. The last line is one JSON object (with the thread count).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import dlm_decode  # noqa: E402
from dlm_decode.engine import Engine  # noqa: E402
from dlm_decode.engine.engine import ADMISSIONS  # noqa: E402
from dlm_decode.models.layout import set_layout  # noqa: E402

BLOCK = 32


def build_model(args) -> tuple[Any, Any]:
    """(model, tokenizer or None) for ``--model``."""
    if args.model.startswith("random:"):  # a published shape (``random_models.RANDOM_SHAPES``), on --device
        from random_models import random_llada

        shape = args.model.split(":", 1)[1]
        return random_llada(args.device, shape, layers=args.layers, dtype=args.dtype), None
    if args.model == "llada":
        from dlm_decode.models.llada import LLaDAConfig, LLaDAModelLM

        w, v = args.width, args.vocab
        cfg = LLaDAConfig(
            d_model=w, n_layers=args.layers, n_heads=max(2, w // 128), n_kv_heads=max(2, w // 128),
            mlp_hidden_size=int(2.75 * w), vocab_size=v, embedding_size=v, max_sequence_length=4096,
            rope_theta=500000.0, mask_token_id=v - 1, eos_token_id=1, pad_token_id=1,
        )  # fmt: skip
        torch.manual_seed(0)
        model = LLaDAModelLM(cfg).eval()
        with torch.no_grad():  # spread the logits so confidences vary like a trained model's
            model.model.transformer.ff_out.weight.mul_(40.0 * (128 / w) ** 0.5)
            model.model.transformer.ff_out.weight[v - 1] = 0.0
        set_layout(model, "auto")  # as ``load_model`` stores a checkpoint's weights (column-major on the CPU in fp32)
        return model, None
    if args.model == "llada2":
        from llada2_reference import write_llada2

        w = args.width
        with tempfile.TemporaryDirectory() as tmp:
            path = write_llada2(
                Path(tmp) / "m", seed=0, hidden_size=w, num_hidden_layers=args.layers, vocab_size=args.vocab,
                head_dim=min(128, w // 4), num_attention_heads=max(4, w // 128),
                num_key_value_heads=max(4, w // 128) // 2, moe_intermediate_size=w // 2, intermediate_size=2 * w,
                max_position_embeddings=4096,
            )  # fmt: skip
            model, _ = dlm_decode.load_model(path)
        with torch.no_grad():
            model.lm_head.weight[model.mask_token_id] = 0.0
        return model, None
    return dlm_decode.load_model(args.model)


def make_stream(model, tok, args) -> list[dict[str, Any]]:
    """The seeded request stream (see the module docstring)."""
    rng = random.Random(args.seed)
    lo, hi = args.prompt_lengths
    gens = [g for g in range(args.gen_lengths[0], args.gen_lengths[1] + 1, BLOCK)]
    prompts = demo_prompts(tok, args) if tok is not None else None
    vocab, mask = model.get_input_embeddings().weight.shape[0], model.mask_token_id
    out = []
    for i in range(args.requests):
        gen = rng.choice(gens)
        if prompts is not None:
            prompt = prompts[i % len(prompts)]
        else:
            prompt = [t if t != mask else 3 for t in (rng.randrange(3, vocab) for _ in range(rng.randint(lo, hi)))]
        opts: dict[str, Any] = {"cache": args.cache, "gen_length": gen, "block_length": BLOCK}
        if i % 2 == 0:
            opts |= {"sampler": "threshold", "sampler_options": {"threshold": 0.9}}
        else:
            opts |= {"sampler": "low_confidence", "steps": gen // 2}
        out.append({"prompt": prompt} | opts)
    return out


def demo_prompts(tok, args) -> list[list[int]]:
    """Chat-encoded ParallelBench-style prompts: the demo's shipped held-out tasks (generated, not the official
    test samples), task after task."""
    from dlm_decode.core.inputs import encode_prompts
    from dlm_decode.demo import HELD_OUT_FILE
    from dlm_decode.parallelbench.tasks import build_messages

    tasks = json.loads(HELD_OUT_FILE.read_text())["tasks"]
    chats = [build_messages(t["config"], s) for i in range(8) for t in tasks for s in t["samples"][i : i + 1]]
    return encode_prompts(chats, tok, True)


def answer_len(ids: list[int], eos: set[int]) -> int:
    return next((j for j, t in enumerate(ids) if t in eos), len(ids))


def options_key(req: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in req.items() if k != "prompt"}, sort_keys=True)


def run_engine(model, tok, stream, args) -> tuple[float, list[list[int]], int]:
    eng = Engine(model, tok, max_batch=args.max_batch, admission=args.admission)
    start = time.perf_counter()
    results = eng.generate_many([dict(r) for r in stream])
    seconds = time.perf_counter() - start
    assert all(r.error is None for r in results), [r.error for r in results if r.error]
    return seconds, [r.generated_ids for r in results], eng.arena.nbytes


def static_batches(stream, max_batch) -> list[list[int]]:
    """Request indices in static batches: grouped by options, sorted by prompt length, cut at ``max_batch``."""
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(stream):
        groups.setdefault(options_key(r), []).append(i)
    out = []
    for idx in groups.values():
        idx.sort(key=lambda i: len(stream[i]["prompt"]))
        out += [idx[j : j + max_batch] for j in range(0, len(idx), max_batch)]
    return out


def run_generate(model, tok, stream, batches) -> tuple[float, list[list[int]], int]:
    ids: list[list[int] | None] = [None] * len(stream)
    peak = 0
    start = time.perf_counter()
    for batch in batches:
        opts = {k: v for k, v in stream[batch[0]].items() if k != "prompt"}
        out = dlm_decode.generate(model, [stream[i]["prompt"] for i in batch], tokenizer=tok, **opts)
        peak = max(peak, out.cache_bytes)
        for i, row in zip(batch, out.rows, strict=True):
            ids[i] = row.generated_ids
    return time.perf_counter() - start, ids, peak


def offline(model, tok, stream, args) -> dict[str, Any]:
    eos = set(model.eos_token_ids)
    ways = {
        "engine": lambda: run_engine(model, tok, stream, args),
        "static": lambda: run_generate(model, tok, stream, static_batches(stream, args.max_batch)),
        "alone": lambda: run_generate(model, tok, stream, [[i] for i in range(len(stream))]),
    }
    names = [w for w in ways if w != "alone" or not args.skip_alone]
    secs: dict[str, list[float]] = {w: [] for w in names}
    ids: dict[str, list] = {}
    memory: dict[str, int] = {}
    for rep in range(args.repeats):
        for w in names[rep % len(names) :] + names[: rep % len(names)]:
            s, got, mem = ways[w]()
            secs[w].append(s)
            ids[w], memory[w] = got, mem
    tokens = sum(answer_len(x, eos) for x in ids["engine"])
    tps = {w: tokens / statistics.median(secs[w]) for w in names}
    entry = {"tokens": tokens, "seconds": {w: statistics.median(secs[w]) for w in names}, "tokens_per_s": tps}
    entry["same_tokens"] = all(ids[w] == ids["engine"] for w in names)
    entry["engine_over_static"] = tps["engine"] / tps["static"]
    if "alone" in tps:
        entry["engine_over_alone"] = tps["engine"] / tps["alone"]
    entry["kv_bytes"] = {"engine_arena": memory["engine"], "static_largest_batch": memory["static"]}
    entry["capacity_rps"] = len(stream) / entry["seconds"]["engine"]
    return entry


def percentiles(xs: list[float]) -> dict[str, float]:
    q = statistics.quantiles(xs, n=100, method="inclusive") if len(xs) > 1 else [xs[0]] * 99
    return {"p50": q[49], "p95": q[94], "p99": q[98], "mean": statistics.fmean(xs)}


def online_engine(model, tok, stream, arrivals, args) -> tuple[list[float], list[float]]:
    eng = Engine(model, tok, max_batch=args.max_batch).start()
    t0 = time.perf_counter()
    handles = []
    for r, at in zip(stream, arrivals, strict=True):
        time.sleep(max(0.0, t0 + at - time.perf_counter()))
        opts = dict(r)
        handles.append(eng.submit(opts.pop("prompt"), **opts))
    results = [h.result() for h in handles]
    eng.stop()
    rows = list(zip(handles, results, arrivals, strict=True))
    lat = [h.submitted + r.queued_seconds + r.seconds - (t0 + at) for h, r, at in rows]
    queue = [h.submitted + r.queued_seconds - (t0 + at) for h, r, at in rows]
    return lat, queue


def online_static(model, tok, stream, arrivals, args) -> tuple[list[float], list[float]]:
    """A static batcher: the oldest waiting request's option group, run when full or after ``--batch-wait``."""
    t0, n = time.perf_counter(), len(stream)
    lat, queue = [0.0] * n, [0.0] * n
    waiting: list[int] = []
    nxt = 0
    while nxt < n or waiting:
        now = time.perf_counter() - t0
        while nxt < n and arrivals[nxt] <= now:
            waiting.append(nxt)
            nxt += 1
        if not waiting:
            time.sleep(max(0.0, arrivals[nxt] - now))
            continue
        key = options_key(stream[waiting[0]])
        group = [i for i in waiting if options_key(stream[i]) == key][: args.max_batch]
        deadline = arrivals[waiting[0]] + args.batch_wait
        if len(group) < args.max_batch and now < deadline and nxt < n:
            time.sleep(max(0.0, min(deadline, arrivals[nxt]) - now))
            continue
        start = time.perf_counter() - t0
        run_generate(model, tok, stream, [group])
        end = time.perf_counter() - t0
        for i in group:
            waiting.remove(i)
            lat[i], queue[i] = end - arrivals[i], start - arrivals[i]
    return lat, queue


def online(model, tok, stream, capacity, args) -> dict[str, Any]:
    out = {}
    for j, load in enumerate(args.loads):
        rng = random.Random(args.seed + j)
        rate = load * capacity
        arrivals, t = [], 0.0
        for _ in stream:
            t += rng.expovariate(rate)
            arrivals.append(t)
        ways = [("engine", online_engine), ("static", online_static)][:: 1 if j % 2 == 0 else -1]
        entry: dict[str, Any] = {"rate_rps": rate}
        for name, fn in ways:
            lat, queue = fn(model, tok, stream, arrivals, args)
            entry[name] = {"latency": percentiles(lat), "queueing": percentiles(queue)}
        entry["p95_engine_over_static"] = entry["engine"]["latency"]["p95"] / entry["static"]["latency"]["p95"]
        out[f"{load:g}"] = entry
    return out


def pair(text: str, name: str) -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in text.split("-"))
    except ValueError:
        raise ValueError(f"{name} must be LO-HI (integers), got {text!r}") from None
    if not 1 <= lo <= hi:
        raise ValueError(f"{name} must satisfy 1 <= LO <= HI, got {text!r}")
    return lo, hi


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--model",
        default="llada",
        help="llada | llada2 (random checkpoints) | random:SHAPE (e.g. random:llada-8b) | a demo model",
    )
    ap.add_argument("--device", default="cpu", help="random:SHAPE models only (e.g. cuda)")
    ap.add_argument("--dtype", default="float32", help="random:SHAPE models only (float32, bfloat16, float16)")
    ap.add_argument("--width", type=int, default=1024, help="random models: d_model / hidden size")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--requests", type=int, default=24, help="offline stream length")
    ap.add_argument("--online-requests", type=int, default=24, help="requests per online load (0: no online part)")
    ap.add_argument("--prompt-lengths", default="16-512")
    ap.add_argument("--gen-lengths", default="32-256")
    ap.add_argument("--cache", default="prefix")
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--loads", default="0.5,0.8,1.0")
    ap.add_argument("--batch-wait", type=float, default=0.1)
    ap.add_argument("--admission", default="longest", help="the offline engine's order: longest | arrival")
    ap.add_argument(
        "--capacity", type=float, default=None,
        help="requests/s the online loads are fractions of; skips the offline part (default: measure it offline)",
    )  # fmt: skip
    ap.add_argument("--skip-alone", action="store_true", help="leave out the one-at-a-time way (slow)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.prompt_lengths = pair(args.prompt_lengths, "--prompt-lengths")
    args.gen_lengths = pair(args.gen_lengths, "--gen-lengths")
    if args.gen_lengths[0] % BLOCK:
        raise ValueError(f"--gen-lengths must start at a multiple of the block {BLOCK}, got {args.gen_lengths[0]}")
    try:
        args.loads = [float(x) for x in args.loads.split(",")]
    except ValueError:
        raise ValueError(f"--loads must be comma-separated numbers, got {args.loads!r}") from None
    for name in ("requests", "max_batch", "repeats", "threads", "width", "layers"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if any(x <= 0 for x in args.loads):
        raise ValueError("--loads must be positive")
    if args.admission not in ADMISSIONS:
        raise ValueError(f"--admission must be one of {', '.join(ADMISSIONS)}, got {args.admission!r}")
    if args.capacity is not None and (args.capacity <= 0 or not args.online_requests):
        raise ValueError(f"--capacity must be a positive rate and needs --online-requests, got {args.capacity!r}")
    if args.dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"--dtype must be float32, bfloat16 or float16, got {args.dtype!r}")
    if args.model.startswith("random:"):
        from random_models import RANDOM_SHAPES

        if args.model.split(":", 1)[1] not in RANDOM_SHAPES:
            raise ValueError(f"--model random:SHAPE takes one of {sorted(RANDOM_SHAPES)}, got {args.model!r}")
    elif args.device != "cpu" or args.dtype != "float32":
        raise ValueError(f"--device / --dtype other than cpu / float32 need --model random:SHAPE, got {args.model!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    model, tok = build_model(args)
    stream = make_stream(model, tok, args)
    with torch.no_grad():
        run_engine(model, tok, stream[:2], args)  # warm-up
        synthetic = args.model in ("llada", "llada2") or args.model.startswith("random:")  # a demo model: its own
        result: dict[str, Any] = {"model": args.model} | (
            {"width": model.get_input_embeddings().weight.shape[1], "layers": args.layers} if synthetic else {}
        )
        result |= {"max_batch": args.max_batch, "requests": args.requests, "threads": torch.get_num_threads()}
        result |= {"online_requests": args.online_requests, "admission": args.admission}
        result |= {"device": args.device, "dtype": args.dtype}
        if args.capacity is None:
            result["offline"] = off = offline(model, tok, stream, args)
            print(f"offline: {json.dumps(off)}", flush=True)
        result["capacity_rps"] = args.capacity or off["capacity_rps"]
        if args.online_requests:
            args.requests = args.online_requests
            result["online"] = online(model, tok, make_stream(model, tok, args), result["capacity_rps"], args)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    from dlm_decode.cli import run_script

    run_script(main, "bench_engine.py")
