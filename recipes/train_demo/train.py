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
import re
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
    tie_embeddings: bool = False


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
            weight_tying=size.tie_embeddings,
            **ids,
        )
        return LLaDAModelLM(cfg)
    if arch == "dream":
        if size.tie_embeddings:
            raise SystemExit("--tie-embeddings is for --arch llada (weight_tying); Dream checkpoints here are untied")
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
    batch: dict[str, torch.Tensor],
    mask_id: int,
    generator: torch.Generator,
    eps: float = 1e-3,
    stratified: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """LLaDA forward process on the response only -> noisy ids, masked positions [B, T], p_mask [B].

    ``stratified``: the batch's t are one draw from each of B equal strata of [0, 1) in a random order (same
    marginal U(0, 1) per row, far less variance of the 1/p-weighted loss across batches)."""
    ids, resp = batch["input_ids"], batch["response"]
    b, t = ids.shape
    t_draw = torch.rand(b, generator=generator, device=generator.device)
    if stratified:
        order = torch.randperm(b, generator=generator, device=generator.device)
        t_draw = (order + t_draw) / b
    t_draw = t_draw.to(ids.device)
    p_mask = (1 - eps) * t_draw + eps  # [B]
    u = torch.rand(b, t, generator=generator, device=generator.device).to(ids.device)
    masked = (u < p_mask[:, None]) & resp  # [B, T]
    return torch.where(masked, torch.full_like(ids, mask_id), ids), masked, p_mask


