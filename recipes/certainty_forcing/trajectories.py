"""Distillation targets for certainty forcing: the base model's own verified one-token-per-step answers.

    python -m recipes.certainty_forcing.trajectories --model demo-llada --data PARALLELBENCH_DIR \
        [--out runs/certainty_forcing/traj-llada] --n-per-task 200

Prompts are freshly generated ParallelBench samples (``generate_task`` through ``prompts.build_split``) with this
recipe's own seeds; every sample equal to an official test sample (``sample_key``) is dropped, and the training
prompts also exclude the held-out evaluation prompts. Each prompt is decoded by the base model one token per step
(``low_confidence``, ``steps = gen length``, block 32, temperature 0, as dParallel builds its targets) and kept only
if the verifier accepts the answer (``score_sample(...)["score"] == 1``).

Writes to ``--out``: ``train.jsonl`` (one accepted trajectory a line: task, prompt_ids, response_ids = the final
``gen_length`` canvas slots, text, score, decoder), ``heldout.jsonl`` (task, messages, sample, max_new_tokens: prompts
for the periodic evaluation), ``meta.json`` (seeds, settings, verified / kept per task). Work is kept per task under
``parts/`` so an interrupted run resumes where it stopped; final files are written to a temporary name and renamed.
``--eta ETA`` (on-policy targets, not the reference): each prompt is first decoded by the decoder distillation serves,
``entropy_threshold`` at ETA, and its verified answer is the target; the prompts it fails fall back to one token per
step. On random-output tasks these are answers the parallel decoder itself reaches, which the model is then trained to
be sure of. ``--keep-unverified`` (a diagnostic, not the recipe) keeps every answer, for checking the training mechanism
on a base model that solves nothing yet.

``--states N`` (decode-order rows, not the reference; waiting-line tasks): every prompt is decoded one token per step
with its trace (``generate(trace=True)``, the step that committed each slot), and each trajectory gives up to N rows
of the states the decoder itself passed through: the slots committed before step j are visible (the model's own
tokens), the rest masked, and the target is a valid answer that agrees with every visible slot. A verified trajectory
targets its own answer at N random steps. A failed one is repaired, DAgger-style (Ross et al. 2011, "A Reduction of
Imitation Learning and Structured Prediction to No-Regret Online Learning": the learner's states, the expert's
labels): its last step from which a valid answer could still be reached is always one of its rows, and the target is
the answer (``parallelbench.valid_answers``) that agrees with the most of its decoded slots. Such a row also names the
slots to score: the masked ones in the block being decoded at that step (``scored``; later blocks are masked and
unscored, as at decode time), and the slots the decoder committed from that state (``next``, a subset of them;
``data.state_scoring: next`` in train_demo scores only these). ``--states-threshold T`` takes the trajectories of
Fast-dLLM's ``threshold`` sampler at T instead (several slots committed in one step form one state).
``--shuffle-answer RULE`` (with ``--states``) makes train_demo's fixed shuffle order (``data.shuffle_answer``) the
expert: a shuffle trajectory counts as verified only when it wrote that order, every repair targets it, and each
shuffle row records ``answer_rule``, which lets a stage trained on that rule keep the row.
``recipes/train_demo/self_rows.py`` reads them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

import dlm_decode
from dlm_decode.cli import run_script
from dlm_decode.options import is_real
from dlm_decode.parallelbench import valid_answers
from dlm_decode.parallelbench.metrics import score_sample
from recipes.certainty_forcing.common import WAITING_LINE
from recipes.certainty_forcing.evaluate import one_per_step, parallel_decoding, threshold_decoding
from recipes.pb_data import DATA_ENV, data_dir
from recipes.prompts import build_split, official_keys
from recipes.train_demo.stream import SHUFFLE_ANSWERS, fixed_answer_tasks, fixed_shuffle, response_canvases

TRAIN_SEED, HELDOUT_SEED = 11_000_003, 13_000_007  # far from the official five-digit seeds and from train_demo's


def write_jsonl_atomic(path: Path, rows: list[dict]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def read_jsonl(path: str | Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def build_prompts(
    data_dir: str | Path, tasks: list[str], n_per_task: int, n_heldout: int, seed: int, heldout_seed: int
) -> tuple[list[dict], list[dict], dict[str, Any]]:
    """(train rows, held-out rows, collisions dropped): official samples out of both, held-out ones out of train."""
    official = official_keys(data_dir, tasks)
    held, held_dropped, held_keys = build_split(data_dir, n_heldout, heldout_seed, tasks=tasks, exclude=official)
    exclude = {t: official[t] | held_keys[t] for t in tasks}
    train, train_dropped, _ = build_split(data_dir, n_per_task, seed, tasks=tasks, exclude=exclude)
    return train, held, {"train": train_dropped, "heldout": held_dropped}


@torch.no_grad()
def decode_task(
    model: Any,
    tok: Any,
    rows: list[dict],
    *,
    block: int,
    batch_size: int,
    bar: Any,
    keep_all: bool = False,
    eta: float | None = None,
    states: int = 0,
    rng: random.Random | None = None,
    states_threshold: float | None = None,
    shuffle_answer: str = "random",
) -> list[dict]:
    """Decode one task's rows one token per step; return the accepted trajectories (every one with ``keep_all``).

    With ``eta``: each row is first decoded by dParallel's own decoder (``entropy_threshold`` at ``eta``) and that
    answer is kept when the verifier accepts it; only the rows it fails are decoded one token per step. With
    ``states``: the decode-order rows of every trajectory instead (``decode_states``; ``rng`` draws their steps),
    decoded by ``threshold`` at ``states_threshold`` when given, with ``shuffle_answer``'s order as shuffle's one
    valid answer under a fixed rule."""

    def decode(chunk: list[dict], gl: int, args: dict[str, Any], decoder: str) -> tuple[list[dict], list[dict]]:
        msgs = [json.loads(r["messages"]) for r in chunk]
        out = dlm_decode.generate(model, msgs, tokenizer=tok, chat=True, gen_length=gl, trace=states > 0, **args)
        accepted, failed = [], []
        for i, (r, res) in enumerate(zip(chunk, out.rows, strict=True)):
            score = score_sample(r["task"], res.text or "", json.loads(r["sample"]))["score"]
            ok = res.error is None and score == 1.0
            if states:
                kw = {"tok": tok, "block": args["block_length"], "n": states, "rng": rng, "rule": shuffle_answer}
                accepted += decode_states(r, res, out.trace[i], ok, **kw) if res.error is None else []
            elif ok:
                accepted.append(record(r, res, score, decoder))
            else:
                failed.append((r, res, score))
        return accepted, failed

    def record(r: dict, res: Any, score: float, decoder: str) -> dict:
        keys = ("task", "prompt_ids", "response_ids", "text", "score", "decoder")
        return dict(zip(keys, (r["task"], res.prompt_ids, res.generated_ids, res.text, score, decoder), strict=True))

    kept = []
    for i in range(0, len(rows), batch_size):
        chunk = rows[i : i + batch_size]
        gl = int(chunk[0]["max_new_tokens"])
        if eta is not None:
            accepted, failed = decode(chunk, gl, parallel_decoding(eta, min(block, gl)), "entropy_threshold")
            kept += accepted
            chunk = [r for r, _, _ in failed]
        if chunk:
            args = one_per_step(gl, min(block, gl))
            if states_threshold is not None:  # the states of Fast-dLLM's parallel decoder instead
                args = threshold_decoding(states_threshold, min(block, gl))
            accepted, failed = decode(chunk, gl, args, "one_per_step")
            kept += accepted
            if keep_all:
                kept += [record(r, res, score, "one_per_step") for r, res, score in failed if res.error is None]
        bar.update(len(rows[i : i + batch_size]))
    return kept


def answer_canvases(tok: Any, texts: list[str], gen_length: int) -> torch.Tensor:
    """[C, gen_length] the canvases the training rows write for ``texts`` (``stream.response_canvases``)."""
    return torch.tensor(response_canvases(tok, texts, gen_length))


def expert_answers(task: str, sample: dict, rule: str) -> list[str]:
    """The answers a decode-order row of ``task`` may target: every valid one, or under a fixed shuffle ``rule``
    (``stream.SHUFFLE_RULES``) shuffle's one order."""
    return [fixed_shuffle(sample, rule)] if task in fixed_answer_tasks(rule) else valid_answers(task, sample)


