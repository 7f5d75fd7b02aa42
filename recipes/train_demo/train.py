"""Train a small LLaDA- or Dream-family masked-diffusion model on generated ParallelBench tasks (LLaDA SFT).

    python -m recipes.train_demo.train --config recipes/train_demo/configs/demo-llada.yaml --data PB_DIR
        [--out runs/train_demo/demo-llada] [--init CHECKPOINT] [--resume] [--set run.threads=1]

The config (``config.py``; YAML, see ``configs/``) names the model, the rows (``stream.py``), the optimizer and the
curriculum's stages; the objective is LLaDA's SFT loss (``objective.py``). Every batch and every mask is a function
of (seed, step), so ``--resume`` continues from the latest atomic checkpoint in ``--out`` (``checkpoint.py``) and ends
bit-identical to an uninterrupted run. The run directory holds ``run.json`` (the config), ``log.jsonl`` (one line a
step), ``checkpoints/`` and ``export/`` (config.json + model.safetensors + tokenizer files, the official format).
The official ParallelBench files come from ``--data`` or ``$DLM_PARALLELBENCH_DATA``: their task configs and names
drive the generated rows, their test samples (and the held-out evaluation samples) are never trained on.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from tqdm.auto import tqdm
from transformers import AutoTokenizer

from dlm_decode.cli import run_script
from dlm_decode.models.loading import resolve_model_path
from dlm_decode.parallelbench.tasks import max_new_tokens
from recipes.pb_data import data_dir
from recipes.train_demo.checkpoint import (
    export_model,
    latest_checkpoint,
    log_step,
    save_checkpoint,
    write_text_atomic,
)
from recipes.train_demo.config import Stage, TrainConfig, load_config, task_name
from recipes.train_demo.model import initial_model, trainable_parameters
from recipes.train_demo.objective import collate, diffusion_loss, name_tail_ids, step_generator
from recipes.train_demo.prefetch import RowSource
from recipes.train_demo.schedule import apply_peak_rate, stage_at, stage_starts, wsd_lambda
from recipes.train_demo.scoring import score_task
from recipes.train_demo.self_rows import load_self_rows
from recipes.train_demo.stream import (
    TASKS,
    Mix,
    RowStream,
    eval_items,
    excluded_prompts,
    heldout,
    keys_of,
    official_keys,
)

EVAL_SEED = 9_000_001  # held-out samples: fresh seeds, far from the official five-digit ones


@dataclass
class Run:
    """A run's live objects, made by ``setup`` and advanced by ``train_step``."""

    cfg: TrainConfig
    out: Path
    accelerator: Any
    tok: Any
    source: RowSource
    evals: dict[str, dict]
    model: Any
    opt: Any
    sched: Any
    trainable: list
    meta: dict
    start_step: int = 0
    elapsed: float = 0.0
    ema: float | None = None
    name_tails: torch.Tensor | None = None  # [V] bool, the ids whole-name rows join to their first name

    @property
    def log_path(self) -> Path:
        return self.out / "log.jsonl"


# ------------------------------------------------------------------------------------------------ set-up


def tokenizer_dir(cfg: TrainConfig) -> Path:
    """``model.tokenizer``, else the init (or upcycled) checkpoint's directory; checked for a tokenizer.json."""
    source = cfg.model.init or cfg.model.upcycle
    path = Path(cfg.model.tokenizer) if cfg.model.tokenizer else resolve_model_path(source)
    if not (path / "tokenizer.json").is_file():
        raise ValueError(f"model.tokenizer: {path} holds no tokenizer.json (tokenizer.py writes the directory)")
    return path


def load_rows(
    cfg: TrainConfig, pb: Path, tok: Any, held: dict, out: Path, resume: bool
) -> tuple[RowStream, dict | None]:
    """The row stream (official and held-out samples excluded) with the config's self rows, and the self rows'
    digest; a resume on other self rows than the run's stops before the model and the checkpoint are loaded."""
    self_rows, self_meta = [], None
    if cfg.data.self_rows:
        self_rows, self_meta = load_self_rows(
            list(cfg.data.self_rows),
            vocab_size=len(tok),
            canvas={t: max_new_tokens(t) for t in TASKS},
            excluded_prompts=excluded_prompts(pb, tok, held),
            state_scoring=cfg.data.state_scoring,
            shuffle_answer=cfg.data.shuffle_answer,
        )
        print(f"self rows: {self_meta}")
    if resume and latest_checkpoint(out) is not None and (out / "run.json").is_file():
        before = (json.loads((out / "run.json").read_text()).get("self_rows") or {}).get("sha256")
        if before != (self_meta or {}).get("sha256"):
            raise ValueError(
                f"--resume: the run in {out} trained on other self rows (sha256 {before}); give the same "
                "data.self_rows files, or start a new --out"
            )
    official, held_keys = official_keys(pb), keys_of(held)
    exclude = {t: official[t] | held_keys[t] for t in TASKS}
    return RowStream(pb, tok, cfg.run.seed, exclude=exclude, self_rows=self_rows), self_meta


