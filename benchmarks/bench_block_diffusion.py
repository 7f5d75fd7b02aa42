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

Each repeat runs the three back to back, the order rotating per repeat (interleaved); tokens/s is generated tokens
(up to the first EOS, as returned) over wall seconds, median over repeats. Ratios: ours / reference and ours / sdar
per batch. The last line is one JSON object. lm_head's MASK row is zeroed: the reference's argmax may pick MASK
(and commit it), ours never does (docs/block_diffusion.md), which would make the tokens differ.
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


def sdar_generate(model, prompts: list[list[int]], gen_length: int, block: int, steps: int, threshold: float):
    """The SDAR / dInfer cached loop with the LLaDA2.0 rule, equal-length prompts: (answers, forwards)."""
    b, p = len(prompts), len(prompts[0])
    nb = -(-(p + gen_length) // block)
    x = torch.full((b, nb * block), MASK, dtype=torch.long)
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
            active = x[:, s:e] == MASK  # [B, block]
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
        if (x[:, p:e] == EOS).any(1).all():
            break
    out = []
    for row in x[:, p : p + gen_length].tolist():
        out.append(row[: row.index(EOS) + 1] if EOS in row else row)
    return out, nfe


def run_once(way: str, model, prompts, args) -> tuple[float, list[list[int]], int]:
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
        answers, nfe = [_answer(r.generated_ids) for r in out.rows], out.nfe
    elif way == "reference":

        def fwd(ids, mask, pos):
            return model(ids, attention_mask=mask, position_ids=pos).logits

        runs = [
            llada2_generate(
                fwd,
                p,
                gen_length=args.gen,
                block_length=args.block,
                steps=args.steps,
                threshold=args.threshold,
                mask_id=MASK,
                eos_id=EOS,
            )
            for p in prompts
        ]
        answers, nfe = [a for a, _ in runs], sum(n for _, n in runs)
    else:
        answers, nfe = sdar_generate(model, prompts, args.gen, args.block, args.steps, args.threshold)
    return time.perf_counter() - start, answers, nfe


def _answer(ids: list[int]) -> list[int]:
    return ids[: ids.index(EOS) + 1] if EOS in ids else ids


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--gen", type=int, default=256)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--threshold", type=float, default=0.95)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = write_llada2(
            Path(tmp) / "m",
            seed=0,
            hidden_size=args.hidden,
            num_hidden_layers=args.layers,
            vocab_size=args.vocab,
            head_dim=args.hidden // 4,
            moe_intermediate_size=args.hidden // 2,
            intermediate_size=2 * args.hidden,
        )
        model, _ = load_model(path)
    with torch.no_grad():  # the reference can propose (and commit) MASK, we never do: keep MASK's logit at 0
        model.lm_head.weight[MASK] = 0.0
    result = {
        "threads": args.threads,
        "prompt": args.prompt,
        "gen": args.gen,
        "block": args.block,
        "steps": args.steps,
        "threshold": args.threshold,
        "hidden": args.hidden,
        "layers": args.layers,
        "vocab": args.vocab,
        "batches": {},
    }
    ways = ["ours", "reference", "sdar"]
    for batch in [int(b) for b in args.batches.split(",")]:
        g = torch.Generator().manual_seed(batch)
        prompts = torch.randint(2, MASK - 1, (batch, args.prompt), generator=g).tolist()
        secs = {w: [] for w in ways}
        seen = {}
        for rep in range(args.repeats):
            for w in ways[rep % 3 :] + ways[: rep % 3]:  # rotating order: interleaved
                t, answers, nfe = run_once(w, model, prompts, args)
                secs[w].append(t)
                seen[w] = (answers, nfe)
        tokens = sum(len(a) for a in seen["ours"][0])
        same = all(seen[w][0] == seen["ours"][0] for w in ways)
        tps = {w: tokens / statistics.median(secs[w]) for w in ways}
        entry = {
            "tokens": tokens,
            "same_tokens": same,
            "tokens_per_s": tps,
            "nfe": {w: seen[w][1] for w in ways},
            "ours_over_reference": tps["ours"] / tps["reference"],
            "ours_over_sdar": tps["ours"] / tps["sdar"],
        }
        result["batches"][str(batch)] = entry
        print(
            f"batch {batch}: tokens {tokens} same {same} tok/s "
            + " ".join(f"{w} {tps[w]:.1f}" for w in ways)
            + f" | ours/ref {entry['ours_over_reference']:.2f}x ours/sdar {entry['ours_over_sdar']:.2f}x",
            flush=True,
        )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
