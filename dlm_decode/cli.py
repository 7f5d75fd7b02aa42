"""The ``dlm-decode`` command line. Subcommands live in their own modules and share the decoding flags below.

dlm-decode generate MODEL [PROMPT ...] [--input-ids 1,2,3 ...] [--chat] --sampler NAME [--sampler-opt K=V ...]
    --cache NAME [--cache-opt K=V ...] --gen-length N --block-length N --steps N --temperature T --seed S
    --dtype float32|bfloat16|float16 [--compile [MODE]] [--cuda-graphs] [--json]
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import dlm_decode
from dlm_decode.cache import CACHES, get_cache
from dlm_decode.core.generation_config import resolve_chat
from dlm_decode.core.inputs import encode_prompts
from dlm_decode.core.special_ids import Notice
from dlm_decode.decode import check_request
from dlm_decode.models.compiled import MODES
from dlm_decode.models.loading import check_device, load_tokenizer, model_facts
from dlm_decode.options import parse_kv
from dlm_decode.samplers import SAMPLERS, get_sampler
from dlm_decode.samplers.presets import PRESETS, get_preset

# subcommand -> module exposing ``add_arguments(parser)`` and ``run(args) -> int``
COMMANDS: dict[str, tuple[str, str]] = {
    "generate": ("dlm_decode.cli", "decode a batch of prompts with any sampler and cache"),
    "eval": ("dlm_decode.eval.cli", "lm-eval with the dlm_decode model and the offline tasks (takes lm-eval flags)"),
    "parallelbench": ("dlm_decode.parallelbench.cli", "score a model on ParallelBench; sweeps, PBx, oracle, plots"),
    "batch": ("dlm_decode.engine.batch_file", "decode an OpenAI batch file (JSONL) on the continuous-batching engine"),
    "serve": ("dlm_decode.serve.cli", "an OpenAI-compatible HTTP server on the engine (chat, completions, streaming)"),
    "demo": ("dlm_decode.demo", "decode ParallelBench-style tasks with every sampler and cache (the demo model)"),
}
# subcommand -> (optional extra, the modules it installs): a subcommand whose extra is missing is not imported (so it
# cannot break the others, nor the base install's ``make demo``) and answers with one line naming the install
EXTRAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "eval": ("eval", ("lm_eval",)),
    "serve": ("serve", ("fastapi", "uvicorn", "prometheus_client")),
}


class MissingExtraError(RuntimeError):
    """A subcommand needs an optional extra that is not installed."""


# what a user's mistake raises (a bad option, a missing or wrong file): one line on stderr and exit status 2, never a
# traceback; the same rule for ``dlm-decode`` and for the recipes' and benchmarks' scripts (``run_script``)
USER_ERRORS: tuple[type[Exception], ...] = (ValueError, FileNotFoundError, MissingExtraError)


def run_script(main: Callable[[], Any], prog: str) -> NoReturn:
    """Run a script's ``main()`` and exit: its int return value is the status (anything else: 0); a user error
    (``USER_ERRORS``, or ``SystemExit`` with a message) prints ``PROG: error: MESSAGE`` and exits 2; Ctrl-C prints
    ``PROG: interrupted`` and exits 130 (scripts that keep partial work, such as the training recipes' checkpoints,
    say on their own where it is); argparse's own exits (``--help``, a usage error) pass through as they are."""
    try:
        rc = main()
    except USER_ERRORS as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        sys.exit(2)
    except SystemExit as e:  # ``raise SystemExit("message")``, the scripts' older way to refuse an option
        if not isinstance(e.code, str):
            raise
        print(f"{prog}: error: {e.code}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(rc if isinstance(rc, int) and not isinstance(rc, bool) else 0)


def missing_extra(command: str) -> str | None:
    """The ``pip install`` line ``command`` needs, or None when its extra (if any) is installed."""
    if command not in EXTRAS:
        return None
    extra, modules = EXTRAS[command]
    if all(importlib.util.find_spec(m) is not None for m in modules):
        return None
    return f'pip install -e ".[{extra}]"  (or: pip install "dlm-decode[{extra}]")'


def add_decoding_args(p: argparse.ArgumentParser, *, task_lengths: bool = False) -> None:
    """Flags every decoding command shares (same names in generate, parallelbench, demo, benchmarks).
    ``task_lengths``: each task sets the gen length (ParallelBench), and a ``--preset`` sets only the lengths it
    holds per block (a preset naming no gen length: its block and steps per block); else an unset gen length is the
    checkpoint's (its ``generation_config.json``), else 128."""
    preset_lengths = not task_lengths
    lengths = "the task's: 32 waiting line, 64 puzzles" if task_lengths else "the checkpoint's, else 128"
    g = p.add_argument_group("decoding")
    g.add_argument("--sampler", default=None, help="sampler name (default low_confidence): " + ", ".join(SAMPLERS))
    g.add_argument(
        "--preset",
        default=None,
        metavar="NAME",
        help="a paper's published setting: sets the sampler and its options"
        + (
            " and, unless given, gen length, block length and steps"
            if preset_lengths
            else " and, unless given, the block length and steps of a preset naming no gen length (block-causal)"
        )
        + "; --sampler-opt adds to / overrides its options. One of: "
        + ", ".join(sorted(PRESETS)),
    )
    g.add_argument("--sampler-opt", action="append", default=[], metavar="KEY=VALUE", help="sampler option")
    g.add_argument(
        "--cache",
        default=None,
        help="cache policy name (default: prefix on block-causal models, else none): " + ", ".join(CACHES),
    )
    g.add_argument("--cache-opt", action="append", default=[], metavar="KEY=VALUE", help="cache option")
    g.add_argument(
        "--gen-length", type=int, default=None, help=f"generation slots after the prompt (default: {lengths})"
    )
    p.set_defaults(_preset_lengths=preset_lengths)
    g.add_argument(
        "--block-length",
        type=int,
        default=None,
        help="block size (default: the checkpoint's generation_config.json, clipped to the gen length; else 32, or "
        "the gen length for the Dream orderings)",
    )
    g.add_argument(
        "--steps",
        type=int,
        default=None,
        help="total steps for fixed-budget samplers (default: the checkpoint's with its gen length, else the gen "
        "length)",
    )
    g.add_argument(
        "--temperature", type=float, default=None, help="sampling temperature (default: a preset's, else 0: greedy)"
    )
    g.add_argument(
        "--top-p",
        type=float,
        default=None,
        help="top-p filter (1.0: off; default: a preset's, else as the sampler's reference, see --top-k; 1.0 for "
        "Dream)",
    )
    g.add_argument(
        "--top-k",
        type=int,
        default=None,
        help="top-k filter (0: off; default: as the sampler's reference: 50 for the Dream orderings on a Dream "
        "checkpoint, as its diffusion_generate, unless its config.json sets top_k; none otherwise)",
    )
    g.add_argument("--cfg-scale", type=float, default=0.0, help="classifier-free guidance scale (LLaDA)")
    g.add_argument(
        "--attention",
        default=None,
        choices=["answer_block_causal"],
        help="D2F's attention on LLaDA / Dream: the prompt one block, the answer in blocks that see the prompt, the "
        "earlier blocks and themselves (default: the model's own; the d2f presets set it)",
    )
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--stop-at-eos", action="store_true", help="stop a row at its first EOS (rest filled with EOS)")
    g.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    g.add_argument("--device", default="cpu")


def add_compile_arg(p: argparse.ArgumentParser, extra_help: str = "") -> None:
    """``--compile [MODE]``: ``torch.compile`` the layers' pieces (``dlm_decode/models/compiled.py``); ``extra_help``
    is appended to the flag's help (what the command does with it)."""
    p.add_argument(
        "--compile",
        nargs="?",
        const="default",
        default=None,
        choices=MODES,
        metavar="MODE",
        help="torch.compile the layers' elementwise pieces (inductor; MODE: " + ", ".join(MODES) + ", default "
        "'default'); eager with one warning if compiling fails. Compiling takes seconds to minutes on first use, "
        "counted in the first decode's time; see docs/caches.md 'Compiled forward' for when it pays" + extra_help,
    )


def decoding_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """Parsed flags -> keyword arguments of ``dlm_decode.generate`` (validated there)."""
    options = parse_kv(args.sampler_opt)
    preset = get_preset(args.preset) if getattr(args, "preset", None) else None
    overrides: dict[str, Any] = {}
    sampling: dict[str, Any] = {}  # a preset's published temperature / top-p / attention, for the flags left unset
    cache, cache_options = args.cache, parse_kv(args.cache_opt)
    if preset is not None:
        if args.sampler is not None and args.sampler != preset.sampler:
            raise ValueError(f"--preset {preset.name} decodes with {preset.sampler!r}; drop --sampler {args.sampler}")
        given = {k: getattr(args, k) for k in ("gen_length", "block_length", "steps") if getattr(args, k) is not None}
        resolved = preset.generate_kwargs(options, **given)  # the preset's steps follow an overridden gen length
        options = resolved["sampler_options"]
        sampling = {k: resolved[k] for k in ("temperature", "top_p", "attention") if k in resolved}
        if cache is None and resolved.get("cache"):  # the preset's cache, its options under the given ones
            cache, cache_options = resolved["cache"], resolved["cache_options"] | cache_options
        # commands with their own lengths (ParallelBench) keep them, except a preset's block and steps per block
        # when it names no gen length (the block-causal models' trained block: SDAR's 4, LLaDA2's 32)
        keep = ("gen_length", "block_length", "steps") if args._preset_lengths else ()
        if not args._preset_lengths and "gen_length" not in preset.config:
            keep = ("block_length", "steps")
        overrides = {k: resolved[k] for k in keep if k in resolved}
    # unset: the checkpoint's (``check_request``), else DecodeConfig's 128; ParallelBench: each task's
    gen_length = args.gen_length if args.gen_length is not None else overrides.get("gen_length")
    sampler = preset.sampler if preset else (args.sampler or "low_confidence")
    kw = dict(
        sampler=sampler,
        sampler_options=typed(get_sampler(sampler, options), options),
        cache=cache,
        cache_options=typed(get_cache(cache, cache_options), cache_options) if cache else cache_options,
        block_length=args.block_length if args.block_length is not None else overrides.get("block_length"),
        steps=args.steps if args.steps is not None else overrides.get("steps"),
        temperature=args.temperature if args.temperature is not None else sampling.get("temperature", 0.0),
        top_p=args.top_p if args.top_p is not None else sampling.get("top_p"),
        top_k=args.top_k,
        seed=args.seed,
        stop_at_eos=args.stop_at_eos,
        cfg_scale=args.cfg_scale,
        attention=args.attention if args.attention is not None else sampling.get("attention"),
    )
    if gen_length is not None:
        kw["gen_length"] = gen_length
    return kw


def typed(component: Any, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` (``KEY=VALUE`` strings from the command line) with the values the sampler or cache took from them
    (numbers as numbers, in JSON output too)."""
    return {k: getattr(component, k) for k in options}


def check_components(kw: dict[str, Any]) -> None:
    """Resolve sampler and cache (names and options) before any model is loaded, so typos fail at once."""
    get_sampler(kw["sampler"], kw["sampler_options"])
    get_cache(kw["cache"], kw["cache_options"])


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="checkpoint directory or shipped demo name (demo-llada, demo-dream)")
    p.add_argument("prompts", nargs="*", help="prompt texts, one per batch row")
    p.add_argument("--input-ids", action="append", default=[], metavar="1,2,3", help="token ids of one row")
    p.add_argument(
        "--chat",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="wrap each text prompt as a user turn of the chat template (default: the checkpoint's "
        "generation_config.json `chat`, else no)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_decoding_args(p)
    add_compile_arg(p)
    p.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="replay a block's fixed-shape steps as CUDA graphs (a GPU, batch 1: the forward is host-bound there; "
        "docs/caches.md 'Step graphs'); counts in the JSON's 'graphs'",
    )


def run(args: argparse.Namespace) -> int:
    check_device(args.device, "--device")
    if args.prompts and args.input_ids:
        raise ValueError("give either text prompts or --input-ids rows, not both")
    if not args.prompts and not args.input_ids:
        raise ValueError("nothing to decode: give prompt texts or --input-ids")
    rows: list[Any] = list(args.prompts)
    for spec in args.input_ids:
        try:
            rows.append([int(x) for x in spec.split(",") if x.strip()])
        except ValueError:
            raise ValueError(f"--input-ids expects comma-separated integers, got {spec!r}") from None
    kw = decoding_kwargs(args)
    # everything config.json, the tokenizer files and the flags decide is checked before any weight is read
    facts, tok = model_facts(args.model), load_tokenizer(args.model)
    if args.prompts and tok is None:
        raise ValueError(f"{args.model} ships no tokenizer: pass --input-ids instead of text prompts")
    ids = encode_prompts(rows, tok, resolve_chat(facts.generation, args.chat))
    check_request(facts, ids, **kw)
    model, _ = dlm_decode.load_model(args.model, dtype=args.dtype, device=args.device, tokenizer=False)
    out = dlm_decode.generate(model, ids, tokenizer=tok, compile=args.compile, cuda_graphs=args.cuda_graphs, **kw)
    if args.json:
        print(json.dumps(out.to_json()))
    else:
        for i, r in enumerate(out.rows):
            shown = r.text if r.text is not None else " ".join(map(str, r.generated_ids))
            if not shown.strip():  # say so, rather than print a blank line
                shown = f"(empty answer: the text ends at once; generated_ids {r.generated_ids[:8]}...)"
            print(f"[{i}] nfe={r.nfe}{' ERROR ' + r.error if r.error else ''}\n{shown}")
        print(f"nfe={out.nfe} seconds={out.seconds:.3f}", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dlm-decode", description="Fast decoding for masked-diffusion LMs.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_text) in COMMANDS.items():
        install = missing_extra(name)
        p = sub.add_parser(name, help=help_text, description=help_text)
        if install is not None:  # accept anything, then say what to install
            p.prefix_chars = "\0"
            p.add_argument("args", nargs=argparse.REMAINDER)
            p.set_defaults(_run=_needs_extra(name, install))
            continue
        mod = importlib.import_module(module)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def _needs_extra(command: str, install: str):
    def run(args: argparse.Namespace) -> int:
        raise MissingExtraError(f"`dlm-decode {command}` needs an optional extra that is not installed: {install}")

    return run


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """``parse_args`` that keeps prompt texts given after an option (``generate MODEL --chat "text"``): argparse
    hands the ``prompts`` positional its empty list together with MODEL, so texts after an option come back unparsed;
    they join the prompts, while anything option-like left over is still an error, reported by the sub-command's
    parser (its usage, ``usage: dlm-decode generate ...``, not the top-level one)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if isinstance(getattr(args, "prompts", None), list):
        args.prompts += [e for e in extra if not e.startswith("-")]
        extra = [e for e in extra if e.startswith("-")]
    if extra:
        subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        subs.choices[args.command].error("unrecognized arguments: " + " ".join(extra))
    return args


@contextmanager
def notices_as_lines(prog: str) -> Iterator[None]:
    """Print ``core.special_ids.Notice`` warnings as one ``PROG: notice: ...`` line each (other warnings as usual)."""
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001 (warnings' signature)
        if issubclass(category, Notice):
            print(f"{prog}: notice: {message}", file=sys.stderr)
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = shown


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except KeyboardInterrupt:  # Ctrl-C while the subcommands' modules import
        print("dlm-decode: interrupted", file=sys.stderr)
        return 130
    try:
        with notices_as_lines("dlm-decode"):
            return int(args._run(args) or 0)
    except USER_ERRORS as e:
        print(f"dlm-decode {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: no traceback; commands that keep partial results say where they are
        print(f"dlm-decode {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