def make_optimizer(cfg: TrainConfig, trainable: list) -> tuple[Any, Any]:
    """AdamW (no decay on vectors) under the curriculum's warm-up / constant / decay schedule."""
    decay = [p for _, p in trainable if p.dim() >= 2]
    no_decay = [p for _, p in trainable if p.dim() < 2]
    o = cfg.optim
    groups = [{"params": decay, "weight_decay": o.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=o.lr, betas=(0.9, 0.95))
    total = cfg.total_steps
    schedule = wsd_lambda(
        o.warmup,
        total,
        o.decay_steps if o.decay_steps is not None else int(0.15 * total),
        restarts=stage_starts(cfg.stages),
        restart_warmup=o.stage_warmup,
        scale_at=lambda step: (stage_at(cfg.stages, step)[1].lr or o.lr) / o.lr,
    )
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, schedule)


def setup(cfg: TrainConfig, out: Path, pb: Path, resume: bool) -> Run:
    """Tokenizer, rows, held-out evaluation sets, model, optimizer; the latest checkpoint when resuming."""
    torch.set_num_threads(cfg.run.threads)
    accelerator = Accelerator()
    out.mkdir(parents=True, exist_ok=True)
    random.seed(cfg.run.seed)
    torch.manual_seed(cfg.run.seed)
    tok = AutoTokenizer.from_pretrained(tokenizer_dir(cfg))
    held = heldout(pb, EVAL_SEED, cfg.run.eval_samples, official_keys(pb))
    stream, self_meta = load_rows(cfg, pb, tok, held, out, resume)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the row workers are forked from this process
    evals = {"short": eval_items(held, pb, short=True), "full": eval_items(held, pb, False)}
    torch.manual_seed(cfg.run.seed)
    model = initial_model(cfg.model, tok, accelerator.print)
    trainable = trainable_parameters(model, cfg.optim.train_only)
    opt, sched = make_optimizer(cfg, trainable)
    meta = run_meta(cfg, model, trainable, self_meta)
    accelerator.print(f"{meta['family']}: {meta['params'] / 1e6:.2f}M parameters ({meta['trained'] / 1e6:.2f}M train)")
    model, opt, sched = accelerator.prepare(model, opt, sched)
    source = RowSource(stream, cfg.run.row_workers)
    run = Run(cfg, out, accelerator, tok, source, evals, model, opt, sched, trainable, meta)
    if any(st.whole_names for st in cfg.stages):
        run.name_tails = name_tail_ids(tok, stream.names)
    if resume:
        restore(run)
    (out / "run.json").write_text(json.dumps(meta, indent=1))
    return run


def run_meta(cfg: TrainConfig, model: Any, trainable: list, self_meta: dict | None) -> dict:
    """run.json: the config, the model's size and exported config, the self rows' digest."""
    meta = {
        "family": cfg.model.family,
        "params": sum(p.numel() for p in model.parameters()),
        "trained": sum(p.numel() for _, p in trainable),
        "config": dataclasses.asdict(cfg),
        "model_config": model.config.to_dict(),
    }
    if self_meta is not None:
        meta["self_rows"] = self_meta
    return meta


def restore(run: Run) -> None:
    """Load the latest checkpoint of ``run.out`` (none: a fresh start) and drop log lines of steps after it."""
    ckpt = latest_checkpoint(run.out)
    if ckpt is None:
        return
    run.accelerator.load_state(str(ckpt))
    state = json.loads((ckpt / "trainer_state.json").read_text())
    run.start_step, run.elapsed, run.ema = state["step"], state.get("elapsed", 0.0), state.get("ema")
    run.accelerator.print(f"resumed from {ckpt} at step {run.start_step}")
    apply_peak_rate(getattr(run.sched, "scheduler", run.sched), run.cfg.optim.lr, run.accelerator.print)
    if run.accelerator.is_main_process and run.log_path.is_file():  # steps after the checkpoint are run again
        lines = run.log_path.read_text().splitlines()
        kept = [ln for ln in lines if ln.strip() and log_step(ln) <= run.start_step]
        write_text_atomic(run.log_path, "".join(ln + "\n" for ln in kept))


