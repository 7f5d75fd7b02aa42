"""Has a demo checkpoint learned to read the prompt? Cheap probes for runs in progress, one JSON line out.

    python recipes/train_demo/probe.py RUN/export [--tasks waiting_line/copy waiting_line/reverse] [--full 8]

On fresh-seed short rows in the bare format (``stream.RowStream.short_row``; never an official test sample):

* ``tf`` (teacher-forced retrieval): mask one content token of the answer (a name, a digit, a symbol; never
  bracket or separator), leave every other token visible, and count how often the argmax is the right token. A model
  that does not read the prompt scores about its unigram guess (~0.01 on names); in-context copying shows here
  first, long before whole answers come out right.
* ``exact``: greedy decoding one token per step (``low_confidence``, steps = answer length) of the whole answer,
  scored by the task's metric (a random-output task's answer is right when it is valid, not when it equals the
  row's drawn target).

``--padded`` builds the rows the way the padded short stages train on them (``{pad=1}``: the answer, ``<|eot_id|>``,
then ``<|endoftext|>`` up to the task's gen length); a model trained past such a stage has never seen an unpadded
answer, and the plain probe then reads a collapse that is not there (measured 2026-11-24: copy 0.06 unpadded against
0.83 padded on the same checkpoint). ``--icl`` shows each row's in-context example first (two lists, as the official
prompts do).

``--full N`` also scores N fresh-seed samples per task with the official prompt (``build_messages``, ICL turn) the
way ``evaluate.py`` scores the official files (one token per step, ``scoring.score_task``), and reads ``full_tf``:
teacher-forced retrieval on those official-format rows, overall and split into word-initial tokens (first names)
and ``Ġ`` continuations (last names).

``--find N`` reads the look-up skill on N fresh find rows (``stream.LOOKUP``: people asked for by first name in a
random order, so a last name has no position route), short (bare, padded as ``--padded`` says) and full (the official
copy chat with the query line): teacher-forced parts and greedy exact match of each. ``--exclude N`` reads the same
on N exclude rows (``stream.EXCLUDE``: the list without the people a ``remove`` line names, a comparison by content),
``--missing N`` on N missing rows (``stream.MISSING``: all but one person named, the answer that one), and
``--missing-first N`` on the same rows over first names only (``stream.MISSING_FIRST``: single-token items), and
``--last N`` on N last rows (``stream.LAST``: one first name asked for, its last name the one answer token), and
``--next N`` on N next rows (``stream.NEXT``: the same with the answer begun by the first name). These teacher-forced
look-up numbers also count answers the position route gets right (the asked-for person is the list's first entry);
``lookup_probe.py`` separates the two.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from stream import (  # noqa: E402
    EXCLUDE,
    LAST,
    LOOKUP,
    MISSING,
    MISSING_FIRST,
    NEXT,
    TASKS,
    Mix,
    RowStream,
    eval_items,
    heldout,
    list_lengths,
    official_keys,
)

import dlm_decode  # noqa: E402
from dlm_decode.parallelbench.generator import random_answer  # noqa: E402
from dlm_decode.parallelbench.metrics import score_sample  # noqa: E402
from dlm_decode.parallelbench.tasks import build_messages, max_new_tokens  # noqa: E402

# tokens that carry structure, not content: a probe on them would measure the format, not retrieval
STRUCTURE = ('["', '"]', '",\u0120"', "\u010a", "<|eot_id|>", "<|endoftext|>", ",")


@torch.no_grad()
def teacher_forced_hits(
    model: Any, rows: Sequence[tuple[list[int], list[int]]], mask_id: int, skip: set[int]
) -> list[tuple[int, bool]]:
    """(token id, predicted right?) for every content answer token, each masked alone (argmax read)."""
    hits: list[tuple[int, bool]] = []
    for prompt, answer in rows:
        ids = torch.tensor([prompt + answer])  # [1, T]
        cols = [len(prompt) + j for j, t in enumerate(answer) if t not in skip]
        if not cols:
            continue
        x = ids.repeat(len(cols), 1)  # [C, T]: row c masks column cols[c]
        x[torch.arange(len(cols)), cols] = mask_id
        shift = getattr(model, "logit_shift", 0)  # Dream scores slot i from the logits at i - 1
        pred = model(x).logits[torch.arange(len(cols)), [c - shift for c in cols]].argmax(-1)  # [C]
        right = (pred == ids[0, cols]).tolist()
        hits += [(int(t), bool(ok)) for t, ok in zip(ids[0, cols].tolist(), right, strict=True)]
    return hits


def teacher_forced(model: Any, rows: Sequence[tuple[list[int], list[int]]], mask_id: int, skip: set[int]) -> float:
    """Share of content answer tokens predicted right (argmax) with only that token masked."""
    hits = teacher_forced_hits(model, rows, mask_id, skip)
    return sum(ok for _, ok in hits) / max(len(hits), 1)


def teacher_forced_parts(
    model: Any, rows: Sequence[tuple[list[int], list[int]]], mask_id: int, skip: set[int], continuation: set[int]
) -> dict[str, float]:
    """``teacher_forced`` overall, on word-initial tokens (a first name) and on ``continuation`` tokens (a last name,
    ``Ġ``-prefixed). A model that retrieves one part and guesses the other shows it here (measured 2026-11-24:
    Dream on the official prompts got the first names and missed every last name)."""
    hits = teacher_forced_hits(model, rows, mask_id, skip)
    rest = [ok for t, ok in hits if t in continuation]
    first = [ok for t, ok in hits if t not in continuation]
    return {"all": _share([ok for _, ok in hits]), "first": _share(first), "rest": _share(rest)}


def _share(flags: Sequence[bool]) -> float | None:
    return round(sum(flags) / len(flags), 3) if flags else None


def full_rows(stream: RowStream, task: str, samples: Sequence[dict], seed: int) -> list[tuple[list[int], list[int]]]:
    """Official-format rows (``build_messages``, the ICL turn, EOS-padded response) of ``samples``, as the full
    stages train on them; a random-output task answers with one drawn valid answer."""
    rng = random.Random(seed)
    return [
        stream.encode(build_messages(stream.configs[task], s), random_answer(task, s, rng), max_new_tokens(task))
        for s in samples
    ]


def greedy_exact(
    model: Any,
    tok: Any,
    rows: Sequence[tuple[list[int], list[int]]],
    task: str | None = None,
    samples: Sequence[dict] | None = None,
) -> float:
    """Share of rows whose whole answer comes out right, one token per step. With ``task`` and ``samples`` a row is
    right when the task's metric gives the decoded list full marks (the random-output tasks have many right answers,
    so the drawn target's ids are only one of them); otherwise the ids must equal the row's answer."""
    hits = 0
    for i, (prompt, answer) in enumerate(rows):
        out = dlm_decode.generate(
            model, [prompt], tokenizer=tok, sampler="low_confidence", gen_length=len(answer), steps=len(answer)
        )
        ids = out.rows[0].generated_ids[: len(answer)]
        if task is not None and samples is not None:
            text = tok.decode(ids, skip_special_tokens=True).strip()
            hits += int(score_sample(task, text, samples[i])["score"] == 1.0)
        else:
            hits += int(ids == answer)
    return hits / max(len(rows), 1)


def probe_rows(
    stream: RowStream,
    task: str,
    n: int,
    seed: int,
    padded: bool = False,
    icl: bool = False,
    lengths: tuple[int, int] | None = None,
) -> list[tuple[list[int], list[int]]]:
    """``n`` fresh short rows of ``task`` (prompt ids, answer ids) in the bare format, padded / with the in-context
    example as the flags say (the rows the short stages train on, ``stream.RowStream.short_row``). A random-output
    task's row answers with one valid answer drawn as training draws it (``random_answer``); ``lengths`` (lo, hi)
    sets the people per list as a stage's ``len`` does."""
    return probe_rows_and_samples(stream, task, n, seed, padded, icl, lengths)[0]


