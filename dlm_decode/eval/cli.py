"""``dlm-decode eval``: lm-eval's own command line, with the ``dlm_decode`` model registered and the shipped tasks
visible.

    dlm-decode eval --model_args pretrained=demo-llada,sampler=low_confidence --tasks dlm_tiny_mc --limit 4
    dlm-decode eval ls tasks

Everything after ``eval`` goes to lm-eval 0.4.13's CLI unchanged, except for defaults filled in when absent (for
``run``, the implicit default subcommand): ``--model dlm_decode`` (unless a ``--config`` file is given);
``--include_path`` = the shipped task folder (lm-eval takes one such path: give your own and the shipped tasks are
not indexed); and, with ``--output_path`` and the ``dlm_decode`` model, ``stats_path`` = per-request decoding
statistics as JSONL next to the results. Before lm-eval starts, the ``dlm_decode`` model's ``--model_args`` are checked
against the request types of the shipped ``--tasks`` (``check_before_running``: a sampler or cache named for a
likelihood task is refused with one line).
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


LIKELIHOOD_TYPES = {"multiple_choice": "loglikelihood", "loglikelihood": "loglikelihood"}
LIKELIHOOD_TYPES["loglikelihood_rolling"] = "loglikelihood_rolling"


def shipped_request_types() -> dict[str, set[str]]:
    """Task or group name of the shipped tasks -> the lm-eval request types it sends (read from the YAML files alone,
    following ``include`` and group members: no task, dataset or model is loaded)."""
    import yaml

    from dlm_decode.eval.tasks import TASKS_DIR

    class Loader(yaml.SafeLoader):  # lm-eval's ``!function`` tags name code: their values do not matter here
        pass

    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)

    def read(path: Path) -> dict:
        cfg = yaml.load(path.read_text(encoding="utf-8"), Loader=Loader) or {}
        base = cfg.get("include")
        return (read(path.parent / base) if isinstance(base, str) else {}) | cfg

    tasks, groups = {}, {}
    for path in TASKS_DIR.rglob("*.yaml"):
        cfg = read(path)
        if isinstance(cfg.get("group"), str):
            groups[cfg["group"]] = [t for t in cfg.get("task") or [] if isinstance(t, str)]
        elif isinstance(cfg.get("task"), str):
            tasks[cfg["task"]] = {LIKELIHOOD_TYPES.get(cfg.get("output_type", ""), "generate_until")}

    def types(name: str, seen: frozenset = frozenset()) -> set[str]:
        if name in tasks:
            return tasks[name]
        return set().union(*(types(t, seen | {name}) for t in groups.get(name, []) if t not in seen))

    return {name: types(name) for name in [*tasks, *groups]}


def check_before_running(args: list[str]) -> None:
    """The ``dlm_decode`` model's ``--model_args`` against the request types of the shipped ``--tasks``, before
    lm-eval loads anything (the plugin checks each request type again, for tasks from elsewhere)."""
    from lm_eval.utils import simple_parse_args_string

    from dlm_decode.eval.options import check_request_type, parse_model_args

    model, tasks = _value(args, "--model", "-M"), _value(args, "--tasks", "-t")
    if model != "dlm_decode" or not tasks:
        return
    model_args: dict = {}
    for i, a in enumerate(args):  # every --model_args given (ours may add stats_path)
        if a in ("--model_args", "-a") and i + 1 < len(args):
            model_args |= simple_parse_args_string(args[i + 1])
    opts = parse_model_args(model_args)
    known = shipped_request_types()
    for request_type in sorted(set().union(*(known.get(t.strip(), set()) for t in tasks.split(",")))):
        check_request_type(opts, request_type)


def main(argv: list[str] | None = None) -> int:
    from lm_eval.__main__ import cli_evaluate

    import dlm_decode.eval  # noqa: F401  (registers the dlm_decode model with lm-eval)

    argv = sys.argv[1:] if argv is None else list(argv)
    full = lm_eval_argv(argv)
    if full and full[0] == "run":
        check_before_running(full[1:])
    saved = sys.argv
    sys.argv = ["dlm-decode eval", *full]  # lm-eval's CLI reads sys.argv itself
    try:
        cli_evaluate()
    finally:
        sys.argv = saved
    return 0
