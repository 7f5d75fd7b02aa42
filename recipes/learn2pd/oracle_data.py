"""Learn2PD step 1: oracle training data ("extremely greedy parallel" records) for the parallel-decoding filter.

    python -m recipes.learn2pd.oracle_data --model demo-llada --prompts runs/learn2pd/prompts --split train \
        --limit 2000 --block-length 32 --out runs/learn2pd/demo-llada-oracle

For every prompt: decode once one token per step (LLaDA low-confidence, ``steps = gen_length``) to get the reference
answer, then re-decode with ``samplers.oracle.Oracle`` (commit exactly the block slots whose proposal equals the
reference) and keep, per step, the block's confidence vector and its labels (proposal == reference). Prompts are a
seeded random subset of ``--limit`` rows of a ``datasets.save_to_disk`` directory (the demo-model data: rows with
``messages`` JSON and ``max_new_tokens``) or of a jsonl file (``{"messages": [...]}`` or ``{"prompt": "..."}``,
optional ``max_new_tokens``); never benchmark test files. Writes ``<out>.safetensors`` (``conf``, ``label``:
[N, block] float32) and ``<out>.json`` (counts and the reference / oracle NFE). Prints one JSON line last.

On-policy records (``--policy FILTER.safetensors``; an extension, not in Learn2PD, whose reference trains on the
oracle's records only, which stays the default): the second pass decodes each prompt with the ``learned_filter``
sampler and the given filter instead of the oracle (``FilterRecorder``: the same decode as ``check_filter.py``, one
token per step plus the filter's acceptances, EoTP with ``--policy-eotp``), and records, at every step along the
filter's own trajectory, the block's confidence vector with the labels ``proposal == y`` (``y`` the same one token
per step answer). Where the filter committed a token other than ``y``, the later steps see a context the oracle
never produces; these records let ``train_filter.py`` (several ``--data``) learn from them (DAgger, Ross et al.
2011). Same file format; the json adds ``policy``, ``policy_eotp``, ``policy_nfe`` and ``policy_same_as_reference``
(rows whose answer equals ``y``). ``rounds.py`` runs the loop: oracle records, then records along each new filter.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm.auto import tqdm

import dlm_decode
from dlm_decode.cli import run_script
from dlm_decode.decode.oracle import oracle_generate
from dlm_decode.models.loading import resolve_model_path
from dlm_decode.samplers.base import candidates
from dlm_decode.samplers.learned_filter import LearnedFilter, filter_config, load_filter
from dlm_decode.samplers.oracle import check_reference, reference_canvas


def model_sha256(name_or_path: str) -> str | None:
    """Hash of the checkpoint weights (``model.safetensors`` or its shards; not a filter shipped beside them), so a
    filter can be matched to the model it was trained for."""
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


@dataclass(frozen=True)
class FilterRecorder(LearnedFilter):
    """``learned_filter`` decoding unchanged (the policy), plus per step the record ``Oracle(record=True)`` keeps on
    the oracle's trajectory: for every row with masked block slots, the block's confidence vector and the labels
    ``proposal == reference`` (``reference``: each row's ``gen_length`` tokens of the one token per step answer).
    Records go to ``scratch["learned_filter/records"]`` (``conf`` and ``label`` lists of [rows, block] tensors)."""

    reference: tuple[tuple[int, ...], ...] = ()
    until_wrong: bool = False  # record a row only while every token it committed equals the reference

    def check(self, config, num_blocks: int) -> None:
        super().check(config, num_blocks)
        if self.filter is None:
            raise ValueError("FilterRecorder: needs a filter (the policy whose trajectory is recorded)")
        check_reference("FilterRecorder", self.reference, config.gen_length)

    def begin_block(self, state) -> None:
        super().begin_block(state)
        mem = state.scratch.setdefault(f"{self.name}/records", {"conf": [], "label": []})
        if "y" not in mem:
            mem["y"] = reference_canvas("FilterRecorder", self.reference, state)  # [B, T]

    def proposals(self, state, logits):
        x0, conf = super().proposals(state, logits)
        state.scratch[f"{self.name}/records"]["last"] = (x0, conf)  # the step's proposals, read back in select
        return x0, conf

    def select(self, state, logits, r0):
        active = candidates(state, r0, r0 + logits.shape[1]).any(1)  # before this step's commits, as the oracle
        sel = super().select(state, logits, r0)
        mem = state.scratch[f"{self.name}/records"]
        x0, conf = mem.pop("last")
        if self.until_wrong:  # rows whose canvas still agrees with y wherever it is decoded
            wrong = (state.canvas != state.mask_id) & (state.canvas != mem["y"])
            active &= ~wrong[:, state.prompt_len :].any(1)
        if bool(active.any()):
            n = state.block_length
            y = mem["y"][:, r0 : r0 + n]
            mem["conf"].append(conf[active, :n].float().cpu())
            mem["label"].append((x0[:, :n] == y)[active].cpu())
        return sel


def _same(a, b) -> bool:
    """Two rows give the same answer: the same text (``check_filter.py``'s test), the same ids without a tokenizer."""
    return a.text == b.text if a.text is not None else a.generated_ids == b.generated_ids


def policy_generate(model, prompts, *, policy: str, eotp: bool = False, until_wrong: bool = False, **kwargs):
    """``oracle_generate``'s counterpart along the filter's own trajectory: (reference output, policy output,
    records ``(conf [N, block] float32, label [N, block] float32)``). ``kwargs`` go to ``generate`` for both passes;
    the second decodes with ``steps = gen_length`` as ``check_filter.py`` does. ``until_wrong``: a row's steps after
    its first committed token other than the reference's are not recorded."""
    gen_length = kwargs.get("gen_length", 128)
    ref = dlm_decode.generate(model, prompts, sampler="low_confidence", steps=gen_length, **kwargs)
    reference = tuple(tuple(row.generated_ids) for row in ref.rows)
    smp = FilterRecorder(filter=str(policy), eotp=eotp, reference=reference, until_wrong=until_wrong)
    out = dlm_decode.generate(model, prompts, sampler=smp, steps=gen_length, **kwargs)
    mem = out.scratch.get(f"{smp.name}/records", {"conf": []})
    if mem["conf"]:
        return ref, out, (torch.cat(mem["conf"]), torch.cat(mem["label"]).float())
    block = out.config["block_length"]
    return ref, out, (torch.zeros(0, block), torch.zeros(0, block))


def collect(
    model,
    prompts: list[tuple[list[dict] | str, int | None]],
    *,
    tokenizer=None,
    gen_length: int = 32,
    block_length: int = 32,
    batch_size: int = 8,
    policy: str | None = None,
    policy_eotp: bool = False,
    policy_until_wrong: bool = False,
    progress: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Oracle records for every prompt (``policy`` given: records along that filter's trajectories instead); rows
    are grouped by generation length (rounded up to whole blocks). ``progress``: a tqdm bar over the prompts."""
    groups: dict[int, list] = defaultdict(list)
    for p, n in prompts:
        n = n or gen_length
        groups[-(-n // block_length) * block_length].append(p)
    confs, labels = [], []
    second = "oracle_nfe" if policy is None else "policy_nfe"
    stats = {"prompts": 0, "reference_nfe": 0, second: 0, "tokens": 0}
    if policy is not None:
        stats["policy_same_as_reference"] = 0

    bar = tqdm(total=sum(len(v) for v in groups.values()), unit="prompt", desc="records", disable=not progress)
    for gen, items in sorted(groups.items()):
        for i in range(0, len(items), batch_size):
            batch = items[i : i + batch_size]
            chat = isinstance(batch[0], list) and bool(batch[0]) and isinstance(batch[0][0], dict)  # messages
            kw = dict(tokenizer=tokenizer, chat=chat, gen_length=gen, block_length=block_length)
            if policy is None:
                ref, orc, rec = oracle_generate(model, batch, record=True, **kw)
            else:
                until = policy_until_wrong
                ref, orc, rec = policy_generate(model, batch, policy=policy, eotp=policy_eotp, until_wrong=until, **kw)
                stats["policy_same_as_reference"] += sum(_same(a, b) for a, b in zip(orc.rows, ref.rows, strict=True))
            confs.append(rec[0])
            labels.append(rec[1])
            stats["prompts"] += len(batch)
            stats["reference_nfe"] += sum(r.nfe for r in ref.rows)
            stats[second] += sum(r.nfe for r in orc.rows)
            stats["tokens"] += gen * len(batch)
            bar.update(len(batch))
    bar.close()
    conf = torch.cat(confs) if confs else torch.zeros(0, block_length)
    label = torch.cat(labels) if labels else torch.zeros(0, block_length)
    stats["records"] = conf.shape[0]
    return conf, label, stats


def add_decode_args(ap: argparse.ArgumentParser) -> None:
    """The model, prompt and decoding flags of a record collection (this script and ``rounds.py``)."""
    ap.add_argument("--model", required=True, help="checkpoint directory or demo name (demo-llada)")
    ap.add_argument(
        "--prompts", default="runs/learn2pd/prompts", help="save_to_disk directory (prompts.py) or jsonl of prompts"
    )
    ap.add_argument("--split", default="train")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0, help="rows are a seeded random subset (-1: the first rows)")
    ap.add_argument("--gen-length", type=int, default=32, help="for rows without max_new_tokens")
    ap.add_argument("--block-length", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=None)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_decode_args(ap)
    ap.add_argument("--out", required=True, help="output path without suffix")
    ap.add_argument(
        "--policy",
        default=None,
        help="on-policy records (extension, not Learn2PD's): decode with learned_filter and this filter "
        "(FILTER.safetensors) instead of the oracle, and record along its trajectories",
    )
    ap.add_argument("--policy-eotp", action="store_true", help="with --policy: decode with EoTP on")
    ap.add_argument(
        "--policy-until-wrong",
        action="store_true",
        help="with --policy: record a row only until it commits a token other than the one token per step answer",
    )
    args = ap.parse_args(argv)
    for flag in ("policy_eotp", "policy_until_wrong"):
        if getattr(args, flag) and args.policy is None:
            ap.error(f"--{flag.replace('_', '-')} needs --policy")
    if args.threads:
        torch.set_num_threads(args.threads)
    sha = model_sha256(args.model)  # before loading: the weights the records come from
    if args.policy is not None:  # a missing file or another block length: fail before any decoding
        load_filter(args.policy, args.block_length)
        trained_for = (filter_config(args.policy).get("data") or {}).get("model_sha256")
        if trained_for and sha and trained_for != sha:
            print(f"warning: policy {args.policy} was trained for other weights than {args.model}'s", file=sys.stderr)
    model, tok = dlm_decode.load_model(args.model)
    start = time.perf_counter()
    prompts = load_prompts(args.prompts, args.split, args.limit, None if args.seed < 0 else args.seed)
    conf, label, stats = collect(
        model,
        prompts,
        tokenizer=tok,
        gen_length=args.gen_length,
        block_length=args.block_length,
        batch_size=args.batch_size,
        policy=args.policy,
        policy_eotp=args.policy_eotp,
        policy_until_wrong=args.policy_until_wrong,
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file({"conf": conf.contiguous(), "label": label.contiguous()}, str(out.with_suffix(".safetensors")))
    stats |= {
        "model": str(args.model),
        "model_sha256": sha,
        "data": str(args.prompts),
        "split": args.split,
        "block_length": args.block_length,
        "positive_rate": float(label.mean()) if label.numel() else 0.0,
        "seconds": round(time.perf_counter() - start, 1),
    }
    if args.policy is not None:
        stats |= {"policy": str(args.policy), "policy_eotp": args.policy_eotp}
        stats["policy_until_wrong"] = args.policy_until_wrong
    out.with_suffix(".json").write_text(json.dumps(stats, indent=2) + "\n")
    print(json.dumps(stats))
    return stats


if __name__ == "__main__":
    run_script(main, "learn2pd/oracle_data.py")