def masked_logits(
    model: Any, batch: dict[str, torch.Tensor], generator: torch.Generator, eps: float = 1e-3, stratified: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mask the responses (``mask_response``) and score the masked slots: logits [M, V] from hidden ``i -
    logit_shift`` (the LM head runs only on those), their true ids [M], each one's batch row [M], and p_mask [B]."""
    core = model.module if hasattr(model, "module") else model
    noisy, masked, p_mask = mask_response(batch, core.mask_token_id, generator, eps, stratified)
    valid = batch["valid"]
    positions = (valid.long().cumsum(1) - 1).clamp(min=0)
    hid = core.hidden_states(noisy, positions, key_mask=valid)  # [B, T, d]
    rows, cols = masked.nonzero(as_tuple=True)
    logits = core.output_logits(hid[rows, cols - core.logit_shift])  # [M, V]
    return logits, batch["input_ids"][rows, cols], rows, p_mask


def diffusion_loss(
    model: Any, batch: dict[str, torch.Tensor], generator: torch.Generator, eps: float = 1e-3, stratified: bool = False
) -> tuple[torch.Tensor, dict[str, float]]:
    """LLaDA SFT loss: sum over masked response tokens of CE / p_mask, divided by the response length, batch mean."""
    logits, target, rows, p_mask = masked_logits(model, batch, generator, eps, stratified)
    ce = F.cross_entropy(logits.float(), target, reduction="none")  # [M]
    weight = 1.0 / (p_mask[rows] * batch["response_length"][rows])
    loss = (ce * weight).sum() / batch["input_ids"].shape[0]
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


@dataclass(frozen=True)
class Stage:
    """One stage of the curriculum: ``kind`` short (short rows only) or full (official prompts plus a share of short
    rows), for ``steps`` steps, over ``tasks`` (None: all twelve). Options left None take the command line's value:
    ``lr`` the stage's peak learning rate, ``share`` the short rows' share of a full stage's batch, ``icl`` the share
    of short rows shown the sample's in-context example first, ``pad`` whether bare short rows get EOS padding,
    ``gap`` the most filler words (of the row's own template) after a short row's list (stream.py, ``Mix.gap``);
    ``len`` the people per list of the stage's waiting-line rows, ``len=2-3`` (``Mix.lengths``; the task's own range
    when absent: a length curriculum, e.g. sort learned on pairs first);
    ``auxchat=0`` keeps the training-only rows (find, missing, ...) out of a full stage's official slots: they come as
    short rows only (default 1: also as the copy chat with their question appended, whose one-name answers then
    outnumber the real copy chats and teach the copy prompt short answers; "Fourteenth round");
    ``auxpad=0`` leaves the training-only rows unpadded while ``pad=1`` pads the others (default: as ``pad``);
    ``canvas=N`` pads each full row's response (official chat or training-only chat) with EOS to a length drawn
    uniformly between the task's own canvas and N tokens (``Mix.canvas``), so the model also meets the long canvases
    of a gen-256 decode (the models trained on 32-token canvases score 0 at gen 256);
    ``reset`` starts the stage with fresh optimizer moments (Adam's second moments from easy rows make the first
    updates on a new kind of row several times the learning rate)."""

    kind: str
    steps: int
    tasks: tuple[str, ...] | None = None
    lr: float | None = None
    share: float | None = None
    icl: float | None = None
    pad: bool | None = None
    reset: bool = False
    gap: int | None = None
    lengths: tuple[int, int] | None = None
    aux_chat: bool = True
    aux_pad: bool | None = None
    canvas: int = 0


_STAGE_OPTIONS = ("lr", "share", "icl", "pad", "reset", "gap", "len", "auxchat", "auxpad", "canvas")


def parse_stages(spec: str) -> list[Stage]:
    """``"short:600,full:5000"``; a stage may name its tasks, ``short[sort+shuffle]:300`` (op names or full names),
    and set options,
    ``full[copy+reverse]{lr=3e-4,share=0.5,icl=0.5,pad=1,gap=48,len=2-6,auxchat=0,auxpad=0,reset}:1000``."""
    from stream import AUX_TASKS, STAGE_TASKS

    stages = []
    for part in _split_top(spec):
        head, sep, steps = part.rpartition(":")
        head, _, opts = head.partition("{")
        kind, _, rest = head.partition("[")
        if not sep or kind not in ("short", "full") or not steps.isdigit() or int(steps) <= 0:
            raise SystemExit(
                f"--stages: bad stage {part!r}; expected short:N or full:N, optionally short[a+b]{{lr=1e-3}}:N"
            )
        tasks = None
        if rest:
            names = [t.strip() for t in rest.rstrip("]").split("+") if t.strip()]
            full = {t.split("/", 1)[1]: t for t in STAGE_TASKS} | {t: t for t in STAGE_TASKS}
            unknown = [t for t in names if t not in full]
            if unknown:
                raise SystemExit(f"--stages: unknown task(s) {unknown}; known: {', '.join(full)}")
            tasks = tuple(full[t] for t in names)
        options = _stage_options(part, opts.rstrip("}"))
        puzzles = [t for t in tasks or STAGE_TASKS if not t.startswith(("waiting_line/", "aux/"))]
        if "lengths" in options and puzzles:
            raise SystemExit(f"--stages: len sets list lengths of waiting-line rows; {part!r} also names {puzzles}")
        if options.get("aux_chat") is False and not [t for t in tasks or STAGE_TASKS if t not in AUX_TASKS]:
            raise SystemExit(f"--stages: auxchat=0 needs an official task for the full rows in {part!r}")
        stages.append(Stage(kind, int(steps), tasks, **options))
    if not stages:
        raise SystemExit("--stages: no stage given")
    return stages


def _stage_options(part: str, text: str) -> dict[str, Any]:
    from stream import list_lengths

    out: dict[str, Any] = {}
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        key, eq, value = item.partition("=")
        if key not in _STAGE_OPTIONS:
            raise SystemExit(f"--stages: unknown option {key!r} in {part!r}; allowed: {', '.join(_STAGE_OPTIONS)}")
        try:
            if key == "reset":
                out[key] = not eq or bool(int(value))
            elif key == "pad":
                out[key] = bool(int(value))
            elif key == "auxchat":
                out["aux_chat"] = bool(int(value))
            elif key == "auxpad":
                out["aux_pad"] = bool(int(value))
            elif key in ("gap", "canvas"):
                out[key] = int(value)
            elif key == "len":
                out["lengths"] = list_lengths(value, f"--stages {part!r}")
            else:
                out[key] = float(value)
        except ValueError:
            raise SystemExit(f"--stages: bad value {value!r} for {key} in {part!r}") from None
        if key in ("share", "icl") and not 0.0 <= out[key] <= 1.0:
            raise SystemExit(f"--stages: {key} must be in [0, 1] in {part!r}")
        if key == "canvas" and not 1 <= out[key] <= MAX_CANVAS:
            raise SystemExit(f"--stages: canvas must be a token count in [1, {MAX_CANVAS}] in {part!r}")
        if key == "gap" and out[key] < 0:
            raise SystemExit(f"--stages: gap must be a whole number of words >= 0 in {part!r}")
        if key == "lr" and out[key] <= 0:
            raise SystemExit(f"--stages: lr must be > 0 in {part!r}")
    return out


# the longest canvas a stage may pad to: the official prompts (up to ~240 tokens) plus this fit the demo models' 512
MAX_CANVAS = 256


def _split_top(spec: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in spec:
        depth += ch in "[{"
        depth -= ch in "]}"
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return [p for p in parts + [cur.strip()] if p]


def parse_weights(spec: str | None) -> dict[str, float]:
    """``"sort=2,shuffle=1.5"`` -> task name -> sampling weight (default 1)."""
    from stream import STAGE_TASKS as TASKS

    out: dict[str, float] = {}
    for item in (spec or "").split(","):
        if not item.strip():
            continue
        name, _, value = item.partition("=")
        match = [t for t in TASKS if t == name.strip() or t.endswith("/" + name.strip())]
        if len(match) != 1:
            raise SystemExit(f"--task-weights: unknown task {name!r}; known: {', '.join(TASKS)}")
        out[match[0]] = float(value)
    return out


def stage_at(stages: list[Stage], step: int) -> tuple[int, Stage]:
    """(index, stage) that step ``step`` (0-based) belongs to; past the end, the last stage."""
    end = 0
    for i, st in enumerate(stages):
        end += st.steps
        if step < end:
            return i, st
    return len(stages) - 1, stages[-1]


def wsd_lambda(
    warmup: int,
    total: int,
    decay: int,
    floor: float = 0.1,
    restarts: tuple[int, ...] = (),
    restart_warmup: int = 0,
    scale_at: Any = None,
):
    """Warm-up, then a constant rate, then a linear decay to ``floor`` over the last ``decay`` steps. Extending a run
    (more steps on --resume) only moves the decay, so a curriculum can grow without restarting its schedule.

    ``restarts`` (the first steps of later stages) each ramp the rate again from ``1 / restart_warmup`` over
    ``restart_warmup`` steps: a new kind of row (the official prompts after short rows) starts at a loss near 16 and,
    at the full rate, its first updates wiped out the in-context copying the short stages had built (measured).
    ``scale_at(step)`` multiplies the whole schedule (a stage's own peak rate over the command line's)."""

    def f(step: int) -> float:
        base = scale_at(step) if scale_at is not None else 1.0
        return base * _shape(step)

    def _shape(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        scale = 1.0
        for start in restarts:
            if restart_warmup and start <= step < start + restart_warmup:
                scale = (step - start + 1) / restart_warmup
        if step < total - decay:
            return scale
        return scale * max(floor, floor + (1 - floor) * (total - step) / max(decay, 1))

    return f


def apply_peak_rate(sched: torch.optim.lr_scheduler.LambdaLR, lr: float, say: Any = print) -> None:
    """Make a resumed schedule follow this command's ``--lr``. A checkpoint restores the scheduler's base rates and
    the optimizer's current ones, so without this a resume with another ``--lr`` silently kept the old peak (and a
    stage's ``{lr=...}``, scaled by ``--lr``, came out wrong too). With the same ``--lr`` nothing changes."""
    old = sched.base_lrs[0]
    if old == lr:
        return
    say(f"--lr {lr:g} replaces the checkpoint's peak rate {old:g} from the next step on")
    sched.base_lrs = [lr] * len(sched.base_lrs)
    for group, fn in zip(sched.optimizer.param_groups, sched.lr_lambdas, strict=True):
        group["initial_lr"] = lr
        group["lr"] = lr * fn(sched.last_epoch)


def stage_starts(stages: list[Stage]) -> tuple[int, ...]:
    """First step of every stage after the first."""
    starts, end = [], 0
    for st in stages[:-1]:
        end += st.steps
        starts.append(end)
    return tuple(starts)


def trainable_parameters(
    model: torch.nn.Module, patterns: list[re.Pattern] | None
) -> list[tuple[str, torch.nn.Parameter]]:
    """The (name, parameter) pairs that train; with ``patterns`` the others get ``requires_grad=False``."""
    if patterns is None:
        return list(model.named_parameters())
    keep = []
    for name, p in model.named_parameters():
        p.requires_grad_(any(pat.search(name) for pat in patterns))
        if p.requires_grad:
            keep.append((name, p))
    if not keep:
        names = ", ".join(n for n, _ in list(model.named_parameters())[:6])
        raise SystemExit(f"--train-only matches no parameter of the model (names look like: {names}, ...)")
    return keep


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--parallelbench",
        default="/work/shared/data/parallelbench",
        help="official ParallelBench directory: task configs and names to generate from; its test samples "
        "are excluded from training, never trained on",
    )
    ap.add_argument("--tokenizer", required=True, help="tokenizer directory from tokenizer.py")
    ap.add_argument("--out", required=True, help="run directory (checkpoints/, export/, log.jsonl)")
    ap.add_argument("--arch", choices=("llada", "dream"), default="llada")
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--n-layers", type=int, default=4)
    ap.add_argument("--n-heads", type=int, default=4)
    ap.add_argument("--n-kv-heads", type=int, default=None, help="default: n_heads (LLaDA), n_heads/2 (Dream)")
    ap.add_argument("--mlp-hidden", type=int, default=384)
    ap.add_argument(
        "--rope-theta",
        type=float,
        default=None,
        help="RoPE base (config rope_theta); default 10,000 for a fresh model, the initial model's own with --init "
        "(given with --init, it replaces that base and the training re-learns the positions); a larger base leaves "
        "more of each head free of position, for matching by content",
    )
    ap.add_argument(
        "--tie-embeddings",
        action="store_true",
        help="LLaDA only: output projection = input embedding (config weight_tying), so copying a prompt token only "
        "needs attention to move its embedding",
    )
    ap.add_argument(
        "--stages",
        default="short[copy+reverse]:2500,short:1500,full:4000",
        help="the curriculum: comma-separated KIND[TASKS]:STEPS, KIND short (short rows only) or full "
        "(official prompts + --short-share short rows); e.g. short:600,short[sort+shuffle]:300,full:6000",
    )
    ap.add_argument("--short-batch", type=int, default=64, help="batch size of short stages")
    ap.add_argument("--full-batch", type=int, default=64, help="batch size of full stages")
    ap.add_argument(
        "--short-format",
        choices=("chat", "bare", "bare-padded"),
        default="bare",
        help="short stages' rows: a chat turn answered in the task's padded length, bare text answered by the "
        "answer and <|eot_id|> alone, or bare text answered by answer, <|eot_id|> and EOS padding to the task's "
        "gen length (so the official rows' padding is not new when the full stage starts); full stages' short rows "
        "take the same format",
    )
    ap.add_argument("--short-share", type=float, default=0.25, help="share of short rows in a full stage's batch")
    ap.add_argument(
        "--short-icl",
        type=float,
        default=0.0,
        help="share of short rows that first show the sample's in-context example and its answer (two lists, as in "
        "the official prompts); a stage's {icl=...} overrides it",
    )
    ap.add_argument(
        "--task-weights",
        default="sort=2,shuffle=1.5,insert_random=1.5,remove_random=1.5,replace_random=1.5,sudoku_n4_12=2",
        help="sampling weight per task (default 1)",
    )
    ap.add_argument(
        "--t-sampling",
        choices=("uniform", "stratified"),
        default="uniform",
        help="mask ratio per row: independent U(0, 1) draws, or one draw per stratum of [0, 1) (lower variance)",
    )
    ap.add_argument(
        "--lr", type=float, default=1e-3, help="peak learning rate (3e-3 kept d_model 128 off in-context copying)"
    )
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument(
        "--stage-warmup",
        type=int,
        default=200,
        help="steps over which the learning rate ramps up again at the start of every later stage (0: no ramp)",
    )
    ap.add_argument("--decay-steps", type=int, default=None, help="linear decay at the end (default: 15%% of steps)")
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--self-rows",
        nargs="+",
        default=[],
        metavar="JSONL",
        help="the rows of a stage that names self (aux/self): recipes/certainty_forcing/trajectories.py train.jsonl "
        "files of the model's own verified answers; official and held-out prompts in them are dropped",
    )
    ap.add_argument(
        "--eval-every",
        type=int,
        default=500,
        help="steps between evaluations and at the end (0: never): held-out official prompts, and the short prompts "
        "as chats with --short-format chat (probe.py reads bare short rows)",
    )
    ap.add_argument("--eval-samples", type=int, default=12, help="held-out samples per task per evaluation")
    ap.add_argument("--save-every", type=int, default=50)
    ap.add_argument("--export-every", type=int, default=500, help="also export the model every N steps")
    ap.add_argument(
        "--keep-exports",
        action="store_true",
        help="keep every periodic export as export-stepN/ beside export/ (for probes read after the run moved on)",
    )
    ap.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    ap.add_argument("--stop-after", type=int, default=None, help="stop at this step (as if interrupted)")
    ap.add_argument(
        "--time-limit",
        type=float,
        default=None,
        help="seconds of wall time (from start-up): at the first step past it, save a checkpoint, export and stop "
        "(for a lease of fixed length; continue with --resume, and give more steps then to move the decay)",
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--row-workers",
        type=int,
        default=0,
        help="processes that build the next steps' rows while the model trains (0: built in the training process); "
        "the rows are a function of (seed, step), so the batches are the same with any number of workers",
    )
    ap.add_argument(
        "--init",
        default=None,
        help="start from this exported model (config.json + model.safetensors) instead of fresh weights; the "
        "optimizer and schedule start fresh (the architecture flags are then taken from its config)",
    )
    ap.add_argument(
        "--train-only",
        default=None,
        help="comma-separated regular expressions: only parameters whose names match one (re.search) train, the "
        "rest are frozen, e.g. 'blocks\\.[45]\\.' for the two layers grow.py put on top of a trained 4-layer "
        'model (new skills in new layers, the old ones kept exactly; "Sixteenth round")',
    )
    args = ap.parse_args(argv)
    if args.train_only is not None:
        try:
            args.train_patterns = [re.compile(x) for x in args.train_only.split(",") if x.strip()]
        except re.error as e:
            ap.error(f"--train-only: {e}")
        if not args.train_patterns:
            ap.error("--train-only: give at least one regular expression")
    else:
        args.train_patterns = None
    for flag in ("short_share", "short_icl"):
        if not 0.0 <= getattr(args, flag) <= 1.0:
            ap.error(f"--{flag.replace('_', '-')} must be in [0, 1], got {getattr(args, flag)}")
    if args.time_limit is not None and args.time_limit <= 0:
        ap.error(f"--time-limit must be > 0 seconds, got {args.time_limit}")
    if args.row_workers < 0:
        ap.error(f"--row-workers must be >= 0, got {args.row_workers}")
    args.stage_list = parse_stages(args.stages)
    args.weights = parse_weights(args.task_weights)
    from stream import SELF

    names_self = any(SELF in (st.tasks or ()) for st in args.stage_list)
    if names_self and not args.self_rows:
        ap.error("--stages names self; give the files of its rows with --self-rows (trajectories.py's train.jsonl)")
    if args.self_rows and not names_self:
        ap.error("--self-rows given, but no stage names self (e.g. full[TEN+self]:N)")
    for p in args.self_rows:
        if not Path(p).is_file():
            ap.error(f"--self-rows: {p} is not a file (give trajectories.py's train.jsonl)")
    if not (Path(args.tokenizer) / "tokenizer.json").is_file():
        ap.error(f"--tokenizer: {args.tokenizer} holds no tokenizer.json (tokenizer.py writes the directory)")
    return args


def _all_agree(accelerator: Any, flag: bool) -> bool:
    """True on every process when it is true on any (clocks differ; a stop taken by one process alone would hang)."""
    if accelerator.num_processes == 1:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=accelerator.device)
    return bool(accelerator.reduce(t, reduction="max").item() > 0)


