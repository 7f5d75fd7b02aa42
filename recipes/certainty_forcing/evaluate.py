"""Score and NFE of checkpoints on ParallelBench with a parallel decoder: the before/after table and plot.

    python -m recipes.certainty_forcing.evaluate --data PARALLELBENCH_DIR \
        --model base=demo-llada --model distilled=runs/certainty_forcing/llada/export \
        --etas 0.1 0.25 0.5 1.0 2.0 --out runs/certainty_forcing/llada.json \
        --plot runs/certainty_forcing/llada_score_vs_tps.png

Each sample of the official test files (``load_task``; default: the deterministic waiting-line tasks) is built into its
chat by ``build_messages``, decoded at temperature 0 with ``entropy_threshold`` (eta from ``--etas``; block 32) and,
as a reference point, one token per step (``low_confidence``, steps = gen length), and scored with ``score_sample``.
NFE is per sample (forwards the row took part in); tokens per step = gen length / mean NFE, as ParallelBench reports.
Prints a markdown table and one JSON line. ``evaluate_tasks`` (through the ParallelBench runner) is also the periodic
evaluation of ``train.py``.

The first model is the base: every other one is held against it at equal score (``equal_score_ratios``: for each of the
base's etas, the fewest forwards the other model needs within 1 point of that score, as a ratio; the issue's
distillation target is a ratio <= 0.5), printed and stored under ``equal_score_vs_<base>``. ``--reuse
[LABEL=]FILE:NAME`` takes a model's results from an earlier ``--out`` file (checked: same tasks, sample counts and etas)
instead of decoding it again.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

import dlm_decode
from dlm_decode.cli import run_script
from dlm_decode.parallelbench.runner import run_task
from dlm_decode.parallelbench.tasks import Task, load_task, max_new_tokens
from recipes.certainty_forcing.common import DETERMINISTIC_WAITING_LINE, unwrap
from recipes.pb_data import DATA_ENV, data_dir


@torch.no_grad()
def evaluate_tasks(
    model: Any,
    tokenizer: Any,
    tasks: Sequence[Any],
    decoding: dict[str, Any],
    *,
    batch_size: int = 50,
) -> dict[str, Any]:
    """Decode and score ParallelBench ``tasks`` (``Task`` objects) with ``generate`` keyword arguments ``decoding``.

    Goes through ``dlm_decode.parallelbench.runner.run_task``. Returns per task and as means over tasks: score
    (x 100), NFE per sample, tokens per step (gen length / mean NFE).
    """
    core = unwrap(model)
    was_training = core.training
    core.eval()
    start = time.perf_counter()
    per_task = {}
    try:
        for task in tasks:
            r = run_task(core, tokenizer, task, decoding, batch_size=batch_size)
            res = {"score": r.score, "nfe": r.nfe, "gen_length": r.gen_length, "n": r.n}
            res["tokens_per_step"] = res["gen_length"] / res["nfe"]
            per_task[task.name] = {k: round(v, 3) if isinstance(v, float) else v for k, v in res.items()}
    finally:
        core.train(was_training)
    return summarize(per_task, time.perf_counter() - start)


def summarize(per_task: dict[str, dict[str, Any]], seconds: float) -> dict[str, Any]:
    """Means over tasks of score, NFE and tokens per step, with the per-task results and the seconds taken."""
    k = max(len(per_task), 1)
    return {
        "score": round(sum(v["score"] for v in per_task.values()) / k, 3),
        "nfe": round(sum(v["nfe"] for v in per_task.values()) / k, 3),
        "tokens_per_step": round(sum(v["tokens_per_step"] for v in per_task.values()) / k, 3),
        "tasks": per_task,
        "seconds": round(seconds, 1),
    }


def parallel_decoding(eta: float, block: int = 32) -> dict[str, Any]:
    """``generate`` arguments of dParallel's decoder: entropy threshold ``eta``, block 32, greedy, no cache."""
    return {"sampler": "entropy_threshold", "sampler_options": {"eta": eta}, "block_length": block, "temperature": 0.0}


