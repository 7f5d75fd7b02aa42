"""Copy a training run's export into ``dlm_decode/demo_models/<name>/`` and write its model card (README.md).

    python recipes/train_demo/ship.py --run recipes/train_demo/work/llada --name demo-llada \
        --scores recipes/train_demo/work/llada-scores.json --command "python recipes/train_demo/train.py ..."

``--scores`` is a file whose last line is the JSON that ``dlm-decode parallelbench --json`` (or ``evaluate.py``)
prints last; without it the card says the checkpoint is not evaluated yet. Files are copied to a temporary
directory that is then renamed into place.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scoring import TARGETS, TASKS  # noqa: E402
from tokenizer import fold_chat_template  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CPU_HARDWARE = "a shared 2-core CPU (1 thread, evaluation excluded)"  # where the demo runs trained before any GPU
SHIPPED = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def model_size(training: dict) -> dict:
    """The shipped model's size: from its config when the run started from ``--init`` (the size flags are ignored
    then, so ``training["size"]`` holds the flags' defaults), else the run's size flags."""
    cfg = training.get("config")
    if not cfg:
        return training["size"]
    if cfg.get("model_type") == "llada":
        keys = ("d_model", "n_layers", "n_heads", "n_kv_heads", "mlp_hidden_size", "max_sequence_length", "rope_theta")
    else:
        keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
                "max_position_embeddings", "rope_theta")  # fmt: skip
    names = ("d_model", "n_layers", "n_heads", "n_kv_heads", "mlp_hidden", "max_len", "rope_theta")
    return dict(zip(names, (cfg[k] for k in keys), strict=True))


def card(
    name: str,
    training: dict,
    scores: dict | None,
    command: str,
    note: str,
    eval_command: str | None = None,
    origin: str = "trained from scratch",
    hardware: str = CPU_HARDWARE,
) -> str:
    size, arch = model_size(training), training["arch"]
    a = training["args"]
    secs = training["train_seconds"]
    wall = f"{secs / 60:.0f} min" if secs >= 600 else f"{secs:.0f} s"
    stride = f" --stride {scores['stride']}" if scores and scores.get("stride", 1) > 1 else ""
    lines = [
        f"# {name}",
        "",
        f"A tiny masked-diffusion LM in the official {'LLaDA' if arch == 'llada' else 'Dream'} checkpoint format "
        f"(`model_type` `{'llada' if arch == 'llada' else 'Dream'}`, official parameter names), {origin} "
        "by `recipes/train_demo` so that dlm_decode's samplers, caches and the ParallelBench runner have a "
        "real model to work on without downloads. It only knows the ParallelBench waiting-line and puzzle tasks.",
        "",
        "```python",
        "import dlm_decode",
        f'model, tok = dlm_decode.load_model("{name}")',
        "```",
        "",
        "## Model",
        f"- architecture: {arch}, d_model {size['d_model']}, {size['n_layers']} layers, {size['n_heads']} heads "
        f"({size['n_kv_heads']} K/V heads), MLP {size['mlp_hidden']}, max length {size['max_len']}, "
        f"RoPE theta {size['rope_theta']:g}; {training['params'] / 1e6:.2f}M parameters, fp32 safetensors",
        "- tokenizer: byte-level BPE trained on the generated data (vocabulary "
        f"{training.get('vocab', 'see tokenizer.json')}); LLaDA special tokens `<|startoftext|>` (bos), "
        "`<|endoftext|>` (eos, pad), `<|mdm_mask|>` (mask), `<|start_header_id|>`, `<|end_header_id|>`, `<|eot_id|>`; "
        "LLaDA chat template",
        "",
        "## Training",
        "- data: `recipes/train_demo/stream.py`, generated afresh for every step from the official task configs "
        "with our own seeds (every official test sample and every held-out eval sample excluded): short retrieval "
        "rows (operation word + operands + the bare list or grid) and the official prompts of the 10 waiting-line "
        "tasks, `puzzle/latin_square_n4` and `puzzle/sudoku_n4_12`; random-output tasks get a freshly drawn valid "
        "answer per row",
        "- objective: LLaDA SFT (prompt never masked; response = answer + `<|eot_id|>` + `<|endoftext|>` padding "
        "to 32 / 64 tokens, masked at ratio t ~ U(0.001, 1), CE / t / response length)"
        + ("; Dream's shifted form: token i is scored from the hidden state at i - 1" if arch == "dream" else ""),
        "- limits: decodes at the gen length it was trained for (32 waiting line, 64 puzzles) only; longer gen "
        "lengths garble or empty the answer (the answers it learned end in padding to exactly that length)",
        f"- curriculum `{a['stages']}` ({training['step']} steps run): short stages at batch {a['short_batch']}, "
        f"full stages at batch {a['full_batch']} with {a['short_share']:g} of each batch short rows (a stage's "
        "`{share=...}` overrides it); task weights "
        f"`{a['task_weights']}`; AdamW lr {a['lr']:g} (warm-up {a['warmup']}, constant, linear decay at the end), "
        f"weight decay {a['weight_decay']:g}, seed {a['seed']}",
        f"- wall time: {wall} of training on {hardware}",
        f"- command: `{command}`",
        "",
        "## ParallelBench scores (official test files)",
        "One token per step: `sampler=low_confidence`, `steps = gen_length = block_length = max_new_tokens` (32 "
        "waiting line, 64 puzzles), temperature 0, no cache; chats from `build_messages`; "
        f"`{eval_command or f'python recipes/train_demo/evaluate.py --model {name}{stride}'}`.",
        "",
    ]
    if scores is None:
        lines.append("Not evaluated yet.")
    else:
        lines += ["| task | score | strict | target |", "|---|---|---|---|"]
        for t in TASKS:
            if t in scores["scores"]:
                met = "met" if scores["scores"][t] >= TARGETS[t] else "**not met**"
                lines.append(f"| {t} | {scores['scores'][t]:.1f} | {scores['strict'][t]:.1f} | {TARGETS[t]} ({met}) |")
        lines.append(f"| mean | {scores['mean']:.1f} | | |")
    if note:
        lines += ["", note]
    return "\n".join(lines) + "\n"


def read_scores(path: str | Path) -> dict:
    """The card's scores from the last JSON line of ``path``: ``dlm-decode parallelbench --json`` output (per-task
    rows) or ``evaluate.py``'s summary line -> ``{"scores", "strict", "mean", "n", "stride", ...}``."""
    obj = json.loads(Path(path).read_text().strip().splitlines()[-1])
    if "scores" in obj:
        return obj
    if not isinstance(obj.get("tasks"), list) or not obj["tasks"]:
        raise SystemExit(f"--scores {path}: neither evaluate.py's line nor `dlm-decode parallelbench --json` output")
    rows = {r["task"]: r for r in obj["tasks"]}
    return {
        "model": obj.get("model"),
        "scores": {t: round(r["score"], 1) for t, r in rows.items()},
        "strict": {t: round(r["score_strict"], 1) for t, r in rows.items()},
        "mean": round(sum(r["score"] for r in rows.values()) / len(rows), 1),
        "n": {t: r["n"] for t, r in rows.items()},
        "seconds": round(sum(r["seconds"] for r in rows.values()), 1),
        "decoding": obj.get("decoding"),
        "stride": 1,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", required=True, help="training run directory (holds export/)")
    ap.add_argument("--name", required=True, choices=("demo-llada", "demo-dream"))
    ap.add_argument("--scores", default=None)
    ap.add_argument("--command", default="see recipes/train_demo/README.md")
    ap.add_argument("--note", default="")
    ap.add_argument("--eval-command", default=None, help="the command that produced --scores (shown in the card)")
    ap.add_argument(
        "--origin",
        default="trained from scratch",
        help="how the weights began, in the card's first sentence (e.g. a warm start from another demo model)",
    )
    ap.add_argument(
        "--hardware",
        default=CPU_HARDWARE,
        help="where the last run trained, in the card's wall-time line",
    )
    args = ap.parse_args()

    export = Path(args.run) / "export"
    training = json.loads((export / "training.json").read_text())
    tok_json = json.loads((export / "tokenizer.json").read_text())
    training["vocab"] = len(tok_json["model"]["vocab"]) + sum(
        t["content"] not in tok_json["model"]["vocab"] for t in tok_json["added_tokens"]
    )
    scores = read_scores(args.scores) if args.scores else None
    dest = ROOT / "dlm_decode" / "demo_models" / args.name
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in SHIPPED:
        if (export / f).is_file():
            shutil.copy2(export / f, tmp / f)
    fold_chat_template(tmp)
    (tmp / "README.md").write_text(
        card(args.name, training, scores, args.command, args.note, args.eval_command, args.origin, args.hardware)
    )
    if scores is not None:  # the measured scores, machine-readable (tests check the claims against the model)
        (tmp / "scores.json").write_text(json.dumps(scores, indent=1) + "\n")
    old = dest.with_name(dest.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if dest.exists():
        os.replace(dest, old)
    os.replace(tmp, dest)
    shutil.rmtree(old, ignore_errors=True)
    print(f"shipped {export} -> {dest}")


if __name__ == "__main__":
    from dlm_decode.cli import run_script

    run_script(main, "train_demo/ship.py")