# ------------------------------------------------------------------------------------------------ the step


def mix_for(cfg: TrainConfig, stage: Stage) -> Mix:
    """What a step of ``stage`` draws: its tasks by weight, its batch, and its options over ``data``'s."""
    d = cfg.data
    tasks = stage.tasks or TASKS
    weights = {task_name(k, "data.task_weights"): v for k, v in d.task_weights.items()}
    opts = {
        "bare": d.short_format != "chat",
        "pad": (d.short_format == "bare-padded") if stage.pad is None else stage.pad,
        "icl": stage.icl if stage.icl is not None else d.short_icl,
        "gap": stage.gap or 0,
        "lengths": stage.lengths,
        "uniform_lengths": d.uniform_lengths,
        "aux_pad": stage.aux_pad,
        "canvas": stage.canvas,
        "shuffle_answer": d.shuffle_answer,
    }
    task_weights = tuple(weights.get(t, 1.0) for t in tasks)
    if stage.kind == "short":
        return Mix(d.short_batch, 1.0, tasks, task_weights, **opts)
    share = stage.share if stage.share is not None else d.short_share
    return Mix(d.full_batch, share, tasks, task_weights, aux_chat=stage.aux_chat, **opts)


def train_step(run: Run, step: int, resets: set[int]) -> dict:
    """One optimizer step on step ``step``'s rows and masks; the log record of it."""
    cfg, acc = run.cfg, run.accelerator
    stage_index, stage = stage_at(cfg.stages, step)
    if step in resets:  # fresh moments; the checkpoints after this step hold the new ones, so resume agrees
        getattr(run.opt, "optimizer", run.opt).state.clear()
    upcoming = lambda s: mix_for(cfg, stage_at(cfg.stages, s)[1]) if s < cfg.total_steps else None  # noqa: E731
    rows = run.source.rows(step, mix_for(cfg, stage), upcoming)
    mine = rows[acc.process_index :: acc.num_processes]
    batch = collate([(p, r, *state) for p, r, _, *state in mine], run.tok.pad_token_id)
    batch = {k: v.to(acc.device) for k, v in batch.items()}
    gen = step_generator(cfg.run.seed, step)
    stratified = cfg.data.t_sampling == "stratified"
    block, stale = cfg.model.block_length, (stage.stale, stage.stale_block)
    extra = {"clean_context": stage.clean_context, "whole_names": (stage.whole_names, run.name_tails)}
    extra["noisy_prefix"] = stage.noisy_prefix
    loss, _ = diffusion_loss(run.model, batch, gen, stratified=stratified, block_length=block, stale=stale, **extra)
    acc.backward(loss)
    acc.clip_grad_norm_([p for _, p in run.trainable], 1.0)
    run.opt.step()
    run.sched.step()
    run.opt.zero_grad(set_to_none=True)
    lv = float(loss.detach())
    run.ema = lv if run.ema is None else 0.98 * run.ema + 0.02 * lv
    lr = run.sched.get_last_lr()[0]
    return {
        "step": step + 1,
        "stage": stage_index,
        "loss": round(lv, 4),
        "ema": round(run.ema, 4),
        "lr": float(f"{lr:.3g}"),
    }


# ------------------------------------------------------------------------------------------------ evaluation


def evaluate(run: Run, stage: Stage) -> dict:
    """Score x 100 on the held-out samples (one token per step): the official prompts after short stages are
    over, and the short prompts as chats when short rows are chats (bare short rows scored as chats are 0)."""
    short_eval = ["short"] if run.cfg.data.short_format == "chat" else []
    which = short_eval if stage.kind == "short" else ["full", *short_eval]
    model = run.accelerator.unwrap_model(run.model)
    block = run.cfg.model.block_length
    scores: dict[str, float] = {}
    for kind in which:
        for name, item in run.evals[kind].items():
            result = score_task(model, run.tok, name.removeprefix("short/"), *item, block_length=block)
            scores[name] = round(result["score"], 1)
    full = [v for k, v in scores.items() if not k.startswith("short/")]
    short = [v for k, v in scores.items() if k.startswith("short/")]
    return {
        "eval": scores,
        "eval_mean": round(sum(full) / len(full), 1) if full else None,
        "eval_short_mean": round(sum(short) / len(short), 1) if short else None,
    }