def threshold_decoding(threshold: float, block: int = 32) -> dict[str, Any]:
    """``generate`` arguments of Fast-dLLM's parallel decoder: confidence ``threshold``, greedy, no cache."""
    return {
        "sampler": "threshold",
        "sampler_options": {"threshold": threshold},
        "block_length": block,
        "temperature": 0.0,
    }


def one_per_step(gen_length: int, block: int = 32) -> dict[str, Any]:
    """The base decoder the targets come from: ``low_confidence``, steps = gen length."""
    return {"sampler": "low_confidence", "steps": gen_length, "block_length": block, "temperature": 0.0}


def one_per_step_results(model: Any, tokenizer: Any, tasks: Sequence[Any], *, batch_size: int = 50) -> dict[str, Any]:
    """``evaluate_tasks`` with ``one_per_step`` at each task's own generation length (waiting-line 32, puzzles 64),
    the per-task results merged in ``tasks``' order and the means taken over all of them."""

    by_length: dict[int, list[Any]] = {}
    for task in tasks:
        by_length.setdefault(max_new_tokens(task.name), []).append(task)
    parts = [
        evaluate_tasks(model, tokenizer, group, one_per_step(gl), batch_size=batch_size)
        for gl, group in by_length.items()
    ]
    per_task = {t.name: next(p["tasks"][t.name] for p in parts if t.name in p["tasks"]) for t in tasks}
    return summarize(per_task, sum(p["seconds"] for p in parts))


def official_tasks(data_dir: str | Path, names: Sequence[str], limit: int | None = None, stride: int = 1) -> list[Any]:
    """The official test tasks; ``stride`` keeps every k-th sample (the files are sorted by list length, so a stride
    keeps every length, a ``limit`` only the first ones)."""

    tasks = [load_task(data_dir, n, limit=limit) for n in names]
    return [Task(t.name, t.config, t.samples[::stride]) for t in tasks] if stride > 1 else tasks


def equal_score_ratios(base: dict[str, Any], other: dict[str, Any], tolerance: float = 1.0) -> list[dict[str, Any]]:
    """The distillation target's reading: for each operating point of ``base`` (one ``eta=`` entry), the fewest
    forwards any point of ``other`` needs while scoring within ``tolerance`` points of it (score >= base - tolerance),
    as a ratio of the fewest forwards the base itself needs for that score (its cheapest point scoring at least as
    high: a base point that another base point beats on both counts is not the base's cost); None where no point of
    ``other`` scores that high. Sorted by base score, highest first."""
    mine = [v for k, v in base.items() if k.startswith("eta=")]
    points = [(k, v) for k, v in other.items() if k.startswith("eta=")]
    out = []
    for key, b in base.items():
        if not key.startswith("eta="):
            continue
        cost = min(p["nfe"] for p in mine if p["score"] >= b["score"])  # b itself qualifies
        ok = [(k, p) for k, p in points if p["score"] >= b["score"] - tolerance]
        eta, best = min(ok, key=lambda kp: kp[1]["nfe"]) if ok else (None, None)
        out.append(
            {
                "base": key,
                "base_score": b["score"],
                "base_nfe": cost,
                "other": eta,
                "score": best["score"] if best else None,
                "nfe": best["nfe"] if best else None,
                "ratio": round(best["nfe"] / cost, 3) if best else None,
            }
        )
    return sorted(out, key=lambda r: -r["base_score"])


def equal_score_table(rows: list[dict[str, Any]], base: str, other: str) -> str:
    """``equal_score_ratios`` as Markdown."""
    lines = [f"| {base} point | {base} score / NFE | cheapest {other} within 1 point | score / NFE | NFE ratio |"]
    lines.append("|---|---|---|---|---|")
    for r in rows:
        got = f"{r['score']:.1f} / {r['nfe']:.2f}" if r["other"] else "-"
        ratio = f"{r['ratio']:.2f}x" if r["ratio"] is not None else "none within 1 point"
        bs = f"{r['base_score']:.1f} / {r['base_nfe']:.2f}"
        lines.append(f"| {r['base']} | {bs} | {r['other'] or '-'} | {got} | {ratio} |")
    return "\n".join(lines)


