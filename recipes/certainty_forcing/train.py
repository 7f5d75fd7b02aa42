"""Certainty-forcing distillation (dParallel): fine-tune LLaDA / Dream on their own verified trajectories so that an
entropy-threshold decoder can commit many tokens per step.

    python -m recipes.certainty_forcing.train --model demo-llada --traj runs/certainty_forcing/traj-demo-llada \
        [--out runs/certainty_forcing/llada] [--data PARALLELBENCH_DIR] [--resume]
    accelerate launch --config_file recipes/certainty_forcing/configs/ddp.yaml -m recipes.certainty_forcing.train ...

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
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from tqdm.auto import tqdm
from transformers import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

import dlm_decode
from dlm_decode.cli import run_script
from dlm_decode.parallelbench.tasks import Task, load_task
from dlm_decode.samplers import get_sampler
from recipes.certainty_forcing.common import arch_of, unwrap
from recipes.certainty_forcing.evaluate import evaluate_tasks, parallel_decoding
from recipes.certainty_forcing.lora import add_lora, export, merge
from recipes.certainty_forcing.losses import BETA, TEMPERATURE, certainty_forcing_loss
from recipes.certainty_forcing.masking import (
    check_ratio_range,
    complementary_views,
    example_ratios,
    example_uniforms,
)
from recipes.certainty_forcing.trajectories import read_jsonl
from recipes.pb_data import DATA_ENV, data_dir
from recipes.train_demo.checkpoint import latest_checkpoint, save_checkpoint
from recipes.train_demo.objective import collate

Row = tuple[list[int], list[int]]  # prompt ids, response ids


# ------------------------------------------------------------------------------------------------ data


def load_trajectories(path: str | Path, max_rows: int | None = None) -> list[Row]:
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
    batch = collate(rows, pad_id)  # left padding, responses right-aligned
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
    ap.add_argument("--out", default=None, help="run directory (default: runs/certainty_forcing/<--traj's name>)")
    ap.add_argument("--data", default=None, help=f"official ParallelBench directory, for --eval-every (${DATA_ENV})")
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
    if args.out is None:
        args.out = str(Path("runs") / "certainty_forcing" / Path(args.traj).name.removeprefix("traj-"))
    return args


@dataclass
class Run:
    """A run's live objects, made by ``setup`` and advanced by ``train_step``."""

    args: argparse.Namespace
    accelerator: Any
    accum: int  # micro-batches per optimizer step on each process
    rows: list[Row]
    per_epoch: int
    total: int
    model: Any = None
    tok: Any = None
    arch: str = ""
    beta: float = 0.0
    mask_id: int = 0
    params: list = field(default_factory=list)
    opt: Any = None
    sched: Any = None
    eval_tasks: list = field(default_factory=list)
    start_step: int = 0
    elapsed: float = 0.0
    last_eval: dict = field(default_factory=dict)
    epochs: dict = field(default_factory=dict)

    @property
    def out(self) -> Path:
        return Path(self.args.out)

    @property
    def log_path(self) -> Path:
        return self.out / "log.jsonl"


# ------------------------------------------------------------------------------------------------ set-up


def make_accelerator(args: argparse.Namespace) -> tuple[Any, int]:
    """accelerate with the step's accumulation: ``batch = accum x micro x processes`` (checked)."""
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
    return accelerator, accum


