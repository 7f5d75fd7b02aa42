"""Multi-block decoding speed (issue 77 item 7): several blocks in flight (D2F, d3LLM) against block-by-block
decoding with the same sampler, the same cache and the same attention, on random checkpoints.

    OMP_NUM_THREADS=1 python benchmarks/bench_multi_block.py --batches 1,8 --blocks 32,8 --repeats 3

Five cases, each decoded two ways: ``blocks`` (the sampler as it is: one block at a time) and ``multi`` (the same
sampler with ``block_add_threshold`` / ``decoded_token_threshold``, the D2F and d3LLM presets' 0.1 / 0.95):

* ``d2f_prefix``: random LLaDA, ``threshold`` under D2F's ``attention="answer_block_causal"``, the exact ``prefix``
  cache; ``d2f_none``: the same without a cache (the exact cache must give its tokens: ``same_tokens_as_d2f_none``);
* ``d3llm_none``: random LLaDA (bidirectional), ``entropy_threshold``, no cache; ``d3llm_delayed``: the same with
  d3LLM's ``delayed`` cache (``cache_delay_iter`` 1, no refresh, as the ``d3llm_llada`` preset);
* ``llada2_prefix``: a random LLaDA2 (block-causal, ``tests/llada2_reference.py``'s format, 8 routed experts),
  ``threshold`` with the exact ``prefix`` cache.

Random weights: the LLaDA is ``random_models.random_llada`` (LLaDA-8B's vocabulary, 126,464, and ids at ``--width``,
``--layers``; its LM head scaled for logits of std ~9), the LLaDA2 is ``bench_block_diffusion.random_model``
(weights of std 0.3: logits of std ~7 at width 512) at ``--llada2-vocab``. Random weights are confident at nothing
in particular: at width 512 the published thresholds (0.9, eta 0.5) commit about one token a forward block by block,
leaving multi-block nothing to overlap, so the defaults are ``--threshold`` 0.6 / ``--eta`` 1.0 (2-6 tokens a
forward block by block). The EOS rows of the LM heads are zeroed, so every row decodes its whole ``--gen`` (no early
end shortens one way's answer; ``early_stop`` would never fire, so it is left off).

Timing as ``bench_block_diffusion.py``: one untimed decode of one prompt and one block per case and way (warm-up),
then ``--repeats`` rounds, each decoding the batch both ways in an order that alternates per round (interleaved);
the median over rounds. Per case, batch and block: forwards (NFE), tokens/s, slots computed a forward (the model's
query slots, ``token_forwards / nfe``) and logit slots a forward (rows through the LM head: the sampler's region),
the time ratio (``blocks`` seconds / ``multi`` seconds) against the NFE ratio (``blocks`` forwards / ``multi``
forwards). ``bound``: ``forwards`` where the time ratio reaches 0.9 of the NFE ratio (a forward costs the same both
ways, so the forward count bounds the speed-up), else ``per-forward work`` (multi-block computes and scores more
slots a forward: ``ms_per_forward_ratio`` says how much dearer its forwards are). ``--quick``: tiny models and
lengths (the smoke test). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the LLaDA2 checkpoint format
from bench_block_diffusion import random_model, random_prompts  # noqa: E402
from llada2_reference import MASK as LLADA2_MASK  # noqa: E402
from random_models import random_ids, random_llada  # noqa: E402

import dlm_decode  # noqa: E402

WAYS = ("blocks", "multi")
# case -> (model, sampler, attention, cache, cache options)
CASES = {
    "d2f_prefix": ("llada", "threshold", "answer_block_causal", "prefix", None),
    "d2f_none": ("llada", "threshold", "answer_block_causal", "none", None),
    "d3llm_none": ("llada", "entropy_threshold", None, "none", None),
    "d3llm_delayed": ("llada", "entropy_threshold", None, "delayed", {"cache_delay_iter": 1}),
    "llada2_prefix": ("llada2", "threshold", None, "prefix", None),
}
TWINS = {"d2f_prefix": "d2f_none", "d3llm_delayed": "d3llm_none"}  # the same decode without a cache
QUICK = dict(width=64, layers=1, llada_shape="tiny", llada2_vocab=512, prompt=16, gen=32, blocks="16,8", batches="1,2",
             repeats=1)  # fmt: skip


def build(kind: str, args) -> tuple[object, int]:
    """The random ``kind`` model (LM head's EOS row zeroed) and the top prompt id (exclusive)."""
    if kind == "llada":
        model = random_llada("cpu", args.llada_shape, args.layers, width=args.width)
        head, top = model.model.transformer.ff_out, model.get_input_embeddings().weight.shape[0]
    else:
        model = random_model(args.width, SimpleNamespace(layers=args.layers, vocab=args.llada2_vocab))
        # the format's MASK is 63 at any vocabulary: prompts below it, as bench_block_diffusion's
        head, top = model.lm_head, LLADA2_MASK - 1
    with torch.no_grad():
        head.weight[model.eos_token_ids] = 0.0
    return model, top


def options(case: str, way: str, block: int, args) -> dict:
    """``dlm_decode.generate``'s keywords for ``case`` decoded ``way``."""
    _, sampler, attention, cache, cache_options = CASES[case]
    opts = {"threshold": args.threshold} if sampler == "threshold" else {"eta": args.eta}
    if way == "multi":
        opts |= {"block_add_threshold": args.add, "decoded_token_threshold": args.dec}
    kw = dict(sampler=sampler, sampler_options=opts, cache=cache, cache_options=cache_options)
    return kw | dict(attention=attention, gen_length=args.gen, block_length=block)


def run_once(model, prompts, kw: dict) -> dict:
    """One decode: seconds, answers, forwards, the model's query slots and the LM head's rows."""
    head = getattr(model, "lm_head", None) or model.model.transformer.ff_out
    rows = [0]
    hook = head.register_forward_hook(lambda _m, i, _o: rows.__setitem__(0, rows[0] + i[0].shape[:-1].numel()))
    try:
        start = time.perf_counter()
        out = dlm_decode.generate(model, prompts, **kw)
        secs = time.perf_counter() - start
    finally:
        hook.remove()
    mask = model.mask_token_id
    answers = [r.generated_ids for r in out.rows]
    done = all(mask not in a for a in answers)
    return dict(seconds=secs, answers=answers, nfe=out.nfe, slots=out.token_forwards, logit_slots=rows[0], done=done)


def compare(model, prompts, case: str, block: int, args) -> dict:
    """Both ways of ``case`` on ``prompts``: the warm-up, ``--repeats`` interleaved rounds, the entry."""
    kws = {w: options(case, w, block, args) for w in WAYS}
    for w in WAYS:  # one untimed decode of one block each first (the first call's one-time costs)
        run_once(model, prompts[:1], kws[w] | {"gen_length": block})
    secs = {w: [] for w in WAYS}
    first = {}
    for rep in range(args.repeats):
        for w in WAYS[rep % 2 :] + WAYS[: rep % 2]:
            got = run_once(model, prompts, kws[w])
            secs[w].append(got["seconds"])
            first.setdefault(w, got)
    return entry(first, secs)


def entry(first: dict, secs: dict) -> dict:
    """The row of one case, batch and block from the first round's decodes and every round's seconds."""
    med = {w: statistics.median(secs[w]) for w in WAYS}
    tokens = {w: sum(len(a) for a in first[w]["answers"]) for w in WAYS}
    nfe = {w: first[w]["nfe"] for w in WAYS}
    e = {
        "tokens": tokens,
        "all_decoded": all(first[w]["done"] for w in WAYS),
        "same_tokens": first["blocks"]["answers"] == first["multi"]["answers"],  # multi-block may commit others
        "nfe": nfe,
        "seconds": med,
        "tokens_per_s": {w: tokens[w] / med[w] for w in WAYS},
        "ms_per_forward": {w: 1e3 * med[w] / max(nfe[w], 1) for w in WAYS},
        "slots_per_forward": {w: first[w]["slots"] / max(nfe[w], 1) for w in WAYS},
        "logit_slots_per_forward": {w: first[w]["logit_slots"] / max(nfe[w], 1) for w in WAYS},
        "time_ratio": med["blocks"] / med["multi"],
        "nfe_ratio": nfe["blocks"] / max(nfe["multi"], 1),
    }
    e["ms_per_forward_ratio"] = e["ms_per_forward"]["multi"] / e["ms_per_forward"]["blocks"]
    e["bound"] = "forwards" if e["time_ratio"] >= 0.9 * e["nfe_ratio"] else "per-forward work"
    e["_answers"] = {w: first[w]["answers"] for w in WAYS}  # dropped before printing
    return e


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated of {', '.join(CASES)}")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--blocks", default="32", help="block lengths, comma-separated (e.g. 32,8)")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved timed rounds (median)")
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--gen", type=int, default=256)
    ap.add_argument("--width", type=int, default=512, help="hidden size of both random models")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--llada-shape", default="llada-8b", help="random_models shape of the LLaDA (its vocabulary)")
    ap.add_argument("--llada2-vocab", type=int, default=157184, help="LLaDA2.0's vocabulary")
    ap.add_argument("--threshold", type=float, default=0.6, help="threshold's confidence threshold (d2f_*, llada2_*)")
    ap.add_argument("--eta", type=float, default=1.0, help="entropy_threshold's eta (d3llm_*)")
    ap.add_argument("--add", type=float, default=0.1, help="multi: block_add_threshold")
    ap.add_argument("--dec", type=float, default=0.95, help="multi: decoded_token_threshold")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="tiny models and lengths, one round (the smoke test)")
    args = ap.parse_args(argv)
    if args.quick:  # the tiny sizes as defaults: flags given still win
        ap.set_defaults(**QUICK)
        args = ap.parse_args(argv)
    try:
        args.cases = args.cases.split(",")
        args.batches = [int(b) for b in args.batches.split(",")]
        args.blocks = [int(b) for b in args.blocks.split(",")]
    except ValueError:
        ap.error("--batches, --blocks: comma-separated positive integers")
    if bad := [c for c in args.cases if c not in CASES]:
        ap.error(f"--cases: unknown {', '.join(bad)}; valid: {', '.join(CASES)}")
    if min(args.batches + args.blocks) < 1 or args.repeats < 1 or args.threads < 1:
        ap.error("--batches, --blocks, --repeats and --threads must be >= 1")
    if any(args.gen % b for b in args.blocks):
        ap.error(f"--gen {args.gen} must be a multiple of every block length in --blocks")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    keys = ("threads", "cases", "batches", "blocks", "repeats", "prompt", "gen", "width", "layers", "llada_shape",
            "llada2_vocab", "threshold", "eta", "add", "dec", "quick")  # fmt: skip
    result = {k: getattr(args, k) for k in keys} | {"torch_threads": torch.get_num_threads(), "runs": {}}
    for kind in ("llada", "llada2"):
        cases = [c for c in args.cases if CASES[c][0] == kind]
        if not cases:
            continue
        model, top = build(kind, args)
        for batch in args.batches:
            prompts = prompts_for(model, kind, batch, args.prompt, top)
            for block in args.blocks:
                entries = {case: compare(model, prompts, case, block, args) for case in cases}
                add_twins(entries)
                for case, e in entries.items():
                    label = f"{case} batch {batch} block {block}"
                    result["runs"][label] = e
                    _print(label, e)
        del model
    print(json.dumps(result))
    return 0