def parse_reuse(spec: str) -> tuple[str, str, str]:
    """``[LABEL=]FILE:NAME`` -> (the name the model gets here: LABEL, else NAME; FILE; NAME)."""
    where, _, name = spec.rpartition(":")
    label, _, path = where.rpartition("=")
    if not path or not name:
        raise ValueError(f"--reuse expects [LABEL=]FILE:NAME, got {spec!r}")
    return label or name, path, name


def reuse_results(spec: str, tasks: Sequence[Any], etas: Sequence[float]) -> tuple[str, dict[str, Any]]:
    """``[LABEL=]FILE:NAME``: one model's results from an earlier ``--out`` JSON (named LABEL here, default NAME),
    checked to hold the same tasks with the same sample counts and every eta asked for (so a base need not be decoded
    again for each distilled variant)."""
    label, path, name = parse_reuse(spec)
    if not Path(path).is_file():
        raise ValueError(f"--reuse {spec}: no such file {path}")
    data = json.loads(Path(path).read_text())
    if name not in data:
        raise ValueError(f"--reuse {spec}: {path} holds {sorted(data)}, not {name!r}")
    res = data[name]
    want = {t.name: len(t.samples) for t in tasks}
    for eta in etas:
        key = f"eta={eta:g}"
        if key not in res:
            raise ValueError(f"--reuse {spec}: no {key} in {path} (it has {[k for k in res if k.startswith('eta=')]})")
        got = {t: v["n"] for t, v in res[key]["tasks"].items()}
        if got != want:
            raise ValueError(f"--reuse {spec}: {key} was measured on other tasks or sample counts than asked for")
    return label, {**res, "reused_from": f"{path}:{name}"}