def decode_states(
    row: dict,
    res: Any,
    trace: torch.Tensor,
    verified: bool,
    *,
    tok: Any,
    block: int,
    n: int,
    rng: random.Random,
    rule: str = "random",
) -> list[dict]:
    """Up to ``n`` decode-order rows of one trajectory (``trace`` [L]: the step that committed each slot, -1 for
    slots cut after the EOS block; a parallel decoder commits several slots in one step, which then form one state);
    none when no valid answer agrees with even the first state. Under a fixed shuffle ``rule`` a shuffle answer in
    another valid order is repaired towards the rule's order like a failure."""
    sample, task = json.loads(row["sample"]), row["task"]
    got = torch.tensor(res.generated_ids)  # [L]
    levels = sorted({int(x) for x in trace if x >= 0})  # state j: the slots committed before step levels[j] shown
    seen = [((trace >= 0) & (trace < v)).nonzero().flatten() for v in levels]
    fixed = task in fixed_answer_tasks(rule)
    if verified and fixed:  # another valid order than the rule's one is repaired towards it like a failure
        verified = bool(answer_canvases(tok, expert_answers(task, sample, rule), len(got))[0].equal(got))
    if verified:
        target, last = got, None
    else:
        texts = expert_answers(task, sample, rule)
        rng.shuffle(texts)
        canvases = answer_canvases(tok, texts, len(got))  # [C, L]
        last, target = None, None
        for j in range(len(levels) - 1, -1, -1):  # the latest state some valid answer still agrees with
            fits = (canvases[:, seen[j]] == got[seen[j]]).all(1)
            if fits.any():
                agree = torch.where(fits, (canvases == got).sum(1), torch.full_like(fits, -1, dtype=torch.long))
                last, target = j, canvases[int(agree.argmax())]
                break
        if target is None:
            return []
    picks = list(range(len(levels))) if last is None else list(range(last + 1))
    chosen = rng.sample(picks, min(n, len(picks)))
    if last is not None and last not in chosen:
        chosen[-1] = last
    text = tok.decode(target.tolist(), skip_special_tokens=True)
    if score_sample(task, text, sample)["score"] != 1.0:
        raise RuntimeError(f"{task}: a target the verifier refuses ({text!r}); the answer canvas is not the model's")
    out = []
    for j in sorted(chosen):
        committed = (trace == levels[j]).nonzero().flatten().tolist()  # the slots the decoder committed from here
        grid = (len(res.prompt_ids) + committed[0]) // block  # the block decoded next
        masked = sorted(set(range(len(got))) - set(seen[j].tolist()))
        scored = [i for i in masked if (len(res.prompt_ids) + i) // block == grid]
        out.append(
            {"task": task, "prompt_ids": res.prompt_ids, "response_ids": target.tolist(), "text": text,
             "score": 1.0, "decoder": "state", "repaired": not verified, "masked": masked, "scored": scored,
             "next": committed, **({"answer_rule": rule} if fixed else {})}
        )  # fmt: skip
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="base checkpoint directory or demo name")
    ap.add_argument("--out", default=None, help="output directory (default: runs/certainty_forcing/traj-MODEL)")
    ap.add_argument("--data", default=None, help=f"official ParallelBench directory (default: ${DATA_ENV})")
    ap.add_argument("--tasks", nargs="*", default=list(WAITING_LINE))
    ap.add_argument("--n-per-task", type=int, default=200, help="training prompts per task (before filtering)")
    ap.add_argument("--heldout-per-task", type=int, default=8)
    ap.add_argument("--seed", type=int, default=TRAIN_SEED)
    ap.add_argument("--heldout-seed", type=int, default=HELDOUT_SEED)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument(
        "--eta",
        type=float,
        default=None,
        help="decode with entropy_threshold at ETA first and keep its verified answers; one token per step only for "
        "the prompts it fails (on-policy targets, not the reference)",
    )
    ap.add_argument(
        "--states",
        type=int,
        default=0,
        help="write decode-order rows instead: up to N states of each one-token-per-step trajectory, a failed one "
        "repaired to the nearest valid answer (waiting-line tasks; not the reference)",
    )
    ap.add_argument(
        "--states-threshold",
        type=float,
        default=None,
        help="with --states: decode the trajectories with the threshold sampler at T instead of one token per step "
        "(the states a parallel decoder passes through)",
    )
    ap.add_argument(
        "--shuffle-answer",
        choices=SHUFFLE_ANSWERS,
        default="random",
        help="with --states: shuffle's expert answer is train_demo's fixed order under this rule (data.shuffle_answer) "
        "instead of any valid order",
    )
    ap.add_argument(
        "--keep-unverified",
        action="store_true",
        help="diagnostic only, not the recipe: keep every decoded answer (self-distillation without the verifier)",
    )
    args = ap.parse_args(argv)
    if args.seed == args.heldout_seed:
        raise ValueError("--seed and --heldout-seed must differ")
    if args.eta is not None and not (is_real(args.eta) and args.eta > 0):
        raise ValueError(f"--eta must be a finite number > 0, got {args.eta}")
    if args.states < 0:
        raise ValueError(f"--states must be >= 0, got {args.states}")
    if args.states and (args.eta is not None or args.keep_unverified):
        raise ValueError(
            "--states decodes one token per step and repairs failures itself; drop --eta / --keep-unverified"
        )
    if args.states_threshold is not None and not (
        args.states and is_real(args.states_threshold) and 0 < args.states_threshold <= 1
    ):
        raise ValueError(f"--states-threshold needs --states and a number in (0, 1], got {args.states_threshold}")
    if args.shuffle_answer != "random" and not args.states:
        raise ValueError("--shuffle-answer sets the expert of decode-order rows; give --states N with it")
    if args.states and any(not t.startswith("waiting_line/") for t in args.tasks):
        raise ValueError("--states lists valid answers of waiting-line tasks only; give --tasks waiting_line/...")
    if args.out is None:
        args.out = str(Path("runs") / "certainty_forcing" / f"traj-{Path(str(args.model)).name}")
    return args


