"""How fast the block-diffusion loops could be with no host work at all (issue 46 item 7): each decode of
``bench_block_diffusion.py`` split into the model's forwards and the rest.

``bench_block_diffusion.py`` times three whole decodes on a random LLaDA2 checkpoint: ours with the exact cache, the
reference ``generate()`` re-stated without a cache, an SDAR / dInfer-style cached loop. Here the same three decodes
(the same checkpoint, ``bench_block_diffusion.random_model``; the same prompts, rule and tokens) run with the model's
two entry points timed (``denoise``, which ours and the SDAR-style loop call, and ``forward``, which the reference
calls). Per way: the whole decode's seconds, the forwards' seconds and the host's (the difference: selection, the
loop's bookkeeping, Python). From them:

* ``<way>_over_ours`` as measured (what ``bench_block_diffusion.py`` reports);
* ``<way>_over_ours_forwards``: the way as measured over our forwards alone, the ratio a loop of ours with no host
  work at all would reach on this model. A target above it cannot be met by the loop; only a faster forward (or a
  cheaper model) could meet it.

And ``T(R)``, one uncached batch-1 forward of ``R`` rows (``--rows``): what a forward's cost is made of. Its value at
one row is about the weights' traffic, its slope the arithmetic; ours runs about 34 rows a forward at batch 1 (a
block of 32, 64 at a block's first step), the reference 96-320 (208 on average at prompt 64, gen 256).

One untimed decode of each way first, then ``--repeats`` rounds in rotating order (interleaved), medians. CPU, one
thread by default. The last line is one JSON object.

    OMP_NUM_THREADS=1 python benchmarks/forward_bound.py --hidden 1024 --batches 1,8 --plot runs/forward_bound.png
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks' shared modules
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the reference re-statements
from bench_block_diffusion import WAYS, random_model, random_prompts, run_once  # noqa: E402
from interleaved import seconds  # noqa: E402
from llada2_reference import EOS, MASK  # noqa: E402


class ForwardClock:
    """Times the model's ``denoise`` and ``forward`` calls (the outermost only) while installed."""

    def __init__(self, model) -> None:
        self.model, self.seconds, self.calls, self._depth = model, 0.0, 0, 0

    def _wrap(self, fn):
        def timed(*a, **kw):
            self._depth += 1
            start = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self.seconds += time.perf_counter() - start
                    self.calls += 1

        return timed

    def __enter__(self) -> ForwardClock:
        self.model.denoise = self._wrap(self.model.denoise)  # instance attributes shadow the methods
        self.model.forward = self._wrap(self.model.forward)
        return self

    def __exit__(self, *exc) -> None:
        del self.model.denoise, self.model.forward


def split(model, prompts, args, repeats: int) -> dict:
    """Per way: median whole-decode seconds, forward seconds and forward calls over interleaved repeats."""
    for w in WAYS:  # untimed warm-up
        run_once(w, model, prompts[:1], args, (MASK, EOS))
    got = {w: {"total": [], "forwards": []} for w in WAYS}
    calls, answers = {}, {}
    for rep in range(repeats):
        for w in WAYS[rep % len(WAYS) :] + WAYS[: rep % len(WAYS)]:
            with ForwardClock(model) as clock:
                total, out, _ = run_once(w, model, prompts, args, (MASK, EOS))
            got[w]["total"].append(total)
            got[w]["forwards"].append(clock.seconds)
            calls[w], answers[w] = clock.calls, out
    entry = {"same_tokens": all(answers[w] == answers["ours"] for w in WAYS), "forward_calls": calls}
    for w in WAYS:
        total, fwd = statistics.median(got[w]["total"]), statistics.median(got[w]["forwards"])
        entry[w] = {"seconds": total, "forward_s": fwd, "host_s": total - fwd, "host_share": 1 - fwd / total}
    for w in WAYS[1:]:
        entry[f"{w}_over_ours"] = entry[w]["seconds"] / entry["ours"]["seconds"]
        entry[f"{w}_over_ours_forwards"] = entry[w]["seconds"] / entry["ours"]["forward_s"]
    return entry