_WORKER_STREAM: Any = None  # the RowStream a row worker builds from (set before the fork)


def _worker_rows(step: int, mix: Any) -> list:
    return _WORKER_STREAM.rows(step, mix)


class RowSource:
    """``rows(step, mix)`` of a RowStream, built ``ahead`` steps in advance by ``workers`` forked processes.

    The stream's rows are a function of (seed, step, mix), so prefetching changes only when they are built: the
    training loop asks for consecutive steps, and a request that is not the prefetched one (a stage change, a resume)
    is built on the spot. ``workers=0`` builds every step in the calling process."""

    def __init__(self, stream: Any, workers: int = 0, ahead: int | None = None) -> None:
        self.stream = stream
        self.ahead = ahead if ahead is not None else 4 * workers
        self.pending: dict[int, tuple[Any, Any]] = {}
        self.pool = None
        if workers > 0:
            import multiprocessing

            if "fork" not in multiprocessing.get_all_start_methods():
                raise SystemExit("--row-workers needs the 'fork' start method (Linux); use --row-workers 0 here")
            global _WORKER_STREAM
            _WORKER_STREAM = stream
            self.pool = multiprocessing.get_context("fork").Pool(workers)

    def rows(self, step: int, mix: Any, upcoming: Any = None) -> list:
        """The rows of ``step``; ``upcoming(s)`` gives the mix of a later step ``s`` (or None past the end)."""
        if self.pool is None:
            return self.stream.rows(step, mix)
        want = self.pending.pop(step, None)
        for s in [s for s in self.pending if s < step]:  # a jump (resume) leaves older prefetches unused
            del self.pending[s]
        if upcoming is not None:
            for s in range(step + 1, step + 1 + self.ahead):
                m = upcoming(s)
                if m is not None and s not in self.pending:
                    self.pending[s] = (m, self.pool.apply_async(_worker_rows, (s, m)))
        if want is not None and want[0] == mix:
            return want[1].get()
        return self.stream.rows(step, mix)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool = None


