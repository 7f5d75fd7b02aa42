"""Certainty-forcing distillation (dParallel): fine-tune LLaDA / Dream on their own verified trajectories so that an
entropy-threshold decoder can commit many tokens per step.

    python recipes/certainty_forcing/train.py --model dlm_decode/demo_models/demo-llada \
        --traj recipes/certainty_forcing/work/traj-llada --out recipes/certainty_forcing/work/llada [--resume]
    accelerate launch --config_file recipes/certainty_forcing/configs/ddp.yaml recipes/certainty_forcing/train.py ...

Per optimizer step, ``--batch-size`` trajectories (global, over all processes) are drawn in a seeded, length-bucketed
order (incomplete last batch of an epoch dropped). Each is masked twice with complementary masks
(``masking.complementary_views``: LLaDA one random response block, Dream the whole response) and both views go
through the model's official forward in one batch; the loss is ``losses.certainty_forcing_loss`` (CE + beta * entropy
of the correctly predicted tokens at T = 0.5), one value per example, equal to that example's batch-1 loss in the
reference. The step minimises the mean over its examples: every device runs ``--micro-batch-size`` rows per forward,
``accelerate`` accumulates ``batch / (micro x processes)`` micro-batches and averages over processes, so the gradient
is the same for any split. Masks are drawn per example from (seed, step, example id), so they do not depend on the
split either.

LoRA (peft) on the seven projections of every block (``lora.LORA_TARGETS``), or ``--full`` fine-tuning. AdamW, grad
clip 1, constant LR (LLaDA reference) or ``--schedule cosine`` with warm-up (Dream reference). Every ``--eval-every``
steps (and before the first) the held-out prompts are decoded with ``entropy_threshold`` (eta 0.5) and score + NFE are
logged. Checkpoints (model, optimizer, scheduler, RNG, step) go to a temporary directory renamed into place
(train_demo's ``save_checkpoint``); ``--resume`` continues from the latest one and reaches bitwise the same weights as
an uninterrupted run. At the end the adapters are merged (``merge_and_unload``) and ``<out>/export`` holds a plain
checkpoint in the official format (config.json + model.safetensors + tokenizer files).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # shared cores: idle OpenMP threads sleep (see train_demo)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from certainty_forcing.common import arch_of, demo_train, unwrap  # noqa: E402
from certainty_forcing.losses import BETA, TEMPERATURE, certainty_forcing_loss  # noqa: E402
from certainty_forcing.masking import (  # noqa: E402
    check_ratio_range,
    complementary_views,
    example_ratios,
    example_uniforms,
)

Row = tuple[list[int], list[int]]  # prompt ids, response ids


# ------------------------------------------------------------------------------------------------ data


def load_trajectories(path: str | Path, max_rows: int | None = None) -> list[Row]:
    from certainty_forcing.trajectories import read_jsonl

    rows = [(r["prompt_ids"], r["response_ids"]) for r in read_jsonl(path)]
    if not rows:
        raise ValueError(f"{path} holds no trajectories")
    return rows[:max_rows] if max_rows else rows


def epoch_batches(lengths: list[int], batch_size: int, seed: int) -> list[list[int]]:
    """One epoch of full batches: a seeded permutation, its remainder (n mod batch) dropped, the rest sorted by
    length with a random tie-break (+-4 tokens) and cut into batches, batches shuffled. A function of its inputs."""
    n = len(lengths)
    if n < batch_size:
        raise ValueError(f"{n} trajectories < batch size {batch_size}")
    rng = random.Random(seed)
    order = list(range(n))
    rng.shuffle(order)
    order = order[: n - n % batch_size]
    keyed = sorted(order, key=lambda i: (lengths[i] + rng.uniform(-4, 4), i))
    batches = [keyed[i : i + batch_size] for i in range(0, len(keyed), batch_size)]
    rng.shuffle(batches)
    return batches


def example_losses(
    model: Any,
    rows: list[Row],
    example_ids: list[int],
    *,
    seed: int,
    step: int,
    mask_id: int,
    pad_id: int,
    arch: str,
    beta: float,
    temperature: float = TEMPERATURE,
    block: int = 32,
    ratio: float = 0.5,
    ratio_range: tuple[float, float] | None = None,
    device: Any = "cpu",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-example certainty-forcing losses [B] of a micro-batch (both views in one forward of the official model)."""
    batch = demo_train().collate(rows, pad_id)  # left padding, responses right-aligned
    ids, valid = batch["input_ids"], batch["valid"]
    length = batch["response_length"].long()
    t = ids.shape[1]
    start = t - length
    uniforms = example_uniforms(seed, step, example_ids, start, length, t)
    if ratio_range is not None:  # per-example ratios (not in the reference; see masking.py)
        ratio = example_ratios(seed, step, example_ids, *ratio_range)  # [B]
    views = complementary_views(
        ids, start, length, mask_id=mask_id, uniforms=uniforms, semi_ar=arch == "llada", block=block, ratio=ratio
    )
    pos = (valid.long().cumsum(1) - 1).clamp(min=0)
    x = torch.cat([views.noisy_a, views.noisy_b]).to(device)
    logits = model(
        input_ids=x,
        attention_mask=torch.cat([valid, valid]).to(device),
        position_ids=torch.cat([pos, pos]).to(device),
    ).logits  # [2B, T, V] official (Dream: unshifted) logits
    la, lb = logits.chunk(2)
    return certainty_forcing_loss(
        la,
        lb,
        ids.to(device),
        views.loss_a.to(device),
        views.loss_b.to(device),
        beta=beta,
        temperature=temperature,
        logit_shift=1 if arch == "dream" else 0,
    )