def markdown_table(results: dict[str, dict[str, Any]], eta: float) -> str:
    """Per task score / NFE at ``eta`` for every model, plus the one-token-per-step score."""
    names = list(results)
    key = f"eta={eta:g}"
    head = "| task | " + " | ".join(f"{m} score | {m} NFE" for m in names) + " |"
    lines = [head, "|---" * (1 + 2 * len(names)) + "|"]
    tasks = list(next(iter(results.values()))[key]["tasks"])
    for t in [*tasks, "mean"]:
        cells = []
        for m in names:
            r = results[m][key] if t == "mean" else results[m][key]["tasks"][t]
            cells += [f"{r['score']:.1f}", f"{r['nfe']:.2f}"]
        lines.append(f"| {t.split('/')[-1]} | " + " | ".join(cells) + " |")
    cells = []
    for m in names:
        r = results[m].get("one_per_step")
        cells += [f"{r['score']:.1f}" if r else "-", f"{r['nfe']:.0f}" if r else "-"]
    lines.append("| mean, 1 token/step | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results: dict[str, dict[str, Any]], path: str | Path, title: str = "", x: str = "tokens_per_step") -> None:
    """Mean score of every model against ``x``: ``tokens_per_step`` (the parallelism) or ``nfe`` (the cost; lower is
    better), one line per model over its etas, its one-token-per-step point as a square (tokens per step only)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if x not in ("tokens_per_step", "nfe"):
        raise ValueError(f"x must be 'tokens_per_step' or 'nfe', got {x!r}")
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, res in results.items():
        pts = sorted((v[x], v["score"], k) for k, v in res.items() if k.startswith("eta="))
        line = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{name} (entropy_threshold)")[0]
        for px, py, k in pts:
            ax.annotate(k.split("=")[1], (px, py), textcoords="offset points", xytext=(3, 3), fontsize=7)
        if "one_per_step" in res and x == "tokens_per_step":
            r = res["one_per_step"]
            ax.scatter([r["tokens_per_step"]], [r["score"]], marker="s", color=line.get_color())
    if x == "nfe":
        ax.set_xlabel("mean NFE per sample (forwards; lower is faster)")
        ax.set_title(title or "score vs NFE (labels: eta)")
    else:
        ax.set_xlabel("tokens per step (gen length / NFE)")
        ax.set_title(title or "score vs parallelism (labels: eta; squares: 1 token/step)")
    ax.set_ylabel("mean score")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", default=[], help="NAME=checkpoint dir (repeatable)")
    ap.add_argument(
        "--reuse",
        action="append",
        default=[],
        metavar="[LABEL=]FILE:NAME",
        help="take model NAME's results from an earlier --out JSON instead of decoding it again (listed first)",
    )
    ap.add_argument("--data", default=None, help=f"official ParallelBench directory (default: ${DATA_ENV})")
    ap.add_argument("--tasks", nargs="*", default=list(DETERMINISTIC_WAITING_LINE))
    ap.add_argument("--limit", type=int, default=None, help="first N samples per task")
    ap.add_argument("--stride", type=int, default=1, help="every k-th sample per task (after --limit)")
    ap.add_argument("--etas", type=float, nargs="*", default=[0.5])
    ap.add_argument("--table-eta", type=float, default=0.5)
    ap.add_argument("--no-one-per-step", action="store_true", help="skip the 1-token-per-step reference")
    ap.add_argument("--batch-size", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None, help="results JSON")
    ap.add_argument("--plot", default=None, help="PNG of score vs tokens per step")
    ap.add_argument("--plot-nfe", default=None, help="PNG of score vs mean NFE")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if not args.model and not args.reuse:
        raise ValueError("give at least one --model NAME=PATH (or --reuse FILE:NAME)")
    given = [parse_reuse(s)[0] for s in args.reuse] + [s.partition("=")[0] for s in args.model]
    if len(set(given)) != len(given):
        raise ValueError(f"model names must differ (--reuse, then --model): {given}")
    tasks = official_tasks(data_dir(args.data), args.tasks, args.limit, args.stride)
    results: dict[str, dict[str, Any]] = dict(reuse_results(spec, tasks, args.etas) for spec in args.reuse)
    for spec in args.model:
        name, _, path = spec.partition("=")
        if not path:
            raise ValueError(f"--model expects NAME=PATH, got {spec!r}")
        model, tok = dlm_decode.load_model(path)
        res: dict[str, Any] = {"path": path}
        for eta in args.etas:
            r = evaluate_tasks(model, tok, tasks, parallel_decoding(eta), batch_size=args.batch_size)
            res[f"eta={eta:g}"] = r
            print(f"{name:10s} eta={eta:<5g} score {r['score']:6.2f}  NFE {r['nfe']:6.2f}  ({r['seconds']:.0f}s)")
        if not args.no_one_per_step:
            r = one_per_step_results(model, tok, tasks, batch_size=args.batch_size)
            res["one_per_step"] = r
            print(f"{name:10s} 1 token/step score {r['score']:6.2f}  NFE {r['nfe']:6.2f}  ({r['seconds']:.0f}s)")
        results[name] = res
    if args.table_eta in args.etas:
        print(markdown_table(results, args.table_eta))
    names = list(results)
    for other in names[1:]:  # every model against the first (the base), at equal score
        rows = equal_score_ratios(results[names[0]], results[other])
        results[other]["equal_score_vs_" + names[0]] = rows
        print(equal_score_table(rows, names[0], other))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=1))
    if args.plot:
        plot(results, args.plot)
    if args.plot_nfe:
        plot(results, args.plot_nfe, x="nfe")
    print(json.dumps({m: {k: v["score"] for k, v in r.items() if isinstance(v, dict)} for m, r in results.items()}))


if __name__ == "__main__":
    run_script(main, "certainty_forcing/evaluate.py")
