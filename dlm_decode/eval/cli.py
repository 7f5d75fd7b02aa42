"""``dlm-decode eval``: lm-eval's own command line, with the ``dlm_decode`` model registered and the shipped tasks
visible.

    dlm-decode eval --model_args pretrained=demo-llada,sampler=low_confidence --tasks dlm_tiny_mc --limit 4
    dlm-decode eval ls tasks

Everything after ``eval`` goes to lm-eval 0.4.13's CLI unchanged, except for defaults filled in when absent (for
``run``, the implicit default subcommand): ``--model dlm_decode`` (unless a ``--config`` file is given);
``--include_path`` = the shipped task folder (lm-eval takes one such path: give your own and the shipped tasks are
not indexed); and, with ``--output_path`` and the ``dlm_decode`` model, ``stats_path`` = per-request decoding
statistics as JSONL next to the results.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

SUBCOMMANDS = ("run", "ls", "validate")


def _has(args: list[str], *flags: str) -> bool:
    return any(a in flags or any(a.startswith(f + "=") for f in flags) for a in args)


def _value(args: list[str], *flags: str) -> str | None:
    for i, a in enumerate(args):
        for f in flags:
            if a == f and i + 1 < len(args):
                return args[i + 1]
            if a.startswith(f + "="):
                return a.split("=", 1)[1]
    return None


def stats_file(output_path: str) -> str:
    """Where the JSONL statistics go for an lm-eval ``--output_path`` (a folder, or a ``.json`` results file)."""
    p = Path(output_path)
    if p.suffix == ".json":
        return str(p.with_name(p.stem + ".dlm_decode_stats.jsonl"))
    return str(p / "dlm_decode_stats.jsonl")


def lm_eval_argv(args: list[str]) -> list[str]:
    """lm-eval's argv (without the program name) with our defaults filled in."""
    from dlm_decode.eval.tasks import TASKS_DIR

    args = list(args)
    if not args or args[0] in ("-h", "--help"):
        return args
    command = args[0] if args[0] in SUBCOMMANDS else "run"
    rest = args[1:] if args[0] in SUBCOMMANDS else args
    if not _has(rest, "--include_path"):
        rest += ["--include_path", str(TASKS_DIR)]
    if command == "run":
        if not _has(rest, "--model", "-M", "--config", "-C"):  # a --config file names its own model
            rest += ["--model", "dlm_decode"]
        model = _value(rest, "--model", "-M")
        output = _value(rest, "--output_path", "-o")
        model_args = " ".join(a for a in rest if "=" in a)
        if model == "dlm_decode" and output and "stats_path" not in model_args:
            rest += ["--model_args", f"stats_path={stats_file(output)}"]
    return [command, *rest]


def add_arguments(p: argparse.ArgumentParser) -> None:
    # Hand every token to lm-eval, options included. argparse's REMAINDER drops a leading "--flag" as unknown, so
    # this sub-parser gets a prefix character no argument uses: "-h" and "--model" then parse as plain text.
    p.prefix_chars = "\0"
    p.add_argument("lm_eval_args", nargs=argparse.REMAINDER, help="lm-eval arguments (see `dlm-decode eval -h`)")


def run(args: argparse.Namespace) -> int:
    return main(args.lm_eval_args)


def main(argv: list[str] | None = None) -> int:
    from lm_eval.__main__ import cli_evaluate

    import dlm_decode.eval  # noqa: F401  (registers the dlm_decode model with lm-eval)

    argv = sys.argv[1:] if argv is None else list(argv)
    saved = sys.argv
    sys.argv = ["dlm-decode eval", *lm_eval_argv(argv)]  # lm-eval's CLI reads sys.argv itself
    try:
        cli_evaluate()
    finally:
        sys.argv = saved
    return 0
