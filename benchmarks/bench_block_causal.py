"""Block-causal families' speed (issue 76 item 5): SDAR / TraDo and Fast-dLLM v2, ours with the exact K/V cache
against their reference loops re-stated, on random checkpoints in the published formats.

    OMP_NUM_THREADS=1 python benchmarks/bench_block_causal.py --hidden 512 --batches 1,8 --repeats 2

Per family one random checkpoint (``tests/sdar_reference.py`` / ``tests/fast_dllm_v2_reference.py``'s format at
``--hidden`` widths, head_dim 128, ``--layers`` layers, the real ``--vocab``, untied head with MASK's row zeroed, the
test formats' special ids), float32 on CPU, ``--threads`` torch threads (recorded). Ways (``--ways``):

* SDAR (the ``sdar`` preset: block 4, 4 steps a block, ``low_confidence_dynamic``, threshold 0.9; temperature 1.0,
  the reference's default, seeded):
  - ``ours``: ``dlm_decode.generate(sampler="sdar", cache="prefix", seed=S)``: the exact cache writes a finished
    block in the next block's first forward;
  - ``reference``: ``tests/reference_sdar_generate.sdar_generate`` (JetAstra/SDAR ``block_diffusion_generate``) on
    the re-stated reference forward (``ReferenceSDAR``, its ``store_kv`` cache), after ``torch.manual_seed(S)``: one
    extra ``store_kv`` forward per finished block. It is batch 1 (its batches are not row-independent), so a batch
    runs row after row;
  - ``reference_batched``: the same loop and cache protocol over all rows in one forward a step (``sdar_batched``
    here), each row drawing from its own RNG state seeded S only when its block has a MASK: the rows' draws are
    the ones they get alone, so the tokens are the reference's row by row;
* Fast-dLLM v2 (the ``fast_dllm_v2`` preset: block 32, sub-blocks of 8, threshold 0.9; temperature 0):
  - ``ours``: ``dlm_decode.generate(sampler="fast_dllm_v2", cache="prefix")``;
  - ``reference``: ``tests/fast_dllm_v2_reference.batch_sample`` (NVlabs/Fast-dLLM ``v2/generation_functions.py``)
    on the re-stated reference forward (``ReferenceFastDLLM``), batched as it is: every step recomputes the whole
    block against the cache and keeps the sub-block's logits; a finished block costs one more forward, which writes
    its K/V and gives the next block's first token.

Every way runs on the same weights; the references through their re-stated forwards (eager attention, K/V
concatenated per call, logits for every slot of a forward), ours through ``dlm_decode``'s (logits only where a
sampler reads them). So the time ratio is the forwards saved times the per-forward cost ratio, plus host work: each
decode's forward calls are clocked, and the JSON gives per way the forwards, their seconds, ms a forward, and
``<way>_over_ours_forwards`` (the way's seconds over ours' forward seconds alone: what a loop of ours with no host
work would reach; where it is close to ``ours_over_<way>``, the forward bounds the ratio).

After one untimed decode of one prompt by each way (warm-up), each repeat runs the ways back to back, the order
rotating per repeat (interleaved); tokens/s is ours' generated tokens (up to the first EOS) over wall seconds, median
over repeats; tokens are checked equal to ours' for every way (the first repeat's). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks' shared modules
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the reference re-statements
import fast_dllm_v2_reference as fref  # noqa: E402
import sdar_reference as sref  # noqa: E402
from forward_bound import ForwardClock  # noqa: E402
from reference_sdar_generate import _choose, sample, schedule, sdar_generate  # noqa: E402

import dlm_decode  # noqa: E402
from dlm_decode.models.loading import load_model  # noqa: E402

FAMILIES = ("sdar", "fast_dllm_v2")
WAYS = {"sdar": ("ours", "reference", "reference_batched"), "fast_dllm_v2": ("ours", "reference")}
IDS = {"sdar": (sref.MASK, sref.EOS), "fast_dllm_v2": (fref.MASK, fref.STOP)}  # the test formats' (MASK, EOS)


class Clocked:
    """A reference forward whose calls are timed and counted (``seconds``, ``calls``)."""

    def __init__(self, forward) -> None:
        self.forward, self.seconds, self.calls = forward, 0.0, 0

    def __call__(self, *a, **kw):
        start = time.perf_counter()
        try:
            return self.forward(*a, **kw)
        finally:
            self.seconds += time.perf_counter() - start
            self.calls += 1


def build(family: str, args) -> tuple[object, object]:
    """(our model, the re-stated reference forward on the same weights) of a random checkpoint of ``family``."""
    heads = max(1, args.hidden // 128)
    widths = dict(hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=heads,
                  num_key_value_heads=max(1, heads // 2), intermediate_size=3 * args.hidden, vocab_size=args.vocab,
                  max_position_embeddings=4096)  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        if family == "sdar":
            path = sref.write_sdar(Path(tmp) / "m", seed=0, head_scale=args.head_scale, head_dim=128, **widths)
        else:
            path = fref.write_fdllm(Path(tmp) / "m", seed=0, head_scale=args.head_scale, **widths)
        cfg = json.loads((path / "config.json").read_text())
        model, _ = load_model(path)
    sd = dict(model.state_dict())  # the same tensors: one copy of the weights
    ref = sref.ReferenceSDAR(cfg, sd) if family == "sdar" else fref.ReferenceFastDLLM(cfg, sd)
    return model, ref


def random_prompts(batch: int, length: int, vocab: int) -> list[list[int]]:
    """``batch`` prompts of ``length`` ids above the test formats' special ids (< 64), seeded by the batch size."""
    g = torch.Generator().manual_seed(batch)
    return torch.randint(64, vocab, (batch, length), generator=g).tolist()