def reusable_parts(out: Path, args: argparse.Namespace) -> Path:
    """``out/parts``, emptied unless an earlier run made its per-task files with the same settings."""
    parts = out / "parts"
    parts.mkdir(parents=True, exist_ok=True)
    skip = ("threads", "batch_size", "out")
    signature = json.dumps({k: v for k, v in vars(args).items() if k not in skip}, sort_keys=True)
    sig_path = parts / "signature.json"
    if not sig_path.is_file() or sig_path.read_text() != signature:
        for old in parts.glob("*.jsonl"):
            old.unlink()
        sig_path.write_text(signature)
    return parts


def decode_tasks(model: Any, tok: Any, train_rows: list[dict], parts: Path, args: argparse.Namespace) -> tuple:
    """(every kept trajectory, per-task statistics); a task finished by an interrupted run is read back."""
    by_task: dict[str, list[dict]] = {}
    for r in train_rows:
        by_task.setdefault(r["task"], []).append(r)
    stats: dict[str, dict[str, Any]] = {}
    kept_all: list[dict] = []
    bar = tqdm(total=len(train_rows), desc="trajectories")
    for task, rows in by_task.items():
        part = parts / (task.replace("/", "__") + ".jsonl")
        if part.is_file():
            kept = read_jsonl(part)
            bar.update(len(rows))
        else:
            kept = decode_task(
                model, tok, rows, block=args.block, batch_size=args.batch_size, bar=bar,
                keep_all=args.keep_unverified, eta=args.eta, states=args.states,
                rng=random.Random(f"states/{args.seed}/{task}"), states_threshold=args.states_threshold,
                shuffle_answer=args.shuffle_answer,
            )  # fmt: skip
            write_jsonl_atomic(part, kept)
        if args.states:  # rows are states; a prompt is verified when its rows target its own answer
            correct = len({tuple(r["prompt_ids"]) for r in kept if not r["repaired"]})
        else:
            correct = sum(r["score"] == 1.0 for r in kept)
        rate = round(correct / max(len(rows), 1), 3)
        stats[task] = {"prompts": len(rows), "verified": correct, "verified_rate": rate, "kept": len(kept)}
        if args.states:
            stats[task]["repaired_rows"] = sum(r["repaired"] for r in kept)
            stats[task]["repaired_prompts"] = len({tuple(r["prompt_ids"]) for r in kept if r["repaired"]})
        if args.eta is not None:
            stats[task]["from_entropy_threshold"] = sum(r.get("decoder") == "entropy_threshold" for r in kept)
        bar.set_postfix(task=task.split("/")[-1], verified=f"{rate:.2f}")
        kept_all += kept
    bar.close()
    return kept_all, stats


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    pb = data_dir(args.data)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    parts = reusable_parts(out, args)
    t0 = time.perf_counter()
    train_rows, held_rows, dropped = build_prompts(
        pb, args.tasks, args.n_per_task, args.heldout_per_task, args.seed, args.heldout_seed
    )
    write_jsonl_atomic(
        out / "heldout.jsonl",
        [{k: r[k] for k in ("task", "messages", "sample", "max_new_tokens")} for r in held_rows],
    )
    model, tok = dlm_decode.load_model(args.model, dtype=args.dtype)
    kept_all, stats = decode_tasks(model, tok, train_rows, parts, args)
    write_jsonl_atomic(out / "train.jsonl", kept_all)
    meta = {
        "model": str(args.model),
        "seed": args.seed,
        "heldout_seed": args.heldout_seed,
        "decode": {"sampler": "low_confidence", "steps": "gen_length", "block": args.block, "temperature": 0.0}
        if args.states_threshold is None
        else {"sampler": "threshold", "threshold": args.states_threshold, "block": args.block, "temperature": 0.0},
        "states": args.states,
        "states_threshold": args.states_threshold,
        "shuffle_answer": args.shuffle_answer,
        "first_decoder": None if args.eta is None else {"sampler": "entropy_threshold", "eta": args.eta},
        "tasks": stats,
        "kept": len(kept_all),
        "unverified_kept": args.keep_unverified,
        "prompts": len(train_rows),
        "heldout": len(held_rows),
        "collisions_dropped": dropped,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    print(f"{len(kept_all)}/{len(train_rows)} trajectories kept -> {out / 'train.jsonl'}")
    print(json.dumps({t: s["verified_rate"] for t, s in stats.items()}))


if __name__ == "__main__":
    run_script(main, "certainty_forcing/trajectories.py")