def probe_rows_and_samples(
    stream: RowStream,
    task: str,
    n: int,
    seed: int,
    padded: bool = False,
    icl: bool = False,
    lengths: tuple[int, int] | None = None,
) -> tuple[list[tuple[list[int], list[int]]], list[dict]]:
    """``probe_rows`` and the samples behind them (for scoring greedy answers with the task's metric)."""
    mix = Mix(n, 1.0, bare=True, pad=padded, icl=1.0 if icl else 0.0)
    samples = stream.samples(task, n, seed, lengths)
    rng = random.Random(seed)
    rows = [stream.short_row(task, s, random_answer(task, s, rng), max_new_tokens(task), mix, icl) for s in samples]
    return rows, samples


def find_rows(
    stream: RowStream, n: int, seed: int, full: bool, padded: bool, task: str = LOOKUP
) -> list[tuple[list[int], list[int]]]:
    """``n`` fresh rows of a training-only ``task`` (``stream.AUX_TASKS``; ``RowStream.lookup_row``), short or
    ``full``, drawn from held-out copy samples."""
    return aux_rows_and_samples(stream, n, seed, full, padded, task)[0]


def aux_rows_and_samples(
    stream: RowStream,
    n: int,
    seed: int,
    full: bool,
    padded: bool,
    task: str = LOOKUP,
    lengths: tuple[int, int] | None = None,
) -> tuple[list[tuple[list[int], list[int]]], list[dict]]:
    """``find_rows`` and the copy samples behind them; ``lengths`` (lo, hi) sets the people per list."""
    mix = Mix(n, 1.0, bare=True, pad=padded)
    rng = random.Random(seed)
    gen_length = max_new_tokens("waiting_line/copy")
    samples = stream.samples("waiting_line/copy", n, seed, lengths)
    return [stream.lookup_row(s, gen_length, mix, full, rng, task=task) for s in samples], samples


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="checkpoint directory (a run's export/) or demo name")
    ap.add_argument("--parallelbench", default="/work/shared/data/parallelbench")
    ap.add_argument("--tasks", nargs="*", default=["waiting_line/copy", "waiting_line/reverse"])
    ap.add_argument("--n", type=int, default=12, help="short rows per task")
    ap.add_argument("--full", type=int, default=0, help="also score N official-format held-out samples per task")
    ap.add_argument("--seed", type=int, default=99)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--padded", action="store_true", help="answers padded with EOS to the task's gen length")
    ap.add_argument("--icl", action="store_true", help="each row shows its in-context example and answer first")
    ap.add_argument("--find", type=int, default=0, help="also read look-up on N short and N full find rows")
    ap.add_argument("--exclude", type=int, default=0, help="also read exclusion on N short and N full exclude rows")
    ap.add_argument("--missing", type=int, default=0, help="also read exclusion on N short and N full missing rows")
    ap.add_argument(
        "--missing-first", type=int, default=0, help="the same on missing_first rows (first names only, one token each)"
    )
    ap.add_argument("--last", type=int, default=0, help="the look-up on N last rows (one last name by its first name)")
    ap.add_argument(
        "--next", type=int, default=0, help="the same on N next rows (the answer begun: '[\"Cy' -> ' Fox\"]')"
    )
    ap.add_argument("--len", default=None, help="people per short-row list, LO-HI (a stage's len); default the task's")
    args = ap.parse_args(argv)
    lengths = list_lengths(args.len, "--len") if args.len else None
    unknown = sorted(set(args.tasks) - set(TASKS))
    if unknown:
        raise SystemExit(f"--tasks: unknown {unknown}; choose from {list(TASKS)}")
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    model, tok = dlm_decode.load_model(args.model)
    model.eval()
    skip = set(tok.convert_tokens_to_ids([t for t in STRUCTURE if t in tok.get_vocab()]))
    stream = RowStream(args.parallelbench, tok, seed=0)
    result: dict = {"model": str(args.model), "padded": args.padded, "icl": args.icl, "tf": {}, "exact": {}}
    if lengths:
        result["len"] = list(lengths)
    training = Path(args.model) / "training.json"
    if training.is_file():
        result["step"] = json.loads(training.read_text())["step"]
    continuation = {i for t, i in tok.get_vocab().items() if t.startswith("\u0120")}  # last-name tokens
    for task in args.tasks:
        rows, samples = probe_rows_and_samples(stream, task, args.n, args.seed, args.padded, args.icl, lengths)
        result["tf"][task] = round(teacher_forced(model, rows, model.mask_token_id, skip), 3)
        result["exact"][task] = round(greedy_exact(model, tok, rows, task, samples), 3)
    if args.full:
        from scoring import score_task  # noqa: PLC0415  (pulls in the metrics only when asked)

        samples = heldout(args.parallelbench, args.seed, args.full, official_keys(args.parallelbench))
        items = eval_items({t: samples[t] for t in args.tasks}, args.parallelbench, short=False)
        result["full"] = {t: round(score_task(model, tok, t, *item)["score"], 1) for t, item in items.items()}
        result["full_tf"] = {
            t: teacher_forced_parts(
                model, full_rows(stream, t, samples[t], args.seed), model.mask_token_id, skip, continuation
            )
            for t in args.tasks
        }
    for name, n, task in (
        ("find", args.find, LOOKUP),
        ("exclude", args.exclude, EXCLUDE),
        ("missing", args.missing, MISSING),
        ("missing_first", args.missing_first, MISSING_FIRST),
        ("last", args.last, LAST),
        ("next", args.next, NEXT),
    ):
        if not n:
            continue
        result[name] = {}
        for kind in ("short", "full"):
            rows = find_rows(stream, n, args.seed, kind == "full", args.padded, task)
            parts = teacher_forced_parts(model, rows, model.mask_token_id, skip, continuation)
            result[name][kind] = {"tf": parts, "exact": round(greedy_exact(model, tok, rows), 3)}
    result["seconds"] = round(time.perf_counter() - start, 1)
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    from dlm_decode.cli import run_script

    run_script(main, "train_demo/probe.py")
