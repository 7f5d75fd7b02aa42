"""Ship a block-causal (llada2_moe) export of the recipe as a demo model directory, after checking its exact cache.

    python -m recipes.train_demo.ship --export runs/train_demo/demo-llada2/export --scores SCORES.json \\
        --out dlm_decode/demo_models/demo-llada2 --data PARALLELBENCH_DIR [--limit N] [--name demo-llada2] \\
        [--notes keep|NOTES.md]

``SCORES.json`` is the ``--json`` output of ``dlm-decode parallelbench`` on the export, one token per step and
open-ended (``--sampler low_confidence --gen-length 128 --block-length 32 --steps 128``). Before anything is written,
the first ``--limit`` official samples of each of the twelve demo tasks are decoded that way twice, with no cache and
with the exact ``prefix`` cache, and every row must give the same generated ids, with no more forwards; a difference
stops the ship with the sample named (exit 1). The directory gets the export's config.json, model.safetensors and
tokenizer files, a ``generation_config.json`` (gen length cap, block, steps, chat, mask / EOS ids), ``scores.json`` (the
runner's scores in the other demo models' layout: scores, strict, mean, n, seconds, decoding) and a ``README.md``
card from the export's ``training.json`` and the scores.

The card's hand-written sections (any ``## `` section the generator does not write, such as "How it got here") are
never lost silently: ``--notes keep`` carries those of the card in ``--out`` over unchanged, ``--notes FILE`` puts
that markdown in their place (an empty file drops them), and without ``--notes`` a card that has them stops the ship
before any work, naming them.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

import dlm_decode
from dlm_decode.parallelbench.runner import load_tasks
from recipes.train_demo.card import hand_sections, model_card
from recipes.train_demo.scoring import OPEN_GEN, TASKS

SHIPPED = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def decode(model: Any, tok: Any, chats: list, cache: str, block: int) -> Any:
    return dlm_decode.generate(
        model,
        chats,
        tokenizer=tok,
        chat=True,
        sampler="low_confidence",
        cache=cache,
        gen_length=OPEN_GEN,
        block_length=block,
        steps=OPEN_GEN,
        temperature=0.0,
    )


def check_exact_cache(model: Any, tok: Any, data: Path, limit: int | None, block: int) -> dict[str, Any]:
    """Every task's first ``limit`` official samples: same ids and no more forwards with the ``prefix`` cache as
    without; ValueError naming the first sample that differs. Returns the forwards of both."""
    from tqdm.auto import tqdm

    nfe = {"none": 0, "prefix": 0, "samples": 0}
    tasks = load_tasks(data, TASKS, limit=limit)
    bar = tqdm(total=sum(len(t) for t in tasks), desc="exact-cache check", unit="sample")
    for task in tasks:
        chats = [task.messages(i) for i in range(len(task))]
        for i in range(0, len(chats), 50):
            plain, cached = (decode(model, tok, chats[i : i + 50], c, block) for c in ("none", "prefix"))
            for j, (a, b) in enumerate(zip(plain.rows, cached.rows, strict=True)):
                if a.generated_ids != b.generated_ids or b.nfe > a.nfe:
                    raise ValueError(f"{task.name} sample {i + j}: the prefix cache gives other tokens or more NFE")
                nfe["none"] += a.nfe
                nfe["prefix"] += b.nfe
                nfe["samples"] += 1
            bar.update(len(plain.rows))
    bar.close()
    return nfe


def runner_json(path: Path) -> dict[str, Any]:
    """The last line of ``dlm-decode parallelbench --json``'s output (progress lines may come before it)."""
    lines = path.read_text().strip().splitlines() if path.is_file() else []
    try:
        last = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        last = None
    if not isinstance(last, dict):
        raise ValueError(f"--scores {path}: not a dlm-decode parallelbench --json output (no JSON object last)")
    return last


