"""``dlm-decode serve`` under load (issue 75): concurrent HTTP clients with Poisson arrivals, against the engine
in-process (what HTTP costs) and against a server decoding one request at a time (``--max-batch 1``).

Three setups decode the same requests: ``engine`` (``Engine.submit`` from the client threads, no HTTP), ``http``
(the server on a loopback port, on that same engine) and ``http-batch1`` (a server whose engine runs one request at a
time). For each number of clients (``--clients``): ``--requests`` chat requests arrive as a Poisson process of
``--rate`` per second (exponential gaps, seeded); a free client sends the next arrived one and waits for its answer
(so at most that many are in flight). Per setup and client count: requests and completion tokens per second over
the wall time, and the p50 / p95 latency (send to answer). At each client count the setups run one after another
(a busy machine's drift hits them alike). Every answer is compared across the setups (``answers_equal``: each
request decodes as it would alone, so they must agree). One untimed request per setup first.
CPU, one torch thread by default. The last line is one JSON object.

    OMP_NUM_THREADS=1 python benchmarks/bench_serving.py --model demo-llada2 --clients 1,4,16,64 --requests 64
"""

from __future__ import annotations

import argparse
import json
import queue
import random
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import torch

import dlm_decode
from dlm_decode.engine import Engine
from dlm_decode.serve.app import ServeConfig, create_app
from dlm_decode.serve.server import serve_in_thread

ITEMS = ["pear, apple, fig", "Mary, David, Lisa, Tom", "red, blue, green", "ten, two, six, one", "cat, dog, cow"]
TASKS = ["Sort", "Reverse", "Copy"]


def prompts(n: int) -> list[list[dict[str, str]]]:
    """``n`` small chat requests (waiting-line style), varied."""
    return [[{"role": "user", "content": f"{TASKS[i % 3]}: {ITEMS[i % len(ITEMS)]}"}] for i in range(n)]


def load(send: Callable[[int], tuple[str, int]], n: int, clients: int, rate: float, seed: int) -> dict[str, Any]:
    """Send requests 0..n-1 from ``clients`` threads as they arrive (Poisson, ``rate`` a second)."""
    rng, t, arrivals = random.Random(seed), 0.0, queue.Queue()
    for i in range(n):
        t += rng.expovariate(rate)
        arrivals.put((i, t))
    latencies, texts, tokens = [], [None] * n, [0] * n
    start = time.perf_counter()

    def client() -> None:
        while True:
            try:
                i, at = arrivals.get_nowait()
            except queue.Empty:
                return
            time.sleep(max(0.0, start + at - time.perf_counter()))
            t0 = time.perf_counter()
            texts[i], tokens[i] = send(i)
            latencies.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - start
    lat = sorted(latencies)
    return {
        "clients": clients,
        "req_per_s": round(n / wall, 3),
        "tokens_per_s": round(sum(tokens) / wall, 2),
        "p50_s": round(statistics.median(lat), 4),
        "p95_s": round(lat[min(len(lat) - 1, int(0.95 * len(lat)))], 4),
        "wall_s": round(wall, 3),
        "texts": texts,
    }


def engine_sender(engine: Engine, reqs: list, gen: int) -> Callable[[int], tuple[str, int]]:
    def send(i: int) -> tuple[str, int]:
        r = engine.submit(reqs[i], chat=True, gen_length=gen).result()
        return r.text, len(r.completion_ids)

    return send


def http_sender(url: str, reqs: list, gen: int) -> Callable[[int], tuple[str, int]]:
    local = threading.local()

    def send(i: int) -> tuple[str, int]:
        if not hasattr(local, "c"):
            local.c = httpx.Client(base_url=url, timeout=600)  # one keep-alive connection a client
        r = local.c.post("/v1/chat/completions", json={"messages": reqs[i], "max_tokens": gen})
        r.raise_for_status()
        body = r.json()
        return body["choices"][0]["message"]["content"], body["usage"]["completion_tokens"]

    return send


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="demo-llada2")
    ap.add_argument("--clients", default="1,4,16,64", help="comma-separated client counts")
    ap.add_argument("--requests", type=int, default=64, help="requests per client count")
    ap.add_argument("--rate", type=float, default=16.0, help="Poisson arrivals per second")
    ap.add_argument("--gen-length", type=int, default=32)
    ap.add_argument("--max-batch", type=int, default=16, help="the engine's rows (the http and engine setups)")
    ap.add_argument("--setups", default="engine,http,http-batch1")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    clients = [int(c) for c in args.clients.split(",") if c.strip()]
    setups = [s for s in args.setups.split(",") if s]
    bad = sorted(set(setups) - {"engine", "http", "http-batch1"})
    if bad or not clients or min(clients) < 1 or args.requests < 1 or args.rate <= 0:
        raise SystemExit("bad --setups / --clients / --requests / --rate (setups: engine, http, http-batch1)")
    torch.set_num_threads(args.threads)
    model, tok = dlm_decode.load_model(args.model)
    reqs, rows = prompts(args.requests), []
    shared = Engine(model, tok, max_batch=args.max_batch)
    single = Engine(model, tok, max_batch=1)
    name = str(args.model)
    with (
        serve_in_thread(create_app(ServeConfig(name, max_waiting=1024), engine=shared)) as url,
        serve_in_thread(create_app(ServeConfig(name, max_waiting=1024), engine=single)) as url1,
    ):
        senders = {
            "engine": engine_sender(shared, reqs, args.gen_length),
            "http": http_sender(url, reqs, args.gen_length),
            "http-batch1": http_sender(url1, reqs, args.gen_length),
        }
        for setup in setups:
            senders[setup](0)  # untimed
        for c in clients:  # the setups side by side at each client count: a busy machine's drift hits them alike
            for setup in setups:
                row = {"setup": setup, **load(senders[setup], args.requests, c, args.rate, args.seed)}
                rows.append(row)
                print({k: v for k, v in row.items() if k != "texts"}, flush=True)
    texts = [r.pop("texts") for r in rows]
    keys = ("model", "requests", "rate", "gen_length", "max_batch", "seed")
    out = {k: getattr(args, k) for k in keys} | {"threads": torch.get_num_threads(), "results": rows}
    out["answers_equal"] = all(t == texts[0] for t in texts)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    from dlm_decode.cli import run_script

    run_script(main, "bench_serving.py")
