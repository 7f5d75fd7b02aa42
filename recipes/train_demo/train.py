"""Train a small LLaDA- or Dream-architecture masked-diffusion model on generated ParallelBench tasks (LLaDA SFT).

    python recipes/train_demo/train.py --data recipes/train_demo/work/data \
        --tokenizer recipes/train_demo/work/tokenizer --out recipes/train_demo/work/llada [--arch dream] [--resume]

Objective (LLaDA's SFT, Nie et al. 2025, "Large Language Diffusion Models", Alg. 2 / the SFT guidelines of the
LLaDA repository): the prompt is never masked; the response (answer, ``<|eot_id|>``, then ``<|endoftext|>`` up to the
task's fixed generation length, 32 waiting line / 64 puzzles, all trained on so the model learns where to end) is
masked independently per token with probability ``p = (1 - eps) t + eps``, ``t ~ U(0, 1)`` per example, and the
loss is the cross-entropy on masked response tokens weighted by ``1 / p`` and divided by the response length,
averaged over the batch. With ``--arch dream`` the same recipe trains the Dream architecture, whose raw logits are
shifted: token ``i`` is scored from the hidden state at ``i - 1``.

Rows are left-padded (positions ``cumsum(valid) - 1``, key-padding mask), exactly the canvas layout
``dlm_decode.generate`` decodes with, and batched in length buckets. Runs through ``accelerate`` (CPU here, GPUs
unchanged). Checkpoints (model, optimizer, scheduler, RNG states, step) are written to a temporary directory and
moved into place with ``os.replace``; ``--resume`` continues from the latest one with the same batches and masks
(both are functions of the seed and the step). The export (``--out``/final) is config.json + model.safetensors +
tokenizer files in the official formats.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# idle OpenMP threads sleep instead of spinning: on a shared 2-core machine spinning threads of concurrent jobs
# make a 2-thread step several times slower (measured: 1.8 s with 1 thread vs 6 s with 2 spinning threads)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from tokenizer import save_tokenizer  # noqa: E402  (recipes/train_demo/tokenizer.py)

from dlm_decode.models.dream import DreamConfig, DreamModel  # noqa: E402
from dlm_decode.models.llada import LLaDAConfig, LLaDAModelLM  # noqa: E402


@dataclass(frozen=True)
class ModelSize:
    d_model: int = 256
    n_layers: int = 6
    n_heads: int = 8
    n_kv_heads: int = 8
    mlp_hidden: int = 768
    max_len: int = 512
    rope_theta: float = 10000.0


def make_model(arch: str, size: ModelSize, tok: Any) -> torch.nn.Module:
    """A fresh model in the official config format, with the tokenizer's mask / eos / pad ids."""
    ids = dict(
        mask_token_id=tok.mask_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    vocab = len(tok)
    if arch == "llada":
        cfg = LLaDAConfig(
            d_model=size.d_model,
            n_layers=size.n_layers,
            n_heads=size.n_heads,
            n_kv_heads=size.n_kv_heads,
            mlp_hidden_size=size.mlp_hidden,
            vocab_size=vocab,
            embedding_size=vocab,
            max_sequence_length=size.max_len,
            rope_theta=size.rope_theta,
            **ids,
        )
        return LLaDAModelLM(cfg)
    if arch == "dream":
        cfg = DreamConfig(
            vocab_size=vocab,
            hidden_size=size.d_model,
            intermediate_size=size.mlp_hidden,
            num_hidden_layers=size.n_layers,
            num_attention_heads=size.n_heads,
            num_key_value_heads=size.n_kv_heads,
            max_position_embeddings=size.max_len,
            rope_theta=size.rope_theta,
            bos_token_id=tok.bos_token_id,
            **ids,
        )
        return DreamModel(cfg)
    raise ValueError(f"unknown arch {arch!r}; choose 'llada' or 'dream'")


# ------------------------------------------------------------------------------------------------ data


def encode_row(tok: Any, messages: list[dict], target: str, gen_length: int) -> tuple[list[int], list[int]]:
    """(prompt ids as dlm_decode.generate builds them, response ids of exactly ``gen_length``)."""
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prompt = list(tok(text, add_special_tokens=False)["input_ids"])
    answer = list(tok(target, add_special_tokens=False)["input_ids"])
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    resp = answer + [eot]
    if len(resp) > gen_length:
        raise ValueError(f"answer of {len(answer)} tokens does not fit in gen_length {gen_length}: {target!r}")
    return prompt, resp + [tok.eos_token_id] * (gen_length - len(resp))


def encode_dataset(split: Any, tok: Any) -> list[tuple[list[int], list[int]]]:
    return [
        encode_row(tok, json.loads(r["messages"]), r["target"], int(r["max_new_tokens"]))
        for r in split.select_columns(["messages", "target", "max_new_tokens"])
    ]


def cached_encoding(
    data_dir: Path, split: Any, tok: Any, tok_dir: str, limit: int | None, seed: int, tasks: str | None = None
) -> list:
    """encode_dataset, cached next to the dataset (keyed by the tokenizer file and the row selection)."""
    import hashlib

    key = hashlib.sha256(Path(tok_dir, "tokenizer.json").read_bytes()).hexdigest()[:12]
    sel = "" if not tasks else "-" + hashlib.sha256(tasks.encode()).hexdigest()[:8]
    path = data_dir / f"encoded-{key}-{limit}-{seed if limit else 0}{sel}.json"
    if path.is_file():
        return [tuple(r) for r in json.loads(path.read_text())]
    rows = encode_dataset(split, tok)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(rows))
    os.replace(tmp, path)
    return rows