# ------------------------------------------------------------------------------------------------ checkpointing


def save(run: Run, done: int) -> None:
    save_checkpoint(run.accelerator, run.out, done, {"elapsed": run.elapsed, "ema": run.ema})


def export(run: Run, done: int, name: str = "export") -> None:
    """The model after step ``done``, with its card (step, training seconds, run.json), into ``out / name``."""
    if run.accelerator.is_main_process:
        card = {"step": done, "train_seconds": round(run.elapsed), **run.meta}
        export_model(run.accelerator.unwrap_model(run.model), run.tok, run.out / name, card)


def checkpoint(run: Run, done: int, stopping: bool) -> None:
    """Save and export on the run config's periods and at the end, keep stage-end exports (all periodic ones with
    ``keep_exports``); a run ``stopping`` early (``stop_after`` or the time limit) saves and exports whatever the
    periods say."""
    r, total = run.cfg.run, run.cfg.total_steps
    exported = done == total or bool(r.export_every and done % r.export_every == 0)
    if done % r.save_every == 0 or done == total or stopping:
        save(run, done)
    if exported or stopping:
        export(run, done)
    if done in stage_starts(run.cfg.stages) or (exported and r.keep_exports):
        export(run, done, f"export-step{done}")


# ------------------------------------------------------------------------------------------------ the loop


def train(run: Run, started: float) -> int:
    """Steps from the run's start to the end of the curriculum (or ``stop_after`` / ``time_limit``); the last step."""
    cfg, acc = run.cfg, run.accelerator
    total = cfg.total_steps
    resets = {s for s, st in zip(stage_starts(cfg.stages), cfg.stages[1:], strict=True) if st.reset}
    run.model.train()
    bar = tqdm(range(run.start_step, total), initial=run.start_step, total=total)
    done, t_last = run.start_step, time.perf_counter()
    for step in bar:
        record = train_step(run, step, resets)
        done = record["step"]
        now = time.perf_counter()
        run.elapsed += now - t_last
        record["elapsed"] = round(run.elapsed, 1)
        bar.set_postfix(stage=record["stage"], loss=f"{run.ema:.3f}", lr=f"{record['lr']:.2e}")
        if cfg.run.eval_every and (done % cfg.run.eval_every == 0 or done == total):
            record |= evaluate(run, stage_at(cfg.stages, step)[1])
            acc.print(json.dumps({"step": done, "eval_mean": record["eval_mean"], **record["eval"]}))
        if acc.is_main_process:
            with open(run.log_path, "a") as f:
                f.write(json.dumps(record) + "\n")
        halt = cfg.run.stop_after is not None and done >= cfg.run.stop_after
        over = cfg.run.time_limit is not None and time.monotonic() - started > cfg.run.time_limit
        stopping = not halt and done < total and _all_agree(acc, over)
        checkpoint(run, done, stopping or halt)  # a run that ends early keeps its last step
        if stopping:
            acc.print(f"run.time_limit {cfg.run.time_limit:g} s reached after step {done}")
        if halt or stopping:
            break
        t_last = time.perf_counter()  # evaluation and checkpoint time is not training time
    bar.close()
    run.source.close()
    acc.print(f"done: {done} steps, {run.elapsed / 60:.1f} min of training")
    return done


def _all_agree(accelerator: Any, flag: bool) -> bool:
    """True on every process when it is true on any (clocks differ; a stop taken by one process alone would hang)."""
    if accelerator.num_processes == 1:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=accelerator.device)
    return bool(accelerator.reduce(t, reduction="max").item() > 0)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="YAML config (recipes/train_demo/configs/)")
    ap.add_argument("--data", default=None, help="official ParallelBench directory (default: $DLM_PARALLELBENCH_DATA)")
    ap.add_argument("--out", default=None, help="run directory (default: runs/train_demo/CONFIG_NAME)")
    ap.add_argument("--init", default=None, help="start from this checkpoint (sets model.init)")
    ap.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    ap.add_argument(
        "--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override a config key (repeatable)"
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    started = time.monotonic()
    args = parse_args(argv)
    sets = list(args.set) + ([f"model.init={json.dumps(args.init)}"] if args.init else [])
    cfg = load_config(args.config, sets)
    out = Path(args.out) if args.out else Path("runs") / "train_demo" / Path(args.config).stem
    pb = data_dir(args.data)
    tokenizer_dir(cfg)
    train(setup(cfg, out, pb, args.resume), started)


if __name__ == "__main__":
    run_script(main, "train_demo/train.py")