# ------------------------------------------------------------------------------------------------ eval


def heldout_tasks(traj_dir: Path, data_dir: str | Path, per_task: int) -> list[Any]:
    """``Task`` objects over the held-out prompts of ``trajectories.py`` (configs from the official task configs)."""
    from certainty_forcing.trajectories import read_jsonl
    from dlm_decode.parallelbench.tasks import Task, load_task

    path = traj_dir / "heldout.jsonl"
    if not path.is_file() or per_task <= 0:
        return []
    samples: dict[str, list[dict]] = {}
    for r in read_jsonl(path):
        got = samples.setdefault(r["task"], [])
        if len(got) < per_task:
            got.append(json.loads(r["sample"]))
    return [Task(name, load_task(data_dir, name, limit=0).config, s) for name, s in samples.items()]


# ------------------------------------------------------------------------------------------------ main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="base checkpoint directory or demo name")
    ap.add_argument("--traj", required=True, help="directory from trajectories.py (train.jsonl, heldout.jsonl)")
    ap.add_argument("--out", required=True, help="run directory (checkpoints/, export/, log.jsonl)")
    ap.add_argument("--data-dir", default="/work/shared/data/parallelbench", help="official task configs (eval)")
    ap.add_argument("--full", action="store_true", help="full fine-tuning instead of LoRA")
    ap.add_argument("--lora-rank", type=int, default=None, help="default: 128 LLaDA, 32 Dream (the references)")
    ap.add_argument("--lora-alpha", type=float, default=None, help="default: the rank")
    ap.add_argument("--beta", type=float, default=None, help="entropy weight; default 2 LLaDA, 1 Dream")
    ap.add_argument("--temperature", type=float, default=TEMPERATURE)
    ap.add_argument("--ratio", type=float, default=0.5, help="mask ratio of view A (view B is its complement)")
    ap.add_argument(
        "--ratio-range",
        type=float,
        nargs=2,
        metavar=("LOW", "HIGH"),
        default=None,
        help="view A's ratio drawn per example and step in [LOW, HIGH] instead of --ratio (not in the reference)",
    )
    ap.add_argument("--block", type=int, default=32, help="LLaDA semi-AR block (also the eval decoder's block)")
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--schedule", choices=("constant", "cosine"), default="constant")
    ap.add_argument("--warmup-ratio", type=float, default=0.0)
    ap.add_argument("--max-grad-norm", type=float, default=1.0)
    ap.add_argument("--epochs", type=float, default=6.0)
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps (overrides --epochs)")
    ap.add_argument("--batch-size", type=int, default=8, help="trajectories per optimizer step, all processes")
    ap.add_argument("--micro-batch-size", type=int, default=1, help="rows per forward per process")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-every", type=int, default=0, help="steps between evaluations (0: none)")
    ap.add_argument("--eval-per-task", type=int, default=8, help="held-out prompts per task per evaluation")
    ap.add_argument("--eval-eta", type=float, default=0.5)
    ap.add_argument("--eval-batch-size", type=int, default=50)
    ap.add_argument("--save-every", type=int, default=50)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--stop-after", type=int, default=None, help="checkpoint and stop at this step (an interruption)")
    ap.add_argument("--no-export", action="store_true")
    ap.add_argument("--max-rows", type=int, default=None)
    ap.add_argument("--dtype", default="float32", help="weights dtype (bf16 mixed precision: accelerate config)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    if not 0.0 < args.ratio < 1.0:
        ap.error(f"--ratio must lie in (0, 1), got {args.ratio}")
    if args.ratio_range is not None:
        try:
            check_ratio_range(*args.ratio_range)
        except ValueError:
            ap.error(f"--ratio-range LOW HIGH must satisfy 0 < LOW <= HIGH < 1, got {args.ratio_range}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    from accelerate import Accelerator
    from tqdm.auto import tqdm
    from transformers import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

    import dlm_decode
    from certainty_forcing.evaluate import evaluate_tasks, parallel_decoding
    from certainty_forcing.lora import add_lora, export, merge

    torch.set_num_threads(args.threads)
    # the scheduler is stepped once per optimizer step by hand (accelerate would step it once per process)
    accelerator = Accelerator(step_scheduler_with_optimizer=False)
    world = accelerator.num_processes
    if args.batch_size % (args.micro_batch_size * world):
        raise ValueError(
            f"--batch-size {args.batch_size} must be a multiple of micro-batch {args.micro_batch_size} x "
            f"{world} processes"
        )
    accum = args.batch_size // (args.micro_batch_size * world)
    accelerator.gradient_accumulation_steps = accum
    ds = accelerator.state.deepspeed_plugin
    if ds is not None:  # DeepSpeed takes micro-batch, accumulation and clipping from its own config (untested here)
        ds.deepspeed_config.update(
            train_micro_batch_size_per_gpu=args.micro_batch_size,
            gradient_accumulation_steps=accum,
            gradient_clipping=args.max_grad_norm,
        )
    rank = accelerator.process_index
    run_dir = Path(args.out)
    run_dir.mkdir(parents=True, exist_ok=True)
    traj_dir = Path(args.traj)
    demo = demo_train()

    rows = load_trajectories(traj_dir / "train.jsonl", args.max_rows)
    if len(rows) < args.batch_size:  # an epoch would hold no full batch (checked before any weight is read)
        raise ValueError(
            f"{traj_dir / 'train.jsonl'}: {len(rows)} trajectories, fewer than --batch-size {args.batch_size}; "
            "decode more (trajectories.py --n-per-task) or lower --batch-size"
        )
    lengths = [len(p) + len(r) for p, r in rows]
    per_epoch = len(rows) // args.batch_size
    total = args.steps if args.steps is not None else max(1, round(args.epochs * per_epoch))

    torch.manual_seed(args.seed)
    # trained as the checkpoint stores its weights (the decode layout, models/layout.py, is measured for decoding only)
    model, tok = dlm_decode.load_model(args.model, dtype=args.dtype, layout="official")
    arch = arch_of(model)
    beta = args.beta if args.beta is not None else BETA[arch]
    mask_id, pad_id = model.mask_token_id, tok.pad_token_id
    if args.full:
        params = list(model.parameters())
    else:
        model = add_lora(model, args.lora_rank, args.lora_alpha)
        params = [p for p in model.parameters() if p.requires_grad]
    model.train()
    n_train = sum(p.numel() for p in params)
    accelerator.print(
        f"{arch}: {len(rows)} trajectories, {per_epoch} steps/epoch, {total} steps; batch {args.batch_size} = "
        f"{accum} x micro {args.micro_batch_size} x {world} processes; {n_train / 1e6:.3f}M trainable parameters"
        + ("" if args.full else " (LoRA)")
    )
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=args.weight_decay)
    warmup = round(args.warmup_ratio * total)
    if args.schedule == "cosine":
        sched = get_cosine_schedule_with_warmup(opt, warmup, total)
    else:
        sched = get_constant_schedule_with_warmup(opt, warmup)
    model, opt, sched = accelerator.prepare(model, opt, sched)

    eval_tasks = heldout_tasks(traj_dir, args.data_dir, args.eval_per_task) if args.eval_every else []
    if eval_tasks:
        from dlm_decode.samplers import get_sampler

        get_sampler("entropy_threshold", {"eta": args.eval_eta})  # fail now, not after hours of training

    start_step, elapsed = 0, 0.0
    log_path = run_dir / "log.jsonl"
    ckpt = demo.latest_checkpoint(run_dir) if args.resume else None
    if ckpt is not None:
        accelerator.load_state(str(ckpt))
        state = json.loads((ckpt / "trainer_state.json").read_text())
        start_step, elapsed = state["step"], state.get("elapsed", 0.0)
        accelerator.print(f"resumed from {ckpt} at step {start_step}")
        if accelerator.is_main_process and log_path.is_file():  # drop records written after that checkpoint
            keep = [ln for ln in log_path.read_text().splitlines() if json.loads(ln)["step"] <= start_step]
            tmp = log_path.with_name(log_path.name + ".tmp")
            tmp.write_text("".join(x + "\n" for x in keep))
            os.replace(tmp, log_path)
    elif accelerator.is_main_process:
        log_path.unlink(missing_ok=True)
    if accelerator.is_main_process:
        (run_dir / "run.json").write_text(json.dumps({"arch": arch, "steps": total, "args": vars(args)}, indent=1))

    def log(record: dict) -> None:
        if accelerator.is_main_process:
            with open(log_path, "a") as f:
                f.write(json.dumps(record) + "\n")

    last_eval: dict[str, Any] = {}

    def run_eval(step: int) -> None:
        if accelerator.is_main_process:
            res = evaluate_tasks(
                accelerator.unwrap_model(model),
                tok,
                eval_tasks,
                parallel_decoding(args.eval_eta, args.block),
                batch_size=args.eval_batch_size,
            )
            last_eval.clear()
            last_eval.update(res)
            scores = {t.split("/")[-1]: v["score"] for t, v in res["tasks"].items()}
            accelerator.print(json.dumps({"step": step, "score": res["score"], "nfe": res["nfe"], **scores}))
            log({"step": step, "eval": res})
        accelerator.wait_for_everyone()

    if eval_tasks and start_step == 0:
        run_eval(0)

    epoch_cache: dict[int, list[list[int]]] = {}

    def batch_for(step: int) -> list[int]:
        epoch = step // per_epoch
        if epoch not in epoch_cache:
            epoch_cache.clear()
            epoch_cache[epoch] = epoch_batches(lengths, args.batch_size, args.seed + epoch)
        return epoch_cache[epoch][step % per_epoch]

    bar = tqdm(total=total, initial=start_step, desc="certainty forcing", disable=not accelerator.is_main_process)
    t_last = time.perf_counter()
    for step in range(start_step, total):
        mine = batch_for(step)[rank::world]
        sums = torch.zeros(4)  # loss, ce, entropy, correct fraction (summed over this process's examples)
        for j in range(accum):
            ex = mine[j * args.micro_batch_size : (j + 1) * args.micro_batch_size]
            with accelerator.accumulate(model):
                per_ex, st = example_losses(
                    model,
                    [rows[i] for i in ex],
                    ex,
                    seed=args.seed,
                    step=step,
                    mask_id=mask_id,
                    pad_id=pad_id,
                    arch=arch,
                    beta=beta,
                    temperature=args.temperature,
                    block=args.block,
                    ratio=args.ratio,
                    ratio_range=tuple(args.ratio_range) if args.ratio_range else None,
                    device=accelerator.device,
                )
                accelerator.backward(per_ex.mean())
                if accelerator.sync_gradients and args.max_grad_norm:
                    accelerator.clip_grad_norm_(params, args.max_grad_norm)
                opt.step()
                opt.zero_grad(set_to_none=True)
            frac = st["n_correct"] / st["n_masked"].clamp(min=1)
            sums += torch.stack([per_ex.sum(), st["ce"].sum(), st["entropy"].sum(), frac.sum()]).detach().cpu()
        sched.step()
        sums = accelerator.reduce(sums.to(accelerator.device), reduction="sum").cpu() / args.batch_size
        now = time.perf_counter()
        elapsed += now - t_last
        t_last = now
        done = step + 1
        loss, ce, ent, correct = (round(float(v), 4) for v in sums)
        bar.set_postfix(loss=f"{loss:.3f}", ce=f"{ce:.3f}", ent=f"{ent:.3f}")
        bar.update(1)
        lr = sched.get_last_lr()[0]
        log({"step": done, "loss": loss, "ce": ce, "entropy": ent, "correct": correct, "lr": lr, "elapsed": elapsed})
        if eval_tasks and (done % args.eval_every == 0 or done == total):
            run_eval(done)
            t_last = time.perf_counter()  # evaluation time is not training time
        stop = args.stop_after is not None and done >= args.stop_after and done < total
        if done % args.save_every == 0 or done == total or stop:
            demo.save_checkpoint(accelerator, run_dir, done, {"elapsed": elapsed})
        if stop:
            bar.close()
            accelerator.print(f"stopped at step {done} (--stop-after); continue with --resume")
            return {"step": done}
    bar.close()
    summary = {"step": total, "train_seconds": round(elapsed, 1), "eval": last_eval}
    if accelerator.is_main_process and not args.no_export:
        core = accelerator.unwrap_model(model)
        core = unwrap(core) if args.full else merge(core)
        card = {"recipe": "certainty_forcing", "base": str(args.model), "arch": arch, **summary, "args": vars(args)}
        export(core, tok, run_dir / "export", card)
        accelerator.print(f"exported merged model to {run_dir / 'export'}")
    accelerator.wait_for_everyone()
    return summary


if __name__ == "__main__":
    from dlm_decode.cli import run_script

    run_script(main, "certainty_forcing/train.py")