def shipped_scores(runner: dict[str, Any], model: str) -> dict[str, Any]:
    """The runner's ``--json`` object in the demo models' scores.json layout."""
    if "tasks" not in runner or "decoding" not in runner:
        raise ValueError("--scores: not a dlm-decode parallelbench --json output (no 'tasks' / 'decoding')")
    tasks = sorted(runner["tasks"], key=lambda t: t["task"])
    scores = {t["task"]: round(t["score"], 1) for t in tasks}  # the runner scores x 100
    mean = sum(t["score"] for t in tasks) / max(len(tasks), 1)  # of the exact scores: 92.349 is 92.3, not 92.4
    return {
        "model": model,
        "scores": scores,
        "strict": {t["task"]: round(t["score_strict"], 1) for t in tasks},
        "mean": round(mean, 1),
        "n": {t["task"]: t["n"] for t in tasks},
        "nfe": {t["task"]: round(t["nfe"], 2) for t in tasks},
        "seconds": round(sum(t["seconds"] for t in tasks), 1),
        "decoding": runner["decoding"],
        "stride": 1,
    }


def generation_config(model: Any, block: int) -> dict[str, Any]:
    """The lengths and ``chat`` that ``core.generation_config`` reads (the gen length is a cap: decoding stops after
    the block holding the first EOS), and the mask / EOS ids for readers of the file (config.json is what sets them)."""
    return {
        "gen_length": OPEN_GEN,
        "block_length": block,
        "steps": OPEN_GEN,
        "chat": True,  # trained on chat prompts only: a plain text prompt is wrapped as a user turn by default
        "mask_token_id": model.mask_token_id,
        "eos_token_id": model.eos_token_ids[0],
    }


def card_notes(notes: str | None, out: Path) -> str:
    """The hand-written sections the new card ends with (``--notes``); refuses to drop the current card's ones."""
    card = out / "README.md"
    kept = hand_sections(card.read_text()) if card.is_file() else {}
    if notes == "keep":
        return "\n\n".join(kept.values())
    if notes is not None:
        path = Path(notes)
        if not path.is_file():
            raise ValueError(f"--notes {notes}: no such file (give 'keep' or a markdown file of card sections)")
        return path.read_text()
    if kept:
        raise ValueError(
            f"--out {card} has hand-written sections ({', '.join(kept)}) that the new card would lose: pass "
            "--notes keep to carry them over, or --notes FILE with their new text (an empty file drops them)"
        )
    return ""


def ship(args: argparse.Namespace) -> None:
    export, out = Path(args.export), Path(args.out)
    missing = [f for f in (*SHIPPED, "training.json") if not (export / f).is_file()]
    if missing:
        raise ValueError(f"--export {export}: missing {', '.join(missing)} (a train_demo export directory)")
    notes = card_notes(args.notes, out)
    scores = shipped_scores(runner_json(Path(args.scores)), str(export))
    torch.set_num_threads(args.threads)
    model, tok = dlm_decode.load_model(export, dtype=torch.float32)
    if not getattr(model, "block_causal", False):
        raise ValueError(f"--export {export}: {type(model).__name__} is not block-causal; ship.py ships llada2_moe")
    block = int(scores.get("decoding", {}).get("block_length") or args.block_length)
    nfe = check_exact_cache(model, tok, Path(args.data), args.limit, block)
    print(f"exact cache: {nfe['samples']} samples, same tokens; NFE {nfe['none']} without, {nfe['prefix']} with")
    out.mkdir(parents=True, exist_ok=True)
    for name in SHIPPED:
        shutil.copyfile(export / name, out / name)
    (out / "generation_config.json").write_text(json.dumps(generation_config(model, block), indent=1) + "\n")
    (out / "scores.json").write_text(json.dumps(scores, indent=1) + "\n")
    training = json.loads((export / "training.json").read_text())
    (out / "README.md").write_text(model_card(args.name, model, training, scores, nfe, block, notes))
    print(f"shipped {export} -> {out}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--export", required=True, help="a train_demo export directory of a llada2 run")
    ap.add_argument("--scores", required=True, help="dlm-decode parallelbench --json output on that export")
    ap.add_argument("--out", required=True, help="the demo model directory to write")
    ap.add_argument("--data", required=True, help="ParallelBench data directory (the exact-cache check)")
    ap.add_argument("--limit", type=int, default=None, help="samples per task of the exact-cache check (all)")
    ap.add_argument("--block-length", type=int, default=32, help="block when the scores do not name one")
    ap.add_argument("--name", default="demo-llada2")
    ap.add_argument("--notes", default=None, help="'keep' (the card's hand sections) or a markdown file")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    try:
        ship(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