def make_batches(lengths: list[int], batch_size: int, seed: int, jitter: float = 24.0) -> list[list[int]]:
    """Length-bucketed batches in a seeded random order: rows sorted by length plus a random jitter of +-``jitter``
    tokens, cut into batches, batches shuffled. A function of (lengths, batch_size, seed) only. The jitter is wide
    because every row of a puzzle task has the same length: narrow buckets make single-task batches, whose
    alternating gradients slowed learning in the pilot (loss plateau)."""
    rng = random.Random(seed)
    keyed = sorted(range(len(lengths)), key=lambda i: (lengths[i] + rng.uniform(-jitter, jitter), i))
    batches = [keyed[i : i + batch_size] for i in range(0, len(keyed), batch_size)]
    rng.shuffle(batches)
    return batches


def collate(rows: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Left-pad prompt + response rows -> ids, valid, response mask [B, T], response length [B]."""
    t = max(len(p) + len(r) for p, r in rows)
    b = len(rows)
    ids = torch.full((b, t), pad_id, dtype=torch.long)
    valid = torch.zeros((b, t), dtype=torch.bool)
    resp = torch.zeros((b, t), dtype=torch.bool)
    resp_len = torch.zeros(b)
    for i, (p, r) in enumerate(rows):
        n = len(p) + len(r)
        ids[i, t - n :] = torch.tensor(p + r)
        valid[i, t - n :] = True
        resp[i, t - len(r) :] = True
        resp_len[i] = len(r)
    return {"input_ids": ids, "valid": valid, "response": resp, "response_length": resp_len}


# ------------------------------------------------------------------------------------------------ loss


def mask_response(
    batch: dict[str, torch.Tensor], mask_id: int, generator: torch.Generator, eps: float = 1e-3
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """LLaDA forward process on the response only -> noisy ids, masked positions [B, T], p_mask [B]."""
    ids, resp = batch["input_ids"], batch["response"]
    b, t = ids.shape
    t_draw = torch.rand(b, generator=generator, device=generator.device).to(ids.device)
    p_mask = (1 - eps) * t_draw + eps  # [B]
    u = torch.rand(b, t, generator=generator, device=generator.device).to(ids.device)
    masked = (u < p_mask[:, None]) & resp  # [B, T]
    return torch.where(masked, torch.full_like(ids, mask_id), ids), masked, p_mask


def diffusion_loss(
    model: Any, batch: dict[str, torch.Tensor], generator: torch.Generator, eps: float = 1e-3
) -> tuple[torch.Tensor, dict[str, float]]:
    """LLaDA SFT loss: sum over masked response tokens of CE / p_mask, divided by the response length, batch mean.

    The LM head runs only on the hidden states that predict masked tokens (hidden ``i - logit_shift``).
    """
    core = model.module if hasattr(model, "module") else model
    noisy, masked, p_mask = mask_response(batch, core.mask_token_id, generator, eps)
    valid = batch["valid"]
    positions = (valid.long().cumsum(1) - 1).clamp(min=0)
    hid = core.hidden_states(noisy, positions, key_mask=valid)  # [B, T, d]
    rows, cols = masked.nonzero(as_tuple=True)
    logits = core.output_logits(hid[rows, cols - core.logit_shift])  # [M, V]
    ce = F.cross_entropy(logits.float(), batch["input_ids"][rows, cols], reduction="none")  # [M]
    weight = 1.0 / (p_mask[rows] * batch["response_length"][rows])
    loss = (ce * weight).sum() / noisy.shape[0]
    return loss, {"masked": int(rows.numel()), "ce": float(ce.detach().mean()) if rows.numel() else 0.0}


# ------------------------------------------------------------------------------------------------ state


def step_generator(seed: int, step: int, device: Any = "cpu") -> torch.Generator:
    """The masking RNG of one step: a function of (seed, step), so a resumed run draws the same masks."""
    g = torch.Generator(device=device)
    g.manual_seed(seed * 1_000_003 + step)
    return g


def latest_checkpoint(run_dir: Path) -> Path | None:
    pointer = run_dir / "checkpoints" / "latest"
    if not pointer.is_file():
        return None
    path = run_dir / "checkpoints" / pointer.read_text().strip()
    return path if path.is_dir() else None


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def save_checkpoint(accelerator: Any, run_dir: Path, step: int, extra: dict, keep: int = 2) -> Path:
    """accelerate state (model, optimizer, scheduler, RNG) + trainer_state.json, written to a temporary
    directory and renamed into place; then the ``latest`` pointer is swapped atomically and old ones pruned."""
    ckpt_root = run_dir / "checkpoints"
    ckpt_root.mkdir(parents=True, exist_ok=True)
    final = ckpt_root / f"step-{step:07d}"
    tmp = ckpt_root / f".tmp-step-{step:07d}"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    if accelerator.is_main_process:
        (tmp / "trainer_state.json").write_text(json.dumps({"step": step, **extra}, indent=1))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _write_text_atomic(ckpt_root / "latest", final.name)
        old = sorted(p for p in ckpt_root.glob("step-*") if p != final)
        for p in old[: max(len(old) - (keep - 1), 0)]:
            shutil.rmtree(p, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def export_model(model: Any, tok: Any, out: Path, card: dict | None = None) -> None:
    """config.json + model.safetensors + tokenizer files, written to ``out.tmp`` then moved to ``out``."""
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    save_tokenizer(tok, tmp)
    if card is not None:
        (tmp / "training.json").write_text(json.dumps(card, indent=1))
    old = out.with_name(out.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


# ------------------------------------------------------------------------------------------------ main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="dataset directory from data.py")
    ap.add_argument("--tokenizer", required=True, help="tokenizer directory from tokenizer.py")
    ap.add_argument("--out", required=True, help="run directory (checkpoints/, export/, log.jsonl)")
    ap.add_argument("--arch", choices=("llada", "dream"), default="llada")
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--n-layers", type=int, default=6)
    ap.add_argument("--n-heads", type=int, default=8)
    ap.add_argument("--n-kv-heads", type=int, default=None, help="default: n_heads (LLaDA), n_heads/2 (Dream)")
    ap.add_argument("--mlp-hidden", type=int, default=768)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-every", type=int, default=250, help="steps between evaluations and at the end (0: never)")
    ap.add_argument("--eval-samples", type=int, default=16, help="held-out samples per task per evaluation")
    ap.add_argument("--save-every", type=int, default=50)
    ap.add_argument("--export-every", type=int, default=0, help="also export the model every N steps")
    ap.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    ap.add_argument("--stop-after", type=int, default=None, help="stop at this step (as if interrupted)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-train-rows", type=int, default=None)
    ap.add_argument(
        "--tasks",
        default=None,
        help="comma-separated task names (e.g. waiting_line/copy,waiting_line/reverse) to train on; default: all. "
        "A curriculum is a sequence of runs, each started with --init from the previous export",
    )
    ap.add_argument(
        "--init",
        default=None,
        help="start from this exported model (config.json + model.safetensors) instead of fresh weights; the "
        "optimizer and schedule start fresh (the architecture flags are then taken from its config)",
    )
    return ap.parse_args(argv)


def evaluate_heldout(model: Any, tok: Any, eval_split: Any, per_task: int) -> dict[str, float]:
    from scoring import score_tasks

    items: dict[str, tuple[list, list, int]] = {}
    for r in eval_split:
        chats, samples, gl = items.setdefault(r["task"], ([], [], int(r["max_new_tokens"])))
        if len(chats) < per_task:
            chats.append(json.loads(r["messages"]))
            samples.append(json.loads(r["sample"]))
    res = score_tasks(model, tok, items)
    return {t: round(v["score"], 1) for t, v in res.items()}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from accelerate import Accelerator
    from datasets import load_from_disk
    from tqdm.auto import tqdm
    from transformers import AutoTokenizer, get_cosine_schedule_with_warmup

    torch.set_num_threads(args.threads)
    accelerator = Accelerator()
    run_dir = Path(args.out)
    run_dir.mkdir(parents=True, exist_ok=True)
    random.seed(args.seed)
    torch.manual_seed(args.seed)

    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    ds = load_from_disk(args.data)
    train_split = ds["train"]
    if args.tasks:
        wanted = [t.strip() for t in args.tasks.split(",") if t.strip()]
        known = set(train_split.unique("task"))
        unknown = sorted(set(wanted) - known)
        if unknown:
            raise SystemExit(f"--tasks: unknown task(s) {unknown}; the dataset has {sorted(known)}")
        keep = set(wanted)
        train_split = train_split.filter(lambda t: t in keep, input_columns="task")
    if args.max_train_rows:
        train_split = train_split.shuffle(seed=args.seed).select(range(args.max_train_rows))
    t0 = time.perf_counter()
    rows = cached_encoding(
        Path(args.data), train_split, tok, args.tokenizer, args.max_train_rows, args.seed, tasks=args.tasks
    )
    lengths = [len(p) + len(r) for p, r in rows]
    accelerator.print(
        f"{len(rows)} train rows encoded in {time.perf_counter() - t0:.0f}s; sequence length "
        f"min {min(lengths)} mean {sum(lengths) / len(lengths):.0f} max {max(lengths)}"
    )

    kv = args.n_kv_heads or (args.n_heads if args.arch == "llada" else max(args.n_heads // 2, 1))
    size = ModelSize(args.d_model, args.n_layers, args.n_heads, kv, args.mlp_hidden)
    if max(lengths) > size.max_len:
        raise ValueError(f"a row has {max(lengths)} tokens > max_len {size.max_len}")
    torch.manual_seed(args.seed)
    if args.init:
        from dlm_decode.models import load_model

        model, _ = load_model(args.init, dtype=torch.float32, tokenizer=False)
        if model.logit_shift != (1 if args.arch == "dream" else 0):
            raise SystemExit(f"--init {args.init} is not a {args.arch} model; pass the matching --arch")
        accelerator.print(f"initialised from {args.init} (its architecture; the size flags are ignored)")
    else:
        model = make_model(args.arch, size, tok)
    n_params = sum(p.numel() for p in model.parameters())
    accelerator.print(f"{args.arch}: {n_params / 1e6:.2f}M parameters, size {asdict(size)}")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
    )
    sched = get_cosine_schedule_with_warmup(opt, args.warmup, args.steps)
    model, opt, sched = accelerator.prepare(model, opt, sched)

    start_step = 0
    ckpt = latest_checkpoint(run_dir) if args.resume else None
    if ckpt is not None:
        accelerator.load_state(str(ckpt))
        start_step = json.loads((ckpt / "trainer_state.json").read_text())["step"]
        accelerator.print(f"resumed from {ckpt} at step {start_step}")

    per_epoch = make_batches(lengths, args.batch_size, args.seed)
    n_batches = len(per_epoch)
    epoch_cache: dict[int, list[list[int]]] = {0: per_epoch}

    def batch_for(step: int) -> list[int]:
        epoch = step // n_batches
        if epoch not in epoch_cache:
            epoch_cache.clear()
            epoch_cache[epoch] = make_batches(lengths, args.batch_size, args.seed + epoch)
        idx = epoch_cache[epoch][step % n_batches]
        return idx[accelerator.process_index :: accelerator.num_processes]

    log_path = run_dir / "log.jsonl"
    meta = {"arch": args.arch, "size": asdict(size), "params": n_params, "args": vars(args)}
    if args.init:  # the architecture is the initial model's
        meta["init"] = args.init
        meta["config"] = accelerator.unwrap_model(model).config.to_dict()
    (run_dir / "run.json").write_text(json.dumps(meta, indent=1))
    elapsed, ema = 0.0, None
    if ckpt is not None:
        state = json.loads((ckpt / "trainer_state.json").read_text())
        elapsed, ema = state.get("elapsed", 0.0), state.get("ema")
    model.train()
    bar = tqdm(range(start_step, args.steps), initial=start_step, total=args.steps, disable=False)
    t_last = time.perf_counter()
    done = start_step
    for step in bar:
        batch = collate([rows[i] for i in batch_for(step)], tok.pad_token_id)
        batch = {k: v.to(accelerator.device) for k, v in batch.items()}
        gen = step_generator(args.seed, step)
        loss, info = diffusion_loss(model, batch, gen)
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        now = time.perf_counter()
        elapsed += now - t_last
        t_last = now
        lv = float(loss.detach())
        ema = lv if ema is None else 0.98 * ema + 0.02 * lv
        bar.set_postfix(loss=f"{ema:.3f}", lr=f"{sched.get_last_lr()[0]:.2e}")
        done = step + 1
        record = {"step": done, "loss": round(lv, 4), "ema": round(ema, 4), "elapsed": round(elapsed, 1)}
        if args.eval_every and (done % args.eval_every == 0 or done == args.steps):
            scores = evaluate_heldout(accelerator.unwrap_model(model), tok, ds["eval"], args.eval_samples)
            record["eval"] = scores
            record["eval_mean"] = round(sum(scores.values()) / len(scores), 1)
            accelerator.print(json.dumps({"step": done, "eval_mean": record["eval_mean"], **scores}))
            t_last = time.perf_counter()  # evaluation time is not training time
        if accelerator.is_main_process:
            with open(log_path, "a") as f:
                f.write(json.dumps(record) + "\n")
        if done % args.save_every == 0 or done == args.steps:
            save_checkpoint(accelerator, run_dir, done, {"elapsed": elapsed, "ema": ema})
        if accelerator.is_main_process and (done == args.steps or args.export_every and done % args.export_every == 0):
            card = {"step": done, "train_seconds": round(elapsed), **meta}
            export_model(accelerator.unwrap_model(model), tok, run_dir / "export", card)
        if args.stop_after is not None and done >= args.stop_after:
            break
    bar.close()
    accelerator.print(f"done: {done} steps, {elapsed / 60:.1f} min of training")


if __name__ == "__main__":
    main()