def answer(tokens: list[int], eos: int, n: int) -> list[int]:
    """The first ``n`` tokens, cut after the first EOS."""
    tokens = tokens[:n]
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


@torch.no_grad()
def sdar_batched(ref, prompts: list[list[int]], args) -> tuple[list[list[int]], int]:
    """``sdar_generate``'s loop and ``store_kv`` protocol over every row in one forward a step (equal-length
    prompts): (answers, forwards). Each row draws from its own RNG state seeded ``--seed``, only in the steps where
    its block has a MASK (the draws it gets alone); the loop stops after a block once every row holds EOS."""
    mask_id, eos = IDS["sdar"]
    blk, b, p = args.sdar_block, len(prompts), len(prompts[0])
    nb = -(-(p + args.gen) // blk)
    grid = torch.tril(torch.ones(nb, nb)).repeat_interleave(blk, 0).repeat_interleave(blk, 1)[None, None]
    pos = torch.arange(nb * blk)[None].expand(b, -1)
    x = torch.full((b, nb * blk), mask_id, dtype=torch.long)
    x[:, :p] = torch.tensor(prompts)
    torch.manual_seed(args.seed)
    states = [torch.get_rng_state() for _ in range(b)]
    cache: list = []
    nfe, done = 0, (p // blk) * blk
    if done:
        ref(x[:, :done], grid[:, :, :done, :done], pos[:, :done], cache, True)
        nfe += 1
    sched = schedule(blk, args.sdar_steps)
    for k in range(p // blk, nb):
        s, e = k * blk, (k + 1) * blk
        view = (grid[:, :, s:e, :e], pos[:, s:e])
        for step in range(args.sdar_steps + 1):
            masked = x[:, s:e] == mask_id  # [b, blk]
            if not bool(masked.any()):
                ref(x[:, s:e], *view, cache, True)  # the extra forward: the finished block's K/V stored
                nfe += 1
                break
            logits = ref(x[:, s:e], *view, cache, False)
            nfe += 1
            for r in range(b):
                if not bool(masked[r].any()):
                    continue
                torch.set_rng_state(states[r])
                tok, prob = sample(logits[r], args.temperature, 0, 1.0)
                states[r] = torch.get_rng_state()
                pick = _choose("low_confidence_dynamic", prob, masked[r], sched[step], args.threshold, False)
                x[r, s:e][pick] = tok[pick]
        if bool((x[:, p:e] == eos).any(1).all()):
            break
    return [answer(row, eos, args.gen) for row in x[:, p:].tolist()], nfe


def run_once(family: str, way: str, model, ref, prompts, args) -> tuple[float, list[list[int]], int, float]:
    """One decode of ``prompts``: (seconds, answers, forwards, seconds inside the forwards)."""
    eos = IDS[family][1]
    start = time.perf_counter()
    if way == "ours":
        with ForwardClock(model) as clock:
            opts = _ours_options(family, args)
            out = dlm_decode.generate(model, prompts, cache="prefix", gen_length=args.gen, **opts)
        answers, nfe, fwd = [answer(r.generated_ids, eos, args.gen) for r in out.rows], out.nfe, clock.seconds
        assert clock.calls == nfe, (clock.calls, nfe)
    else:
        clocked = Clocked(ref)
        answers, nfe = _reference(family, way, clocked, prompts, args)
        fwd = clocked.seconds
        assert clocked.calls == nfe, (clocked.calls, nfe)
    return time.perf_counter() - start, answers, nfe, fwd


def _ours_options(family: str, args) -> dict:
    if family == "sdar":
        opts = {"remasking": "low_confidence_dynamic", "threshold": args.threshold}
        return dict(sampler="sdar", sampler_options=opts, block_length=args.sdar_block, steps=args.sdar_steps,
                    temperature=args.temperature, seed=args.seed)  # fmt: skip
    opts = {"threshold": args.threshold, "small_block_size": args.small_block}
    return dict(sampler="fast_dllm_v2", sampler_options=opts, block_length=args.fdllm_block)


def _reference(family: str, way: str, clocked: Clocked, prompts, args) -> tuple[list[list[int]], int]:
    if way == "reference_batched":
        return sdar_batched(clocked, prompts, args)
    if family == "sdar":
        answers = []
        for row in prompts:  # batch 1, as the reference runs; each row after manual_seed: the draws it gets alone
            torch.manual_seed(args.seed)
            run = sdar_generate(clocked, row, mask_id=IDS["sdar"][0], gen_length=args.gen,
                                block_length=args.sdar_block, denoising_steps=args.sdar_steps,
                                temperature=args.temperature, confidence_threshold=args.threshold,
                                stop_ids=[IDS["sdar"][1]])  # fmt: skip
            answers.append(run.tokens)
        return answers, clocked.calls
    blk = args.fdllm_block
    blocks = -(-(len(prompts[0]) + args.gen) // blk) - len(prompts[0]) // blk  # batch_sample's max_new_tokens // B
    rows = fref.batch_sample(clocked, torch.tensor(prompts), block_size=blk, small_block_size=args.small_block,
                             max_new_tokens=blocks * blk, threshold=args.threshold)  # fmt: skip
    return [answer(r, IDS["fast_dllm_v2"][1], args.gen) for r in rows], clocked.calls


def compare(family: str, model, ref, prompts, args) -> dict:
    """Every way of ``family`` on ``prompts``, ``--repeats`` times in rotating order; medians."""
    ways = [w for w in WAYS[family] if w in args.ways]
    for w in ways:  # untimed warm-up
        run_once(family, w, model, ref, prompts[:1], args)
    secs = {w: [] for w in ways}
    fwd = {w: [] for w in ways}
    seen: dict[str, tuple] = {}
    for rep in range(args.repeats):
        for w in ways[rep % len(ways) :] + ways[: rep % len(ways)]:
            t, answers, nfe, f = run_once(family, w, model, ref, prompts, args)
            secs[w].append(t)
            fwd[w].append(f)
            seen.setdefault(w, (answers, nfe))
    tokens = sum(len(a) for a in seen["ours"][0])
    med = {w: statistics.median(secs[w]) for w in ways}
    fmed = {w: statistics.median(fwd[w]) for w in ways}
    nfe = {w: seen[w][1] for w in ways}
    same = {w: seen[w][0] == seen["ours"][0] for w in ways}
    entry = {
        "tokens": tokens,
        "same_tokens": all(same.values()),
        "same_tokens_as_ours": same,
        "tokens_per_s": {w: tokens / med[w] for w in ways},
        "seconds": med,
        "nfe": nfe,
        "forward_s": fmed,
        "ms_per_forward": {w: 1e3 * fmed[w] / max(nfe[w], 1) for w in ways},
        "host_share": {w: 1 - fmed[w] / med[w] for w in ways},
    }
    for w in ways[1:]:
        entry[f"ours_over_{w}"] = med[w] / med["ours"]
        entry[f"forwards_saved_vs_{w}"] = nfe[w] / max(nfe["ours"], 1)
        entry[f"forward_cost_{w}_over_ours"] = entry["ms_per_forward"][w] / entry["ms_per_forward"]["ours"]
        entry[f"{w}_over_ours_forwards"] = med[w] / fmed["ours"]
    return entry


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--ways", default="ours,reference,reference_batched")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=151936, help="Qwen2.5 / Qwen3's (SDAR-1.7B, Fast_dLLM_v2_1.5B)")
    ap.add_argument("--head-scale", type=float, default=1.5, help="output head scale (logit spread)")
    ap.add_argument("--prompt", type=int, default=40)
    ap.add_argument("--gen", type=int, default=56)
    ap.add_argument("--threshold", type=float, default=0.9)
    ap.add_argument("--sdar-block", type=int, default=4)
    ap.add_argument("--sdar-steps", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=1.0, help="SDAR's (Fast-dLLM v2 decodes at 0)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fdllm-block", type=int, default=32)
    ap.add_argument("--small-block", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    args.families, args.ways = args.families.split(","), args.ways.split(",")
    if not set(args.families) <= set(FAMILIES):
        ap.error(f"--families {','.join(args.families)}: give any of {', '.join(FAMILIES)}")
    if "ours" not in args.ways or not set(args.ways) <= {"ours", "reference", "reference_batched"}:
        ap.error(f"--ways {','.join(args.ways)}: give ours and any of reference, reference_batched")
    try:
        args.batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        ap.error(f"--batches: comma-separated whole numbers, got {args.batches!r}")
    counts = (*args.batches, args.hidden, args.layers, args.prompt, args.gen, args.repeats, args.threads)
    if min(counts) < 1 or args.hidden % 128 or args.temperature <= 0:
        ap.error("--batches, --layers, --prompt, --gen, --repeats, --threads must be >= 1, --hidden a multiple of "
                 "128, --temperature > 0 (the SDAR reference divides by it)")  # fmt: skip
    if args.prompt % args.fdllm_block == 0 and "fast_dllm_v2" in args.families:
        ap.error("--prompt a multiple of --fdllm-block: batch_sample never prefills a one-block prompt")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    keys = ("threads", "hidden", "layers", "vocab", "head_scale", "prompt", "gen", "threshold", "sdar_block",
            "sdar_steps", "temperature", "seed", "fdllm_block", "small_block", "repeats", "ways")  # fmt: skip
    result = {k: getattr(args, k) for k in keys} | {"torch_threads": torch.get_num_threads(), "runs": {}}
    for family in args.families:
        model, ref = build(family, args)
        for batch in args.batches:
            entry = compare(family, model, ref, random_prompts(batch, args.prompt, args.vocab), args)
            result["runs"][f"{family} batch {batch}"] = entry
            _print(f"{family} batch {batch}", entry)
        del model, ref
    print(json.dumps(result))
    return 0


def _print(label: str, e: dict) -> None:
    tps = " ".join(f"{w} {v:.1f}" for w, v in e["tokens_per_s"].items())
    nfe = " ".join(f"{w} {v}" for w, v in e["nfe"].items())
    ms = " ".join(f"{w} {v:.1f}" for w, v in e["ms_per_forward"].items())
    ratios = " ".join(f"{k} {v:.2f}x" for k, v in e.items() if k.startswith(("ours_over_", "forwards_saved")))
    print(f"{label}: tokens {e['tokens']} same {e['same_tokens_as_ours']} tok/s {tps} | forwards {nfe} | "
          f"ms/forward {ms} | {ratios}", flush=True)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