def add_twins(entries: dict) -> None:
    """``same_tokens_as_<twin>`` per way where a case and its no-cache twin both ran; the answers dropped."""
    answers = {case: e.pop("_answers") for case, e in entries.items()}
    for case, twin in TWINS.items():
        if case in answers and twin in answers:
            entries[case][f"same_tokens_as_{twin}"] = {w: answers[case][w] == answers[twin][w] for w in WAYS}


def prompts_for(model, kind: str, batch: int, length: int, top: int) -> list[list[int]]:
    """``batch`` random prompts of ``length`` ids (seeded by the batch size)."""
    if kind == "llada2":
        return random_prompts(batch, length, top)
    return random_ids(model, batch, length, torch.Generator().manual_seed(batch)).tolist()


def _print(label: str, e: dict) -> None:
    b, m = "blocks", "multi"
    print(
        f"{label}: nfe {e['nfe'][b]} -> {e['nfe'][m]} ({e['nfe_ratio']:.2f}x) | tok/s {e['tokens_per_s'][b]:.1f} -> "
        f"{e['tokens_per_s'][m]:.1f} (time {e['time_ratio']:.2f}x) | slots/fwd {e['slots_per_forward'][b]:.0f} -> "
        f"{e['slots_per_forward'][m]:.0f}, logit slots/fwd {e['logit_slots_per_forward'][b]:.0f} -> "
        f"{e['logit_slots_per_forward'][m]:.0f}, ms/fwd x{e['ms_per_forward_ratio']:.2f} | bound: {e['bound']}",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
