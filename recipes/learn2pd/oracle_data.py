"""Learn2PD step 1: oracle training data ("extremely greedy parallel" records) for the parallel-decoding filter.

    python recipes/learn2pd/oracle_data.py --model demo-llada --data recipes/train_demo/work/data --split train \
        --limit 2000 --block-length 32 --out recipes/learn2pd/work/demo-llada-oracle

For every prompt: decode once one token per step (LLaDA low-confidence, ``steps = gen_length``) to get the reference
answer, then re-decode with ``samplers.oracle.Oracle`` (commit exactly the block slots whose proposal equals the
reference) and keep, per step, the block's confidence vector and its labels (proposal == reference). Prompts are a
seeded random subset of ``--limit`` rows of a ``datasets.save_to_disk`` directory (the demo-model data: rows with
``messages`` JSON and ``max_new_tokens``) or of a jsonl file (``{"messages": [...]}`` or ``{"prompt": "..."}``,
optional ``max_new_tokens``); never benchmark test files. Writes ``<out>.safetensors`` (``conf``, ``label``:
[N, block] float32) and ``<out>.json`` (counts and the reference / oracle NFE). Prints one JSON line last.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import time
from collections import defaultdict
from pathlib import Path

import torch
from safetensors.torch import save_file

import dlm_decode
from dlm_decode.decode.oracle import oracle_generate


def model_sha256(name_or_path: str) -> str | None:
    """Hash of the checkpoint weights (``model.safetensors`` or its shards; not a filter shipped beside them), so a
    filter can be matched to the model it was trained for."""
    from dlm_decode.models.loading import resolve_model_path

    files = sorted(resolve_model_path(name_or_path).glob("model*.safetensors"))
    if not files:
        return None
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
    return h.hexdigest()


def _pick(n: int, limit: int | None, seed: int | None) -> list[int]:
    """Row indices: a seeded random subset of ``limit`` rows (data files are often sorted by task), or the first
    ``limit`` rows in file order when ``seed`` is None."""
    k = min(n, limit or n)
    if seed is None:
        return list(range(k))
    return sorted(random.Random(seed).sample(range(n), k))


def load_prompts(
    path: str | Path, split: str, limit: int | None, seed: int | None = 0
) -> list[tuple[list[dict] | str, int | None]]:
    """(chat or text, max_new_tokens or None) from a save_to_disk directory or a jsonl file. ``collect`` also takes
    token-id lists as prompts."""
    path = Path(path)
    rows: list[dict] = []
    if path.is_dir():
        from datasets import load_from_disk

        ds = load_from_disk(str(path))
        ds = ds[split] if hasattr(ds, "keys") else ds
        rows = [ds[i] for i in _pick(len(ds), limit, seed)]
    else:
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        rows = [lines[i] for i in _pick(len(lines), limit, seed)]
    out = []
    for r in rows:
        chat = r.get("messages")
        chat = json.loads(chat) if isinstance(chat, str) else chat
        out.append((chat if chat is not None else r["prompt"], r.get("max_new_tokens")))
    return out


def collect(
    model,
    prompts: list[tuple[list[dict] | str, int | None]],
    *,
    tokenizer=None,
    gen_length: int = 32,
    block_length: int = 32,
    batch_size: int = 8,
) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Oracle records for every prompt; rows are grouped by generation length (rounded up to whole blocks)."""
    groups: dict[int, list] = defaultdict(list)
    for p, n in prompts:
        n = n or gen_length
        groups[-(-n // block_length) * block_length].append(p)
    confs, labels = [], []
    stats = {"prompts": 0, "reference_nfe": 0, "oracle_nfe": 0, "tokens": 0}
    for gen, items in sorted(groups.items()):
        for i in range(0, len(items), batch_size):
            batch = items[i : i + batch_size]
            chat = isinstance(batch[0], list) and bool(batch[0]) and isinstance(batch[0][0], dict)  # messages
            ref, orc, rec = oracle_generate(
                model, batch, record=True, tokenizer=tokenizer, chat=chat, gen_length=gen, block_length=block_length
            )
            confs.append(rec[0])
            labels.append(rec[1])
            stats["prompts"] += len(batch)
            stats["reference_nfe"] += sum(r.nfe for r in ref.rows)
            stats["oracle_nfe"] += sum(r.nfe for r in orc.rows)
            stats["tokens"] += gen * len(batch)
    conf = torch.cat(confs) if confs else torch.zeros(0, block_length)
    label = torch.cat(labels) if labels else torch.zeros(0, block_length)
    stats["records"] = conf.shape[0]
    return conf, label, stats


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="checkpoint directory or demo name (demo-llada)")
    ap.add_argument("--data", required=True, help="save_to_disk directory or jsonl of prompts")
    ap.add_argument("--split", default="train")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0, help="rows are a seeded random subset (-1: the first rows)")
    ap.add_argument("--gen-length", type=int, default=32, help="for rows without max_new_tokens")
    ap.add_argument("--block-length", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", required=True, help="output path without suffix")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    sha = model_sha256(args.model)  # before loading: the weights the records come from
    model, tok = dlm_decode.load_model(args.model)
    start = time.perf_counter()
    prompts = load_prompts(args.data, args.split, args.limit, None if args.seed < 0 else args.seed)
    conf, label, stats = collect(
        model,
        prompts,
        tokenizer=tok,
        gen_length=args.gen_length,
        block_length=args.block_length,
        batch_size=args.batch_size,
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file({"conf": conf.contiguous(), "label": label.contiguous()}, str(out.with_suffix(".safetensors")))
    stats |= {
        "model": str(args.model),
        "model_sha256": sha,
        "data": str(args.data),
        "split": args.split,
        "block_length": args.block_length,
        "positive_rate": float(label.mean()) if label.numel() else 0.0,
        "seconds": round(time.perf_counter() - start, 1),
    }
    out.with_suffix(".json").write_text(json.dumps(stats, indent=2) + "\n")
    print(json.dumps(stats))
    return stats


if __name__ == "__main__":
    main()