def _log_step(line: str) -> int:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):  # a line cut by an interrupted write
        return 1 << 62


EVAL_SEED = 9_000_001  # held-out samples: fresh seeds, far from the official five-digit ones


def evaluate_heldout(model: Any, tok: Any, items: dict[str, tuple[list, list, int]]) -> dict[str, float]:
    """Score x 100 per held-out task (one token per step); keys ``short/<task>`` score the short-row prompts."""
    from scoring import score_task

    return {
        name: round(score_task(model, tok, name.removeprefix("short/"), *item)["score"], 1)
        for name, item in items.items()
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    started = time.monotonic()
    from accelerate import Accelerator
    from stream import TASKS, Mix, RowStream, eval_items, heldout, keys_of, official_keys
    from tqdm.auto import tqdm
    from transformers import AutoTokenizer

    torch.set_num_threads(args.threads)
    accelerator = Accelerator()
    run_dir = Path(args.out)
    run_dir.mkdir(parents=True, exist_ok=True)
    random.seed(args.seed)
    torch.manual_seed(args.seed)

    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    official = official_keys(args.parallelbench)
    held = heldout(args.parallelbench, EVAL_SEED, args.eval_samples, official)
    held_keys = keys_of(held)
    exclude = {t: official[t] | held_keys[t] for t in TASKS}
    self_rows, self_meta = [], None
    if args.self_rows:
        from self_rows import load_self_rows
        from stream import excluded_prompts

        from dlm_decode.parallelbench.tasks import max_new_tokens

        try:
            self_rows, self_meta = load_self_rows(
                args.self_rows,
                vocab_size=len(tok),
                canvas={t: max_new_tokens(t) for t in TASKS},
                excluded_prompts=excluded_prompts(args.parallelbench, tok, held),
            )
        except ValueError as e:
            raise SystemExit(str(e)) from None
        accelerator.print(f"self rows: {self_meta}")
    # the same batches need the same self rows: checked before the model and the checkpoint are loaded
    if args.resume and latest_checkpoint(run_dir) is not None and (run_dir / "run.json").is_file():
        before = (json.loads((run_dir / "run.json").read_text()).get("self_rows") or {}).get("sha256")
        if before != (self_meta or {}).get("sha256"):
            raise SystemExit(
                f"--resume: the run in {run_dir} trained on other self rows (sha256 {before}); give the same "
                "--self-rows files, or start a new --out"
            )
    stream = RowStream(args.parallelbench, tok, args.seed, exclude=exclude, self_rows=self_rows)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the row workers are forked from this process
    source = RowSource(stream, args.row_workers)
    evals = {
        "short": eval_items(held, args.parallelbench, short=True),
        "full": eval_items(held, args.parallelbench, False),
    }
    total = sum(st.steps for st in args.stage_list)

    kv = args.n_kv_heads or (args.n_heads if args.arch == "llada" else max(args.n_heads // 2, 1))
    size = ModelSize(
        args.d_model,
        args.n_layers,
        args.n_heads,
        kv,
        args.mlp_hidden,
        rope_theta=args.rope_theta or 10000.0,
        tie_embeddings=args.tie_embeddings,
    )
    torch.manual_seed(args.seed)
    if args.init:
        from dlm_decode.models import load_model

        model, _ = load_model(args.init, dtype=torch.float32, tokenizer=False)
        if model.logit_shift != (1 if args.arch == "dream" else 0):
            raise SystemExit(f"--init {args.init} is not a {args.arch} model; pass the matching --arch")
        if args.rope_theta is not None:  # the rotary tables are built from the config at every forward
            accelerator.print(f"RoPE base {model.config.rope_theta:g} -> {args.rope_theta:g}")
            model.config.rope_theta = args.rope_theta
        accelerator.print(f"initialised from {args.init} (its architecture; the size flags are ignored)")
    else:
        model = make_model(args.arch, size, tok)
    n_params = sum(p.numel() for p in model.parameters())
    accelerator.print(
        f"{args.arch}: {n_params / 1e6:.2f}M parameters, size {asdict(size)}; {total} steps {args.stages}"
    )
    trainable = trainable_parameters(model, args.train_patterns)
    if args.train_patterns is not None:
        n_train = sum(p.numel() for _, p in trainable)
        accelerator.print(
            f"--train-only: {len(trainable)} tensors, {n_train / 1e6:.3f}M parameters train; the rest frozen"
        )
    decay = [p for n, p in trainable if p.dim() >= 2]
    no_decay = [p for n, p in trainable if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
    )
    decay_steps = args.decay_steps if args.decay_steps is not None else int(0.15 * total)
    restarts = stage_starts(args.stage_list)
    stage_list = args.stage_list
    schedule = wsd_lambda(
        args.warmup,
        total,
        decay_steps,
        restarts=restarts,
        restart_warmup=args.stage_warmup,
        scale_at=lambda step: (stage_at(stage_list, step)[1].lr or args.lr) / args.lr,
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    model, opt, sched = accelerator.prepare(model, opt, sched)

    start_step = 0
    ckpt = latest_checkpoint(run_dir) if args.resume else None
    if ckpt is not None:
        accelerator.load_state(str(ckpt))
        start_step = json.loads((ckpt / "trainer_state.json").read_text())["step"]
        accelerator.print(f"resumed from {ckpt} at step {start_step}")
        apply_peak_rate(getattr(sched, "scheduler", sched), args.lr, accelerator.print)

    bare, pad = args.short_format != "chat", args.short_format == "bare-padded"

    def mix_for(stage: Stage) -> Mix:
        tasks = stage.tasks or TASKS
        weights = tuple(args.weights.get(t, 1.0) for t in tasks)
        padded = pad if stage.pad is None else stage.pad
        icl = stage.icl if stage.icl is not None else args.short_icl
        opts = {"bare": bare, "pad": padded, "icl": icl, "gap": stage.gap or 0, "lengths": stage.lengths}
        opts["aux_pad"] = stage.aux_pad
        opts["canvas"] = stage.canvas
        if stage.kind == "short":
            return Mix(args.short_batch, 1.0, tasks, weights, **opts)
        share = stage.share if stage.share is not None else args.short_share
        return Mix(args.full_batch, share, tasks, weights, aux_chat=stage.aux_chat, **opts)

    resets = {start for start, st in zip(stage_starts(args.stage_list), args.stage_list[1:], strict=True) if st.reset}

    log_path = run_dir / "log.jsonl"
    meta = {
        "arch": args.arch,
        "size": asdict(size),
        "params": n_params,
        "args": {k: v for k, v in vars(args).items() if k not in ("stage_list", "weights", "train_patterns")},
    }
    if self_meta is not None:
        meta["self_rows"] = self_meta
    if args.init:  # the architecture is the initial model's
        meta["init"] = args.init
        meta["config"] = accelerator.unwrap_model(model).config.to_dict()
    (run_dir / "run.json").write_text(json.dumps(meta, indent=1))
    elapsed, ema = 0.0, None
    if ckpt is not None:
        state = json.loads((ckpt / "trainer_state.json").read_text())
        elapsed, ema = state.get("elapsed", 0.0), state.get("ema")
        if accelerator.is_main_process and log_path.is_file():  # steps after the checkpoint are run again
            kept = [ln for ln in log_path.read_text().splitlines() if ln.strip() and _log_step(ln) <= start_step]
            _write_text_atomic(log_path, "".join(ln + "\n" for ln in kept))
    model.train()
    bar = tqdm(range(start_step, total), initial=start_step, total=total, disable=False)
    t_last = time.perf_counter()
    done = start_step

    def export(name: str) -> None:  # the model after step ``done``, with its card, into run_dir / name
        if accelerator.is_main_process:
            card = {"step": done, "train_seconds": round(elapsed), **meta}
            export_model(accelerator.unwrap_model(model), tok, run_dir / name, card)

    for step in bar:
        stage_index, stage = stage_at(args.stage_list, step)
        if step in resets:  # fresh moments; the checkpoints after this step hold the new ones, so resume agrees
            getattr(opt, "optimizer", opt).state.clear()
        rows = source.rows(
            step, mix_for(stage), lambda s: mix_for(stage_at(args.stage_list, s)[1]) if s < total else None
        )
        mine = rows[accelerator.process_index :: accelerator.num_processes]
        batch = collate([(p, r) for p, r, _ in mine], tok.pad_token_id)
        batch = {k: v.to(accelerator.device) for k, v in batch.items()}
        gen = step_generator(args.seed, step)
        loss, info = diffusion_loss(model, batch, gen, stratified=args.t_sampling == "stratified")
        accelerator.backward(loss)
        accelerator.clip_grad_norm_([p for _, p in trainable], 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        now = time.perf_counter()
        elapsed += now - t_last
        t_last = now
        lv = float(loss.detach())
        ema = lv if ema is None else 0.98 * ema + 0.02 * lv
        bar.set_postfix(stage=f"{stage_index}:{stage.kind}", loss=f"{ema:.3f}", lr=f"{sched.get_last_lr()[0]:.2e}")
        done = step + 1
        record = {
            "step": done,
            "stage": stage_index,
            "loss": round(lv, 4),
            "ema": round(ema, 4),
            "lr": float(f"{sched.get_last_lr()[0]:.3g}"),
            "elapsed": round(elapsed, 1),
        }
        if args.eval_every and (done % args.eval_every == 0 or done == total):
            # the short held-out prompts are chat turns: they read a model trained on chat-format short rows only
            # (bare-format rows are read by probe.py; scored as chats they are 0 whatever the model knows)
            short_eval = ["short"] if args.short_format == "chat" else []
            which = short_eval if stage.kind == "short" else ["full", *short_eval]
            scores: dict[str, float] = {}
            for kind in which:
                scores |= evaluate_heldout(accelerator.unwrap_model(model), tok, evals[kind])
            record["eval"] = scores
            full = [v for k, v in scores.items() if not k.startswith("short/")]
            short = [v for k, v in scores.items() if k.startswith("short/")]
            record["eval_mean"] = round(sum(full) / len(full), 1) if full else None
            record["eval_short_mean"] = round(sum(short) / len(short), 1) if short else None
            accelerator.print(
                json.dumps({"step": done, **{k: record[k] for k in ("eval_mean", "eval_short_mean")}, **scores})
            )
            t_last = time.perf_counter()  # evaluation time is not training time
        if accelerator.is_main_process:
            with open(log_path, "a") as f:
                f.write(json.dumps(record) + "\n")
        saved = done % args.save_every == 0 or done == total
        exported = done == total or bool(args.export_every and done % args.export_every == 0)
        if saved:
            save_checkpoint(accelerator, run_dir, done, {"elapsed": elapsed, "ema": ema})
        if exported:
            export("export")
        if done in restarts or (exported and args.keep_exports):  # stage ends; all with --keep-exports
            export(f"export-step{done}")
        if args.stop_after is not None and done >= args.stop_after:
            break
        if (
            args.time_limit is not None
            and done < total
            and _all_agree(accelerator, time.monotonic() - started > args.time_limit)
        ):
            if not saved:
                save_checkpoint(accelerator, run_dir, done, {"elapsed": elapsed, "ema": ema})
            if not exported:
                export("export")
            accelerator.print(f"--time-limit {args.time_limit:g} s reached after step {done}")
            break
    bar.close()
    source.close()
    accelerator.print(f"done: {done} steps, {elapsed / 60:.1f} min of training")


if __name__ == "__main__":
    from dlm_decode.cli import run_script

    run_script(main, "train_demo/train.py")
