"""Block diffusion speed (issue 46 item 7): ours with the exact K/V cache against the reference LLaDA2.0 algorithm
re-stated without a cache, and against an SDAR / dInfer-style cached loop that spends one extra forward per block.

    OMP_NUM_THREADS=1 python benchmarks/bench_block_diffusion.py --batches 1,8 --repeats 3

One random LLaDA2 checkpoint (``tests/llada2_reference.py``'s format at ``--hidden`` widths, 8 routed experts and a
shared one), prompt 64, gen 256, block 32, steps 32, threshold 0.95 (the ``llada2`` preset's rule), float32 on CPU,
one thread. Three ways, same tokens (checked):

* ``ours``: ``dlm_decode.generate(sampler="llada2", cache="prefix")`` (the exact cache, no extra forward);
* ``reference``: ``tests/reference_llada2_generate.llada2_generate``, the reference ``generate()`` re-stated
  (uncached: the window ``[0, (k+1)B)`` through the model every step; batch 1, so a batch runs row after row);
* ``sdar``: prefill the prompt's full blocks into a K/V store, decode each block against it (every step computes the
  block alone), then one more forward over the finished block to store its K/V (SDAR's ``block_diffusion_generate``,
  dInfer); batched, as those loops are.

After one untimed decode of one prompt by each way (warm-up), each repeat runs the three back to back, the order
rotating per repeat (interleaved); tokens/s is generated tokens (up to the first EOS, as returned) over wall seconds,
median over repeats. Ratios: ours / reference and ours / sdar per batch. The last line is one JSON object.
lm_head's MASK row is zeroed: the reference's argmax may pick MASK (and commit it), ours never does
(docs/block_diffusion.md), which would make the tokens differ.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the reference re-statements
from llada2_reference import EOS, MASK, write_llada2  # noqa: E402
from reference_llada2_generate import greedy, llada2_generate, schedule  # noqa: E402

import dlm_decode  # noqa: E402
from dlm_decode.cache import KVStore  # noqa: E402
from dlm_decode.models.loading import load_model  # noqa: E402


def sdar_generate(
    model, prompts: list[list[int]], gen_length: int, block: int, steps: int, threshold: float, ids=(MASK, EOS)
):
    """The SDAR / dInfer cached loop with the LLaDA2.0 rule, equal-length prompts: (answers, forwards).
    ``ids``: the checkpoint's (MASK, EOS)."""
    mask_id, eos_id = ids
    b, p = len(prompts), len(prompts[0])
    nb = -(-(p + gen_length) // block)
    x = torch.full((b, nb * block), mask_id, dtype=torch.long)
    x[:, :p] = torch.tensor(prompts)
    pos = torch.arange(nb * block).expand(b, -1)
    n_layers, kv, hd = model.kv_shape()
    store = KVStore(n_layers, b, kv, nb * block, hd, dtype=torch.float32, device="cpu")
    first, nfe = p // block, 0
    if first:  # prefill the prompt's full blocks
        model.denoise(x, pos, compute=slice(0, first * block), region=(0, 1), store=store, block_length=block)
        nfe += 1
    sched = schedule(block, steps)
    for k in range(first, nb):
        s, e = k * block, (k + 1) * block
        for step in range(steps):
            active = x[:, s:e] == mask_id  # [B, block]
            if not bool(active.any()):
                break
            logits = model.denoise(x, pos, compute=slice(s, e), region=(s, e), store=store, block_length=block)
            nfe += 1
            tok, prob = greedy(logits)
            conf = torch.where(active, prob, float("-inf"))
            for r in range(b):
                high = conf[r] > threshold
                n = sched[step]
                pick = high if int(high.sum()) >= n else torch.zeros_like(high)
                if int(high.sum()) < n:
                    pick[torch.topk(conf[r], k=min(n, int(active[r].sum()))).indices] = True
                x[r, s:e][pick] = tok[r][pick]
        model.denoise(x, pos, compute=slice(s, e), region=(s, e), store=store, block_length=block)  # the extra one
        nfe += 1
        if (x[:, p:e] == eos_id).any(1).all():
            break
    return [_answer(row, eos_id) for row in x[:, p : p + gen_length].tolist()], nfe


def run_once(way: str, model, prompts, args, ids=(MASK, EOS)) -> tuple[float, list[list[int]], int]:
    """One decode of ``prompts`` by ``way``: (seconds, answers up to the first EOS, forwards)."""
    start = time.perf_counter()
    if way == "ours":
        out = dlm_decode.generate(
            model,
            prompts,
            sampler="llada2",
            sampler_options={"threshold": args.threshold},
            cache="prefix",
            gen_length=args.gen,
            block_length=args.block,
            steps=args.steps,
        )
        answers, nfe = [_answer(r.generated_ids, ids[1]) for r in out.rows], out.nfe
    elif way == "reference":

        def fwd(x, mask, pos):
            return model(x, attention_mask=mask, position_ids=pos).logits

        kw = dict(gen_length=args.gen, block_length=args.block, steps=args.steps, threshold=args.threshold)
        runs = [llada2_generate(fwd, p, mask_id=ids[0], eos_id=ids[1], **kw) for p in prompts]
        answers, nfe = [a for a, _ in runs], sum(n for _, n in runs)
    else:
        answers, nfe = sdar_generate(model, prompts, args.gen, args.block, args.steps, args.threshold, ids)
    return time.perf_counter() - start, answers, nfe


def _answer(x: list[int], eos: int) -> list[int]:
    return x[: x.index(eos) + 1] if eos in x else x


WAYS = ("ours", "reference", "sdar")


def compare(model, prompt_sets: list[list[list[int]]], args, ids) -> dict:
    """Every prompt set decoded by the three ways, ``--repeats`` times in rotating order (interleaved); the seconds
    of a way are summed over the sets per repeat, then the median over repeats is taken."""
    secs = {w: [0.0] * args.repeats for w in WAYS}
    seen = {w: [] for w in WAYS}
    for w in WAYS:  # one untimed decode each first: the first call's one-time costs would fall on whoever goes first
        run_once(w, model, prompt_sets[0][:1], args, ids)
    for rep in range(args.repeats):
        for prompts in prompt_sets:
            for w in WAYS[rep % 3 :] + WAYS[: rep % 3]:  # rotating order: interleaved
                t, answers, nfe = run_once(w, model, prompts, args, ids)
                secs[w][rep] += t
                if rep == 0:
                    seen[w].append((answers, nfe))
    tokens = sum(len(a) for answers, _ in seen["ours"] for a in answers)
    same = all([a for a, _ in seen[w]] == [a for a, _ in seen["ours"]] for w in WAYS)
    tps = {w: tokens / statistics.median(secs[w]) for w in WAYS}
    nfe = {w: sum(n for _, n in seen[w]) for w in WAYS}
    # answer blocks a set decodes (its longest row's; the rows of a batch share the forwards), summed over the sets
    blocks = sum(max(-(-len(a) // args.block) for a in answers) for answers, _ in seen["ours"])
    return {
        "tokens": tokens,
        "same_tokens": same,
        "tokens_per_s": tps,
        "nfe": nfe,
        "ours_forwards_per_block": nfe["ours"] / max(1, blocks),
        "ours_over_reference": tps["ours"] / tps["reference"],
        "ours_over_sdar": tps["ours"] / tps["sdar"],
    }


def random_model(hidden: int, args):
    """A random LLaDA2 checkpoint at ``hidden`` widths (MASK's lm_head row zeroed: the reference's argmax may
    commit MASK, ours never does, which would make the tokens differ)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = write_llada2(
            Path(tmp) / "m",
            seed=0,
            hidden_size=hidden,
            num_hidden_layers=args.layers,
            vocab_size=args.vocab,
            head_dim=min(128, hidden // 4),
            num_attention_heads=max(4, hidden // 128),
            num_key_value_heads=max(4, hidden // 128) // 2,
            moe_intermediate_size=hidden // 2,
            intermediate_size=2 * hidden,
        )
        model, _ = load_model(path)
    with torch.no_grad():
        model.lm_head.weight[MASK] = 0.0
    return model


def official_prompts(args) -> tuple[list[list[int]], object]:
    """The first ``--samples`` official prompts of each task under ``--data``, chat-encoded for ``--model``."""
    from dlm_decode.core.inputs import encode_prompts
    from dlm_decode.parallelbench.tasks import list_tasks, load_task

    model, tok = load_model(args.model)
    rows = []
    for name in list_tasks(args.data):
        task = load_task(args.data, name, limit=args.samples)
        rows += encode_prompts([task.messages(i) for i in range(len(task))], tok, chat=True)
    return rows, model


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", default="1,8", help="random models: batch sizes")
    ap.add_argument("--widths", default="128,1024", help="random models: hidden sizes")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--gen", type=int, default=256)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--threshold", type=float, default=0.95)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", default=None, help="a trained block-causal checkpoint instead of random ones")
    ap.add_argument("--data", default=None, help="with --model: the official ParallelBench directory (its prompts)")
    ap.add_argument("--samples", type=int, default=2, help="with --model: prompts per task, each decoded alone")
    args = ap.parse_args(argv)
    if args.model and not args.data:
        ap.error("--model needs --data (the official ParallelBench directory, for its prompts)")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    keys = ("threads", "gen", "block", "steps", "threshold", "layers", "vocab", "model", "samples", "repeats")
    result = {k: getattr(args, k) for k in keys} | {"runs": {}}
    if args.model:
        rows, model = official_prompts(args)
        ids = (model.mask_token_id, model.eos_token_ids[0])
        entry = compare(model, [[r] for r in rows], args, ids)
        result["runs"]["trained batch 1"] = entry
        _print("trained batch 1", entry)
    else:
        for hidden in [int(h) for h in args.widths.split(",")]:
            model = random_model(hidden, args)
            for batch in [int(b) for b in args.batches.split(",")]:
                g = torch.Generator().manual_seed(batch)
                prompts = torch.randint(2, MASK - 1, (batch, args.prompt), generator=g).tolist()
                entry = compare(model, [prompts], args, (MASK, EOS))
                result["runs"][f"hidden {hidden} batch {batch}"] = entry
                _print(f"hidden {hidden} batch {batch}", entry)
    print(json.dumps(result))
    return 0


def _print(label: str, e: dict) -> None:
    tps = " ".join(f"{w} {e['tokens_per_s'][w]:.1f}" for w in WAYS)
    print(
        f"{label}: tokens {e['tokens']} same {e['same_tokens']} forwards/block {e['ours_forwards_per_block']:.1f} "
        f"tok/s {tps} | ours/ref {e['ours_over_reference']:.2f}x ours/sdar {e['ours_over_sdar']:.2f}x",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