def setup(args: argparse.Namespace) -> Run:
    """Trajectories, data checks, model (LoRA or full), optimizer and schedule, held-out tasks; the latest checkpoint
    with ``--resume``. Every cheap check runs before a weight is read."""
    torch.set_num_threads(args.threads)
    accelerator, accum = make_accelerator(args)
    traj_dir = Path(args.traj)
    rows = load_trajectories(traj_dir / "train.jsonl", args.max_rows)
    if len(rows) < args.batch_size:  # an epoch would hold no full batch
        raise ValueError(
            f"{traj_dir / 'train.jsonl'}: {len(rows)} trajectories, fewer than --batch-size {args.batch_size}; "
            "decode more (trajectories.py --n-per-task) or lower --batch-size"
        )
    pb = data_dir(args.data) if args.eval_every else None
    if args.eval_every:
        get_sampler("entropy_threshold", {"eta": args.eval_eta})  # fail now, not after hours of training
    per_epoch = len(rows) // args.batch_size
    total = args.steps if args.steps is not None else max(1, round(args.epochs * per_epoch))
    run = Run(args, accelerator, accum, rows, per_epoch, total)
    run.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    # trained as the checkpoint stores its weights (the decode layout, models/layout.py, is measured for decoding only)
    model, run.tok = dlm_decode.load_model(args.model, dtype=args.dtype, layout="official")
    run.arch = arch_of(model)
    run.beta = args.beta if args.beta is not None else BETA[run.arch]
    run.mask_id = model.mask_token_id
    if not args.full:
        model = add_lora(model, args.lora_rank, args.lora_alpha)
    run.params = [p for p in model.parameters() if p.requires_grad] if not args.full else list(model.parameters())
    model.train()
    opt = torch.optim.AdamW(run.params, lr=args.lr, weight_decay=args.weight_decay)
    warmup = round(args.warmup_ratio * total)
    if args.schedule == "cosine":
        sched = get_cosine_schedule_with_warmup(opt, warmup, total)
    else:
        sched = get_constant_schedule_with_warmup(opt, warmup)
    run.model, run.opt, run.sched = accelerator.prepare(model, opt, sched)
    run.eval_tasks = heldout_tasks(traj_dir, pb, args.eval_per_task) if pb is not None else []
    n_train = sum(p.numel() for p in run.params)
    accelerator.print(
        f"{run.arch}: {len(rows)} trajectories, {per_epoch} steps/epoch, {total} steps; batch {args.batch_size} = "
        f"{accum} x micro {args.micro_batch_size} x {accelerator.num_processes} processes; "
        f"{n_train / 1e6:.3f}M trainable parameters" + ("" if args.full else " (LoRA)")
    )
    restore(run)
    if accelerator.is_main_process:
        meta = {"arch": run.arch, "steps": total, "args": vars(args)}
        (run.out / "run.json").write_text(json.dumps(meta, indent=1))
    return run


def restore(run: Run) -> None:
    """With ``--resume``, load the latest checkpoint and drop log records written after it; else a fresh log."""
    ckpt = latest_checkpoint(run.out) if run.args.resume else None
    acc = run.accelerator
    if ckpt is None:
        if acc.is_main_process:
            run.log_path.unlink(missing_ok=True)
        return
    acc.load_state(str(ckpt))
    state = json.loads((ckpt / "trainer_state.json").read_text())
    run.start_step, run.elapsed = state["step"], state.get("elapsed", 0.0)
    acc.print(f"resumed from {ckpt} at step {run.start_step}")
    if acc.is_main_process and run.log_path.is_file():
        keep = [ln for ln in run.log_path.read_text().splitlines() if json.loads(ln)["step"] <= run.start_step]
        tmp = run.log_path.with_name(run.log_path.name + ".tmp")
        tmp.write_text("".join(x + "\n" for x in keep))
        os.replace(tmp, run.log_path)


# ------------------------------------------------------------------------------------------------ the step


def batch_for(run: Run, step: int) -> list[int]:
    """The example ids of ``step``: its epoch's seeded, length-bucketed batches (one epoch cached)."""
    epoch = step // run.per_epoch
    if epoch not in run.epochs:
        run.epochs.clear()
        lengths = [len(p) + len(r) for p, r in run.rows]
        run.epochs[epoch] = epoch_batches(lengths, run.args.batch_size, run.args.seed + epoch)
    return run.epochs[epoch][step % run.per_epoch]


