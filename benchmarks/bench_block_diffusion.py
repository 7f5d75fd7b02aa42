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
    weight = model.lm_head.weight
    x = torch.full((b, nb * block), mask_id, dtype=torch.long, device=weight.device)
    x[:, :p] = torch.tensor(prompts)
    pos = torch.arange(nb * block, device=weight.device).expand(b, -1)
    n_layers, kv, hd = model.kv_shape()
    store = KVStore(n_layers, b, kv, nb * block, hd, dtype=weight.dtype, device=weight.device)
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
    device = model.lm_head.weight.device
    start = time.perf_counter()
    if way in ("ours", "ours_graphs"):
        out = dlm_decode.generate(
            model,
            prompts,
            sampler="llada2",
            sampler_options={"threshold": args.threshold},
            cache="prefix",
            gen_length=args.gen,
            block_length=args.block,
            steps=args.steps,
            cuda_graphs=way == "ours_graphs",
        )
        answers, nfe = [_answer(r.generated_ids, ids[1]) for r in out.rows], out.nfe
        if out.graphs and out.graphs.get("error"):
            raise RuntimeError(f"step graphs failed: {out.graphs['error']}")
    elif way == "reference":

        def fwd(x, mask, pos):
            return model(x, attention_mask=mask, position_ids=pos).logits

        kw = dict(gen_length=args.gen, block_length=args.block, steps=args.steps, threshold=args.threshold)
        runs = [llada2_generate(fwd, p, mask_id=ids[0], eos_id=ids[1], device=device, **kw) for p in prompts]
        answers, nfe = [a for a, _ in runs], sum(n for _, n in runs)
    else:
        answers, nfe = sdar_generate(model, prompts, args.gen, args.block, args.steps, args.threshold, ids)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, answers, nfe


def _answer(x: list[int], eos: int) -> list[int]:
    return x[: x.index(eos) + 1] if eos in x else x


WAYS = ("ours", "reference", "sdar")  # the CPU default; on a GPU "ours_graphs" joins (--ways)


