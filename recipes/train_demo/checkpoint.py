"""Atomic checkpoints and exports of a training run.

A checkpoint (accelerate's state: model, optimizer, scheduler, RNG states; plus ``trainer_state.json`` with the step)
is written to a temporary directory and moved into place with ``os.replace``, then the ``latest`` pointer is swapped
the same way, so an interrupted write never leaves a half checkpoint that a resume would read. An export is the
model in the official format (config.json + model.safetensors + tokenizer files + ``training.json``), written to
``NAME.tmp`` and renamed.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from recipes.train_demo.tokenizer import save_tokenizer


def latest_checkpoint(run_dir: Path) -> Path | None:
    pointer = run_dir / "checkpoints" / "latest"
    if not pointer.is_file():
        return None
    path = run_dir / "checkpoints" / pointer.read_text().strip()
    return path if path.is_dir() else None


def write_text_atomic(path: Path, text: str) -> None:
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
        write_text_atomic(ckpt_root / "latest", final.name)
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


def log_step(line: str) -> int:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):  # a line cut by an interrupted write
        return 1 << 62