def train_step(run: Run, step: int) -> dict[str, float]:
    """One optimizer step over ``accum`` micro-batches; the batch means of loss, CE, entropy, correct fraction."""
    args, acc = run.args, run.accelerator
    mine = batch_for(run, step)[acc.process_index :: acc.num_processes]
    sums = torch.zeros(4)  # loss, ce, entropy, correct fraction (summed over this process's examples)
    for j in range(run.accum):
        ex = mine[j * args.micro_batch_size : (j + 1) * args.micro_batch_size]
        with acc.accumulate(run.model):
            per_ex, st = example_losses(
                run.model,
                [run.rows[i] for i in ex],
                ex,
                seed=args.seed,
                step=step,
                mask_id=run.mask_id,
                pad_id=run.tok.pad_token_id,
                arch=run.arch,
                beta=run.beta,
                temperature=args.temperature,
                block=args.block,
                ratio=args.ratio,
                ratio_range=tuple(args.ratio_range) if args.ratio_range else None,
                device=acc.device,
            )
            acc.backward(per_ex.mean())
            if acc.sync_gradients and args.max_grad_norm:
                acc.clip_grad_norm_(run.params, args.max_grad_norm)
            run.opt.step()
            run.opt.zero_grad(set_to_none=True)
        frac = st["n_correct"] / st["n_masked"].clamp(min=1)
        sums += torch.stack([per_ex.sum(), st["ce"].sum(), st["entropy"].sum(), frac.sum()]).detach().cpu()
    run.sched.step()
    sums = acc.reduce(sums.to(acc.device), reduction="sum").cpu() / args.batch_size
    loss, ce, ent, correct = (round(float(v), 4) for v in sums)
    return {"loss": loss, "ce": ce, "entropy": ent, "correct": correct, "lr": run.sched.get_last_lr()[0]}


# ------------------------------------------------------------------------------------------------ evaluation


def log(run: Run, record: dict) -> None:
    if run.accelerator.is_main_process:
        with open(run.log_path, "a") as f:
            f.write(json.dumps(record) + "\n")


def run_eval(run: Run, step: int) -> None:
    """The held-out prompts decoded with ``entropy_threshold`` at ``--eval-eta``: score and NFE, logged."""
    acc = run.accelerator
    if acc.is_main_process:
        decoding = parallel_decoding(run.args.eval_eta, run.args.block)
        res = evaluate_tasks(
            acc.unwrap_model(run.model), run.tok, run.eval_tasks, decoding, batch_size=run.args.eval_batch_size
        )
        run.last_eval = res
        scores = {t.split("/")[-1]: v["score"] for t, v in res["tasks"].items()}
        acc.print(json.dumps({"step": step, "score": res["score"], "nfe": res["nfe"], **scores}))
        log(run, {"step": step, "eval": res})
    acc.wait_for_everyone()


# ------------------------------------------------------------------------------------------------ checkpointing


def finish(run: Run) -> dict[str, Any]:
    """Merge the adapters (LoRA) and export the plain model to ``out/export`` with its card; the run's summary."""
    summary = {"step": run.total, "train_seconds": round(run.elapsed, 1), "eval": run.last_eval}
    acc = run.accelerator
    if acc.is_main_process and not run.args.no_export:
        core = acc.unwrap_model(run.model)
        core = unwrap(core) if run.args.full else merge(core)
        card = {"recipe": "certainty_forcing", "base": str(run.args.model), "arch": run.arch, **summary}
        export(core, run.tok, run.out / "export", {**card, "args": vars(run.args)})
        acc.print(f"exported merged model to {run.out / 'export'}")
    acc.wait_for_everyone()
    return summary


# ------------------------------------------------------------------------------------------------ the loop


def main(argv: list[str] | None = None) -> dict[str, Any]:
    run = setup(parse_args(argv))
    args, acc = run.args, run.accelerator
    if run.eval_tasks and run.start_step == 0:
        run_eval(run, 0)
    bar = tqdm(total=run.total, initial=run.start_step, desc="certainty forcing", disable=not acc.is_main_process)
    t_last = time.perf_counter()
    for step in range(run.start_step, run.total):
        record = train_step(run, step)
        now = time.perf_counter()
        run.elapsed += now - t_last
        done = step + 1
        bar.set_postfix(loss=f"{record['loss']:.3f}", ce=f"{record['ce']:.3f}", ent=f"{record['entropy']:.3f}")
        bar.update(1)
        log(run, {"step": done, **record, "elapsed": run.elapsed})
        if run.eval_tasks and (done % args.eval_every == 0 or done == run.total):
            run_eval(run, done)
        stop = args.stop_after is not None and done >= args.stop_after and done < run.total
        if done % args.save_every == 0 or done == run.total or stop:
            save_checkpoint(acc, run.out, done, {"elapsed": run.elapsed})
        t_last = time.perf_counter()  # evaluation and checkpoint time is not training time
        if stop:
            bar.close()
            acc.print(f"stopped at step {done} (--stop-after); continue with --resume")
            return {"step": done}
    bar.close()
    return finish(run)


if __name__ == "__main__":
    run_script(main, "certainty_forcing/train.py")