def compare(model, prompt_sets: list[list[list[int]]], args, ids) -> dict:
    """Every prompt set decoded by each of ``args.ways``, ``--repeats`` times in rotating order (interleaved); the
    seconds of a way are summed over the sets per repeat, then the median over repeats is taken."""
    ways = args.ways
    secs = {w: [0.0] * args.repeats for w in ways}
    seen = {w: [] for w in ways}
    for w in ways:  # one untimed decode each first: the first call's one-time costs would fall on whoever goes first
        run_once(w, model, prompt_sets[0][:1], args, ids)
    for rep in range(args.repeats):
        for prompts in prompt_sets:
            for w in ways[rep % len(ways) :] + ways[: rep % len(ways)]:  # rotating order: interleaved
                t, answers, nfe = run_once(w, model, prompts, args, ids)
                secs[w][rep] += t
                if rep == 0:
                    seen[w].append((answers, nfe))
    tokens = sum(len(a) for answers, _ in seen["ours"] for a in answers)
    same = {w: [a for a, _ in seen[w]] == [a for a, _ in seen["ours"]] for w in ways}
    tps = {w: tokens / statistics.median(secs[w]) for w in ways}
    nfe = {w: sum(n for _, n in seen[w]) for w in ways}
    # answer blocks a set decodes (its longest row's; the rows of a batch share the forwards), summed over the sets
    blocks = sum(max(-(-len(a) // args.block) for a in answers) for answers, _ in seen["ours"])
    entry = {
        "tokens": tokens,
        "same_tokens": all(same.values()),
        "same_tokens_as_ours": same,
        "tokens_per_s": tps,
        "seconds": {w: statistics.median(secs[w]) for w in ways},
        "nfe": nfe,
        "ours_forwards_per_block": nfe["ours"] / max(1, blocks),
    }
    for w in ways:
        if w != "ours":
            entry[f"ours_over_{w}"] = tps["ours"] / tps[w]
    if "ours_graphs" in ways:
        for w in ways:
            if w not in ("ours", "ours_graphs"):
                entry[f"graphs_over_{w}"] = tps["ours_graphs"] / tps[w]
    return entry


def random_model(hidden: int, args):
    """A random LLaDA2 checkpoint at ``hidden`` widths (MASK's lm_head row zeroed: the reference's argmax may
    commit MASK, ours never does, which would make the tokens differ)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = write_llada2(
            Path(tmp) / "m",
            seed=0,
            hidden_size=hidden,
            num_hidden_layers=args.layers or 4,
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


def random_prompts(batch: int, length: int, top: int) -> list[list[int]]:
    """``batch`` prompts of ``length`` ids in ``[2, top)``, seeded by the batch size (the random models' prompts)."""
    g = torch.Generator().manual_seed(batch)
    return torch.randint(2, top, (batch, length), generator=g).tolist()


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


# LLaDA2.0-mini's widths (MODELS.md), random weights: issue 48's GPU target (--shape mini)
MINI = dict(
    vocab_size=157184, hidden_size=2048, num_hidden_layers=20, num_attention_heads=16, num_key_value_heads=4,
    head_dim=128, intermediate_size=5120, moe_intermediate_size=512, first_k_dense_replace=1, num_experts=256,
    num_experts_per_tok=8, num_shared_experts=1, n_group=8, topk_group=4, routed_scaling_factor=2.5, use_qk_norm=True,
    use_qkv_bias=False, use_bias=False, partial_rotary_factor=0.5, rope_theta=600000.0, rms_norm_eps=1e-6,
    tie_word_embeddings=False, pad_token_id=156892, max_position_embeddings=32768,
)  # fmt: skip


def mini_model(args):
    """A random LLaDA2 at LLaDA2.0-mini's widths, built in place on ``--device`` in ``--dtype`` (no checkpoint:
    16B parameters); ``--layers`` / ``--experts`` shrink it for a smoke run. Normal(0.02) matrices, unit norms, zero
    selection bias, MASK's lm_head row zeroed (as ``random_model``)."""
    from dlm_decode.models.llada2 import LLaDA2MoeConfig, LLaDA2MoeModelLM
    from dlm_decode.models.moe import SparseMoE

    over = {"num_hidden_layers": args.layers} if args.layers else {}
    if args.experts:
        over |= {"num_experts": args.experts}  # 8 groups, 4 kept: at least 16 experts
    cfg = LLaDA2MoeConfig(**(MINI | over))
    with torch.device("meta"):
        model = LLaDA2MoeModelLM(cfg)
    model = model.to(getattr(torch, args.dtype)).to_empty(device=args.device)
    g = torch.Generator(args.device).manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(1.0) if p.dim() == 1 else p.normal_(0.0, 0.02, generator=g)
        for b in model.buffers():
            b.zero_()  # the routers' expert_bias
        model.lm_head.weight[model.mask_token_id] = 0.0
    model.eval()
    moe = next(m for m in model.modules() if isinstance(m, SparseMoE))
    args.expert_path = "grouped" if moe.runs_grouped(torch.device(args.device), model.dtype) else "looped"
    if args.expert_path == "grouped":  # a torch without a CUDA grouped product: say so, measure the looped path
        try:
            with torch.no_grad():
                model(torch.arange(8, device=args.device)[None], block_length=args.block)
        except RuntimeError as e:
            args.expert_path = f"looped (the grouped product failed: {e})"
            for m in model.modules():
                if hasattr(m, "grouped"):
                    m.grouped = False
    print(f"routed experts: {args.expert_path}", flush=True)
    return model


def forward_bytes(model, way: str, prompts, args, ids) -> float:
    """Mean bytes a forward of ``way`` (ours, reference or sdar; decoded once, eagerly, untimed) must read (the
    roofline's numerator): every weight but the embedding table and the routed experts, plus the experts some token
    of the forward is routed to (counted per layer), plus, for ours, the K/V store it attends over."""
    from dlm_decode.models.moe import Router, SparseMoE

    moes = [m for m in model.modules() if isinstance(m, SparseMoE)]
    routed = {id(p) for m in moes for p in m.experts.parameters()}
    emb = model.get_input_embeddings().weight
    fixed = sum(p.numel() * p.element_size() for p in model.parameters() if p is not emb and id(p) not in routed)
    expert = sum(p.numel() * p.element_size() for p in moes[0].experts[0].parameters()) if moes else 0
    active = []
    hooks = [m.register_forward_hook(lambda _m, _i, out: active.append(out[0].unique().numel())) for m in
             model.modules() if isinstance(m, Router)]  # fmt: skip
    try:
        _, _, nfe = run_once(way, model, prompts, args, ids)
    finally:
        for h in hooks:
            h.remove()
    kv = 0
    if way == "ours":
        n_layers, heads, hd = model.kv_shape()
        slots = -(-(args.prompt + args.gen) // args.block) * args.block
        kv = 2 * n_layers * len(prompts) * heads * slots * hd * emb.element_size()
    return fixed + kv + expert * sum(active) / max(nfe, 1)


def add_roofline(entry: dict, model, prompts, args, ids) -> None:
    """Each way's share of the memory-bandwidth roofline (bytes a forward must read x forwards / seconds, over the
    card's peak bandwidth): ``roofline_<way>``; ``roofline_ours`` and ``roofline_graphed`` as issue 48 records them."""
    from versus_reference import peak_gbps

    peak, source = peak_gbps(args.device, args.peak_gbps)
    entry["peak_gbps"], entry["peak_source"] = peak, source
    counted: dict[str, float] = {}  # the graphed way reads what the eager one does: one counting decode for both
    for w in args.ways:
        decode = "ours" if w.startswith("ours") else w
        if decode not in counted:
            counted[decode] = forward_bytes(model, decode, prompts, args, ids)
        per = counted[decode]
        gbps = per * entry["nfe"][w] / entry["seconds"][w] / 1e9
        entry[f"gb_per_forward_{w}"] = per / 1e9
        entry[f"ms_per_forward_{w}"] = 1e3 * entry["seconds"][w] / max(entry["nfe"][w], 1)
        entry[f"roofline_{w}"] = None if peak is None else gbps / peak
    entry["roofline_graphed"] = entry.get("roofline_ours_graphs")


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
    ap.add_argument("--layers", type=int, default=None, help="layers of the random models (default 4; mini: 20)")
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--shape", choices=["small", "mini"], default="small",
                    help="small: --widths with 8 experts (CPU); mini: LLaDA2.0-mini's widths (a GPU)")  # fmt: skip
    ap.add_argument("--experts", type=int, default=None, help="--shape mini: fewer routed experts (a smoke run)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--ways", default=None, help="comma-separated of ours, ours_graphs, reference, sdar "
                    "(default: ours, reference, sdar; with --device cuda ours_graphs too)")  # fmt: skip
    ap.add_argument("--peak-gbps", type=float, default=None, help="the roofline's bandwidth (default: by GPU name)")
    ap.add_argument("--model", default=None, help="a trained block-causal checkpoint instead of random ones")
    ap.add_argument("--data", default=None, help="with --model: the official ParallelBench directory (its prompts)")
    ap.add_argument("--samples", type=int, default=2, help="with --model: prompts per task, each decoded alone")
    args = ap.parse_args(argv)
    if args.model and not args.data:
        ap.error("--model needs --data (the official ParallelBench directory, for its prompts)")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error(f"--device {args.device}: torch sees no CUDA device")
    default = WAYS + (("ours_graphs",) if args.device.startswith("cuda") else ())
    args.ways = tuple(args.ways.split(",")) if args.ways else default
    if "ours" not in args.ways or not set(args.ways) <= {*WAYS, "ours_graphs"}:
        ap.error(f"--ways {','.join(args.ways)}: give ours and any of reference, sdar, ours_graphs")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    keys = ("threads", "gen", "block", "steps", "threshold", "layers", "vocab", "model", "samples", "repeats", "shape",
            "device", "dtype", "ways")  # fmt: skip
    result = {k: getattr(args, k) for k in keys} | {"runs": {}}
    if args.device.startswith("cuda"):
        result["gpu"] = torch.cuda.get_device_name(torch.device(args.device))
    if args.model:
        rows, model = official_prompts(args)
        ids = (model.mask_token_id, model.eos_token_ids[0])
        entry = compare(model, [[r] for r in rows], args, ids)
        result["runs"]["trained batch 1"] = entry
        _print("trained batch 1", entry)
    else:
        widths = ["mini"] if args.shape == "mini" else [int(h) for h in args.widths.split(",")]
        for hidden in widths:
            model = mini_model(args) if hidden == "mini" else random_model(hidden, args)
            # the tiny checkpoints' ids are the test format's; the mini model's the reference's defaults
            ids = (model.mask_token_id, model.eos_token_ids[0]) if hidden == "mini" else (MASK, EOS)
            for batch in [int(b) for b in args.batches.split(",")]:
                top = ids[0] - 1 if hidden != "mini" else min(ids) - 1
                prompts = random_prompts(batch, args.prompt, top)
                entry = compare(model, [prompts], args, ids)
                if hidden == "mini":
                    add_roofline(entry, model, prompts, args, ids)
                    entry["expert_path"] = args.expert_path
                result["runs"][f"hidden {hidden} batch {batch}"] = entry
                _print(f"hidden {hidden} batch {batch}", entry)
            del model
    print(json.dumps(result))
    return 0


def _print(label: str, e: dict) -> None:
    tps = " ".join(f"{w} {v:.1f}" for w, v in e["tokens_per_s"].items())
    ratios = " ".join(f"{k} {v:.2f}x" for k, v in e.items() if "_over_" in k)
    roof = " ".join(f"{k} {100 * v:.0f}%" for k, v in e.items() if k.startswith("roofline_") and v is not None)
    print(
        f"{label}: tokens {e['tokens']} same {e['same_tokens_as_ours']} forwards/block "
        f"{e['ours_forwards_per_block']:.1f} tok/s {tps} | {ratios} {roof}",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
