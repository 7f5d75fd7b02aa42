"""``dlm-decode parallelbench``: score a model on ParallelBench with any sampler and cache, sweep configs, plot.

    dlm-decode parallelbench --model demo-llada --data DIR --tasks waiting_line/copy,waiting_line/shuffle \
        --sampler threshold --sampler-opt threshold=0.9 --cache dual [--oracle] [--json]
    dlm-decode parallelbench --model demo-llada --generate-seed 5 --limit 20            # regenerated tasks
    dlm-decode parallelbench --model demo-llada --data DIR --sweep quick --out runs/pb.jsonl   # + PBx and plots
    dlm-decode parallelbench --plot runs/pb.jsonl                                         # redraw the plots only
    dlm-decode parallelbench --model demo-llada --generate-seed 5 --cache dual --compile   # torch.compile'd layers

The decoding flags are ``generate``'s (same parser); ``--gen-length`` defaults to each task's budget. ``--json`` prints
one JSON object last: ``{"tasks": [{"task", "n", "score", "score_strict", "nfe", "tokens_per_step", "seconds",
"tokens_per_second", "threads", "oracle_nfe", "nfe_ratio", "sampler", "cache", ...}], "decoding", "summary",
"skipped", ...}``; ``decoding`` holds the options the run used, the model's default cache named when none was given
(``prefix``, exact, on a block-causal model; ``none`` on a bidirectional one).

A progress bar per task (per (config, task) run in sweeps) goes to stderr. Timings are taken with ``--threads``
torch threads (default 1, as in ``demo``: on a busy 2-core machine torch's default ran 24x slower), recorded as
``threads`` in every result. Ctrl-C stops at once (exit 130): the task being decoded is dropped, the finished ones
are printed (a sweep's rows are already in its JSONL, and a rerun resumes there). ``--compile`` runs every decode
with ``torch.compile``d layer pieces (``dlm_decode/models/compiled.py``); compiling happens in the first task's
decodes and counts in its seconds; the JSON (and a sweep's rows) record ``compile``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from dlm_decode.cli import add_compile_arg, add_decoding_args, check_components, decoding_kwargs
from dlm_decode.core.words import plural, some

if TYPE_CHECKING:
    from dlm_decode.core.inputs import ModelFacts


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="demo-llada", help="shipped demo name or checkpoint directory")
    data_help = "ParallelBench data directory (default: $DLM_PARALLELBENCH_DATA or ../shared/data/parallelbench)"
    p.add_argument("--data", default=None, help=data_help + "; with --generate-seed only configs and names are read")
    p.add_argument("--generate-seed", type=int, default=None, help="regenerate waiting-line and puzzle tasks offline")
    p.add_argument("--tasks", default=None, help="comma-separated task names (default: every task of --data)")
    p.add_argument("--limit", type=int, default=None, help="samples per task (first N; N generated)")
    p.add_argument("--batch-size", type=int, default=8, help="rows decoded together (does not change answers)")
    p.add_argument("--oracle", action="store_true", help="also compute the per-sample oracle NFE bound")
    p.add_argument("--json", action="store_true", help="print one JSON object last")
    p.add_argument(
        "--outputs", action="store_true", help="include every sample's text, score, NFE in the JSON (implies --json)"
    )
    p.add_argument("--list-tasks", action="store_true", help="list the tasks of --data and exit")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1, as in demo)")
    g = p.add_argument_group("sweeps")
    g.add_argument("--sweep", default=None, metavar="GRID", help="grid name (paper, quick) or JSON grid file")
    g.add_argument(
        "--out",
        default=None,
        help="sweep JSONL (resumed when it exists; rows of other settings are refused unless --append); plots are "
        "written beside it",
    )
    g.add_argument(
        "--append",
        action="store_true",
        help="add this sweep's rows to an --out file holding rows of other settings (model, data, --limit); the "
        "summary and plots use this run's rows",
    )
    g.add_argument("--no-plots", action="store_true", help="do not write PNG plots after a sweep")
    g.add_argument("--plot", default=None, metavar="JSONL", help="only (re)draw the plots of a sweep file")
    g.add_argument("--plot-task", default=None, help="task of the decoding-order heatmap (default: a copy task)")
    add_decoding_args(p, task_lengths=True)
    add_compile_arg(p)


def check_flags(args: argparse.Namespace) -> None:
    """Flags that only mean something together: an error (or, for ``--outputs``, implied) before any work."""
    if args.out and not args.sweep:
        raise ValueError(
            f"--out {args.out!r} is where a sweep writes its rows; add --sweep GRID, or for one run use --json "
            "(and redirect it to a file)"
        )
    if args.append and not args.sweep:
        raise ValueError("--append adds a sweep's rows to its --out file; add --sweep GRID and --out FILE")
    if args.outputs and args.sweep:
        raise ValueError("--outputs adds every sample to a single run's --json output; a sweep's rows hold none")
    if args.outputs:
        args.json = True


def _notice(msg: str) -> None:
    print(f"notice: {msg}", file=sys.stderr)


def _tasks(args: argparse.Namespace):
    from dlm_decode.parallelbench.runner import load_tasks

    names = [t.strip() for t in args.tasks.split(",") if t.strip()] if args.tasks is not None else None
    if names == []:
        raise ValueError(f"--tasks {args.tasks!r} names no task; leave it out to run every task, or see --list-tasks")
    try:
        return load_tasks(args.data, names, limit=args.limit, generate_seed=args.generate_seed)
    except KeyError as e:  # unknown task names: a user error, reported like the others
        raise ValueError(e.args[0]) from None


def _load(args: argparse.Namespace):
    import dlm_decode

    def load():
        model, tok = dlm_decode.load_model(args.model, dtype=args.dtype, device=args.device)
        if args.compile:
            from dlm_decode.models.compiled import set_compile

            set_compile(model, args.compile)
        return model, tok

    return load


def _check_before_loading(args: argparse.Namespace, kw: dict[str, Any], tasks) -> ModelFacts:
    """The decoding flags against config.json and every scored task's prompts (tokenizer files only), so a bad
    configuration fails before any weight is read; returns the model's facts (for the sweep's per-config checks)."""
    from dlm_decode.models.loading import load_tokenizer, model_facts
    from dlm_decode.parallelbench.runner import check_task_kwargs, short_budget, skip_reason, task_kwargs

    facts, tok = model_facts(args.model), load_tokenizer(args.model)
    if tok is None:
        raise ValueError(f"{args.model} ships no tokenizer: ParallelBench needs one for its chat prompts")
    for t in tasks:
        task_kw = task_kwargs(kw, t.name)
        check_task_kwargs(task_kw, t, facts, tok)
        if skip_reason(t) is None and (why := short_budget(t, task_kw["gen_length"], tok)) is not None:
            _notice(why)
    return facts


def run(args: argparse.Namespace) -> int:
    if args.plot:
        from dlm_decode.parallelbench.plots import write_plots

        for name, path in write_plots(args.plot, task=args.plot_task).items():
            print(f"{name}: {path}")
        return 0
    if args.list_tasks:
        from dlm_decode.parallelbench.runner import require_data_dir, task_names

        print("\n".join(task_names(require_data_dir(args.data))))
        return 0
    check_flags(args)
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    if args.limit is not None and args.limit < 1:  # 0 would score nothing and print a table of empty tasks
        raise ValueError(f"--limit must be >= 1 (samples per task; leave it out for all), got {args.limit}")
    import torch

    from dlm_decode.models.loading import check_device

    check_device(args.device, "--device")
    torch.set_num_threads(args.threads)
    kw = decoding_kwargs(args)
    if kw["sampler"] != "oracle":
        check_components(kw)
    tasks = _tasks(args)
    if args.sweep:
        return _run_sweep(args, kw, tasks)
    return _run_once(args, kw, tasks)


def _run_once(args: argparse.Namespace, kw: dict[str, Any], tasks) -> int:
    from dlm_decode.parallelbench.runner import Interrupted, run_benchmark

    _check_before_loading(args, kw, tasks)
    model, tok = _load(args)()
    try:
        results = run_benchmark(model, tok, tasks, kw, batch_size=args.batch_size, oracle=args.oracle, progress=True)
    except Interrupted as e:
        _report(args, kw, e.results, interrupted=True)
        print(
            f"dlm-decode parallelbench: interrupted after {len(e.results)} of {plural(len(tasks), 'task')} (the task "
            "being decoded was dropped); the finished ones are above",
            file=sys.stderr,
        )
        return 130
    _report(args, kw, results)
    return 0


def _report(args: argparse.Namespace, kw: dict[str, Any], results, interrupted: bool = False) -> None:
    from dlm_decode.parallelbench.runner import format_table, summarize

    skipped: dict[str, list[str]] = {}  # one notice per reason (24 text tasks share one)
    for r in results:
        if r.skipped:
            skipped.setdefault(r.skipped, []).append(r.task)
    for why, names in skipped.items():
        _notice(f"{plural(len(names), 'task')} not scored (skipped): {some(names)}: {why}")
    print(format_table(results))
    if args.json:
        done = [r for r in results if not r.skipped]
        decoding = dict(kw)
        if kw.get("cache") is None and done:  # the model's default, not null: the exact prefix on block-causal ones
            decoding["cache"] = done[0].cache.get("name")
        print(
            json.dumps(
                {
                    "model": str(args.model),
                    "source": _source(args),
                    "decoding": decoding,
                    "compile": args.compile,
                    "tasks": [r.to_json(outputs=args.outputs) for r in done],
                    "skipped": {r.task: r.skipped for r in results if r.skipped},
                    "summary": summarize(results),
                }
                | ({"interrupted": True} if interrupted else {})
            )
        )


def _source(args: argparse.Namespace) -> str:
    from dlm_decode.parallelbench.runner import require_data_dir

    data = str(require_data_dir(args.data))
    return f"generated:{args.generate_seed}:{data}" if args.generate_seed is not None else f"data:{data}"


def _run_sweep(args: argparse.Namespace, kw: dict[str, Any], tasks) -> int:
    from dlm_decode.parallelbench.runner import Interrupted
    from dlm_decode.parallelbench.sweep import (
        attach_oracle,
        check_out,
        expand_grid,
        format_sweep,
        load_grid,
        pbx,
        run_sweep,
    )

    if not args.out:
        raise ValueError("--sweep needs --out FILE.jsonl (rows are appended there and a rerun resumes)")
    check_out(args.out, "--out")
    names = [t.name for t in tasks]
    if args.plot_task is not None and args.plot_task not in names:
        raise ValueError(
            f"--plot-task {args.plot_task!r} is not a task of this run; tasks of this run: {', '.join(names)}"
        )
    base = {k: v for k, v in kw.items() if k not in ("sampler", "sampler_options", "steps", "block_length")}
    configs = expand_grid(load_grid(args.sweep), base)
    facts = _check_before_loading(args, base, tasks)
    meta = {"model": str(args.model), "source": _source(args), "limit": args.limit}
    if args.compile:
        meta["compile"] = args.compile
    try:
        rows = run_sweep(
            _load(args),
            tasks,
            configs,
            args.out,
            base=base,
            meta=meta,
            batch_size=args.batch_size,
            notice=_notice,
            progress=True,
            facts=facts,
            append=args.append,
        )
    except Interrupted as e:
        print(
            f"dlm-decode parallelbench: interrupted: {plural(len(e.results), 'row')} in {e.path} (the task being "
            "decoded was dropped); rerun the same command to resume",
            file=sys.stderr,
        )
        return 130
    rows = attach_oracle(rows)
    print(format_sweep(rows))
    plots = {}
    if not args.no_plots and rows:
        from dlm_decode.parallelbench.plots import write_plots

        plots = {k: str(v) for k, v in write_plots(args.out, rows, task=args.plot_task).items()}
        for name, path in plots.items():
            print(f"{name}: {path}")
    if args.json:
        from dlm_decode.parallelbench.aup import aup_table
        from dlm_decode.parallelbench.sweep import config_summary

        summary = config_summary(rows)
        print(
            json.dumps(
                {
                    "out": args.out,
                    "rows": len(rows),
                    "configs": summary,
                    "pbx": pbx(rows),
                    "aup": aup_table(rows),
                    "plots": plots,
                }
            )
        )
    return 0