@torch.no_grad()
def rows_curve(model, rows: list[int], repeats: int, block: int) -> dict[int, float]:
    """Median seconds of one uncached batch-1 forward of R rows (block-causal), for each R, rotating order."""
    g = torch.Generator().manual_seed(1)
    calls = {r: (lambda r=r: model(torch.randint(2, MASK - 1, (1, r), generator=g), block_length=block)) for r in rows}
    got = {r: [] for r in rows}
    for rep in range(repeats):
        for r in rows[rep % len(rows) :] + rows[: rep % len(rows)]:
            got[r].append(seconds(calls[r], 1))
    return {r: statistics.median(v) for r, v in got.items()}


def plot(curve: dict[int, float], path: Path, marks: dict[str, float], model_config) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    r = sorted(curve)
    ax.plot(r, [1e3 * curve[i] for i in r], marker="o")
    ax.set_ylim(bottom=0)  # the intercept (the weights' traffic) against the whole
    for label, x in marks.items():
        ax.axvline(x, ls="--", c="grey")
        ax.text(x, ax.get_ylim()[1] * 0.95, f" {label}", va="top", fontsize=8)
    ax.set_xlabel("rows in the forward (batch 1, uncached)")
    ax.set_ylabel("ms per forward")
    c = model_config
    ax.set_title(f"random LLaDA2, hidden {c.hidden_size}, {c.num_experts} experts top {c.num_experts_per_tok}, "
                 f"{c.num_hidden_layers} layers, {torch.get_num_threads()} thread(s)", fontsize=9)  # fmt: skip
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=1024, help="the random model's hidden size")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--gen", type=int, default=256)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--threshold", type=float, default=0.95)
    ap.add_argument("--rows", default="1,8,16,32,64,128,208,320", help="T(R): rows of the uncached forwards")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--layers", type=int, default=None, help="layers of the random model (default 4)")
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--plot", type=Path, default=None, help="write T(R) as a PNG here")
    args = ap.parse_args(argv)
    try:
        batches = [int(b) for b in args.batches.split(",")]
        rows = [int(r) for r in args.rows.split(",")]
    except ValueError as e:
        ap.error(f"--batches and --rows are comma-separated whole numbers: {e}")
    if min(batches) < 1 or min(rows) < 1 or args.repeats < 1 or min(args.prompt, args.gen, args.block) < 1:
        ap.error("--batches, --rows, --repeats, --prompt, --gen and --block must be >= 1")
    torch.set_num_threads(args.threads)
    model = random_model(args.hidden, args)
    keys = ("hidden", "prompt", "gen", "block", "steps", "threshold", "repeats", "threads")
    result = {k: getattr(args, k) for k in keys} | {"runs": {}}
    for batch in batches:
        prompts = random_prompts(batch, args.prompt, MASK - 1)  # bench_block_diffusion.py's for this batch
        entry = split(model, prompts, args, args.repeats)
        result["runs"][f"batch {batch}"] = entry
        parts = ", ".join(f"{w} {entry[w]['seconds']:.2f} s ({100 * entry[w]['host_share']:.0f}% host)" for w in WAYS)
        ratios = ", ".join(f"{w} / ours {entry[f'{w}_over_ours']:.2f}x (over our forwards alone "
                           f"{entry[f'{w}_over_ours_forwards']:.2f}x)" for w in WAYS[1:])  # fmt: skip
        print(f"batch {batch}: {parts}; same tokens {entry['same_tokens']}; {ratios}", flush=True)
    curve = rows_curve(model, rows, args.repeats, args.block)
    result["rows_s"] = {str(r): s for r, s in curve.items()}
    print("T(R): " + ", ".join(f"{r} rows {1e3 * s:.1f} ms" for r, s in curve.items()), flush=True)
    if args.plot:
        plot(curve, args.plot, {"ours ~34": 34.5, "reference ~208": 208}, model.config)
        result["plot"] = str(args.plot)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
