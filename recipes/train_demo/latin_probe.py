"""Where does a demo model's latin square go wrong? Rows, columns and the exclusion at each density, one JSON line out.

    python recipes/train_demo/latin_probe.py RUN/export [--n 32] [--masked 1,4,8,12,16]

On ``--n`` fresh-seed official-format latin-square samples (``stream.heldout``; never an official test sample):

* ``decoded``: one token per step (``low_confidence``, steps = gen length, as the benchmark's baseline) and, of the
  decoded squares, the share that are valid latin squares (the task's metric), the share of their rows and of their
  columns that hold each prompt symbol once, and the share of cells holding a symbol the prompt does not list.
  The twentieth round's model wrote one symbol sixteen times (rows 0, columns 0); a model that has the row rule and
  not the column one shows rows near 1 and columns lower.
* ``allowed[k]``: teacher-forced on a drawn valid square with ``k`` of its 16 cells masked (the rest visible, as the
  canvas is after 16 - k decoding steps): the share of masked cells whose argmax is a symbol that no visible cell of
  its row or column already holds. ``k = 1`` is the single-cell look-up (one symbol fits); large ``k`` is the start of
  a decode, where any symbol the visible cells allow is right.
* ``row_rule`` / ``column_rule``: the same reading with one whole column masked (each cell then the one symbol its row
  lacks) or one whole row masked (each cell the one symbol its column lacks): which of the two rules the model has.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from stream import LATIN, RowStream, eval_items, heldout, official_keys  # noqa: E402

import dlm_decode  # noqa: E402
from dlm_decode.parallelbench.generator import random_answer  # noqa: E402
from dlm_decode.parallelbench.metrics import latin_square_score  # noqa: E402
from dlm_decode.parallelbench.tasks import build_messages, max_new_tokens  # noqa: E402

SIZE = 4


def parse_square(text: str) -> list[list[str]] | None:
    """The decoded CSV as a 4 x 4 grid of stripped cells, None when it is not 4 rows of 4 cells."""
    rows = [[c.strip() for c in line.split(",")] for line in text.strip().splitlines() if line.strip()]
    if len(rows) != SIZE or any(len(r) != SIZE for r in rows):
        return None
    return rows


def square_stats(texts: list[str], symbols: list[list[str]]) -> dict[str, float]:
    """Shares over the decoded texts: well-formed 4 x 4 grids, valid squares (the task's own metric,
    ``latin_square_score``), and of the well-formed grids the rows and columns holding each symbol once and the cells
    outside the symbol set."""
    formed = [(sq, sorted(sy)) for t, sy in zip(texts, symbols, strict=True) if (sq := parse_square(t)) is not None]
    rows = [sorted(r) == sy for sq, sy in formed for r in sq]
    cols = [sorted(c) == sy for sq, sy in formed for c in zip(*sq, strict=True)]
    foreign = [cell not in sy for sq, sy in formed for r in sq for cell in r]
    valid = [latin_square_score(t, {"symbols": sy}) for t, sy in zip(texts, symbols, strict=True)]

    def share(flags: list[bool]) -> float:
        return round(sum(flags) / len(flags), 3) if flags else 0.0

    return {
        "formed": round(len(formed) / max(len(texts), 1), 3),
        "valid": round(sum(valid) / max(len(texts), 1), 3),
        "rows": share(rows),
        "columns": share(cols),
        "foreign_cells": share(foreign),
    }


def random_cells(k: int) -> Callable[[random.Random], list[int]]:
    """``k`` cells drawn at random (row-major indices 0..15)."""
    return lambda rng: rng.sample(range(SIZE * SIZE), k)


def one_column(rng: random.Random) -> list[int]:
    """A whole column, drawn: each of its cells is fixed by the rest of its row."""
    c = rng.randrange(SIZE)
    return [r * SIZE + c for r in range(SIZE)]


def one_row(rng: random.Random) -> list[int]:
    """A whole row, drawn: each of its cells is fixed by the rest of its column."""
    r = rng.randrange(SIZE)
    return [r * SIZE + c for c in range(SIZE)]


@torch.no_grad()
def allowed_share(
    model: Any,
    tok: Any,
    stream: RowStream,
    samples: list[dict],
    pick: Callable[[random.Random], list[int]],
    seed: int,
) -> float:
    """Share of the masked cells (``pick``: the cells of a drawn valid square to mask, the others visible) whose
    argmax symbol no visible cell of the same row or column holds."""
    rng = random.Random(seed)
    hits, total = 0, 0
    for s in samples:
        square = random_answer(LATIN, s, rng)
        prompt, resp = stream.encode(build_messages(stream.configs[LATIN], s), square, max_new_tokens(LATIN))
        cells = [r.split(",") for r in square.split("\n")]
        # the response's symbol tokens in reading order: every other token of a row ("H , 4 , A , C \n")
        slots = [len(prompt) + 8 * r + 2 * c for r in range(SIZE) for c in range(SIZE)]
        if tok.decode([(prompt + resp)[slots[5]]]).strip() != cells[1][1]:
            raise SystemExit(f"{LATIN}: a symbol is not one token in this tokenizer; this probe needs one")
        masked = pick(rng)
        ids = torch.tensor([prompt + resp])  # [1, T]
        ids[0, [slots[i] for i in masked]] = model.mask_token_id
        shift = getattr(model, "logit_shift", 0)  # Dream scores slot i from the logits at i - 1
        logits = model(ids).logits[0]  # [T, V]
        hidden = set(masked)
        for i in masked:
            r, c = divmod(i, SIZE)
            seen = {cells[r][j] for j in range(SIZE) if r * SIZE + j not in hidden}
            seen |= {cells[j][c] for j in range(SIZE) if j * SIZE + c not in hidden}
            guess = tok.decode([int(logits[slots[i] - shift].argmax())]).strip()
            hits += guess in set(s["answer"]["symbols"]) - seen
            total += 1
    return round(hits / max(total, 1), 3)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="checkpoint directory (a run's export/) or demo name")
    ap.add_argument("--parallelbench", default="/work/shared/data/parallelbench")
    ap.add_argument("--n", type=int, default=32, help="fresh-seed samples")
    ap.add_argument("--masked", default="1,4,8,12,16", help="masked-cell counts for the allowed-symbol reading")
    ap.add_argument("--seed", type=int, default=99)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    try:
        masked = [int(k) for k in args.masked.split(",")]
    except ValueError:
        masked = [0]
    if not masked or not all(1 <= k <= SIZE * SIZE for k in masked):
        raise SystemExit(f"--masked: comma-separated counts in 1..{SIZE * SIZE}, got {args.masked!r}")
    if args.n < 1:
        raise SystemExit(f"--n must be >= 1, got {args.n}")
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    model, tok = dlm_decode.load_model(args.model)
    model.eval()
    stream = RowStream(args.parallelbench, tok, seed=0)
    samples = heldout(args.parallelbench, args.seed, args.n, official_keys(args.parallelbench))[LATIN]
    chats, _, gen_length = eval_items({LATIN: samples}, args.parallelbench, short=False)[LATIN]
    out = dlm_decode.generate(
        model, chats, tokenizer=tok, chat=True, sampler="low_confidence", gen_length=gen_length, steps=gen_length
    )
    result: dict = {"model": str(args.model), "n": len(samples)}
    training = Path(args.model) / "training.json"
    if training.is_file():
        result["step"] = json.loads(training.read_text())["step"]
    texts = [t or "" for t in out.texts]
    result["decoded"] = square_stats(texts, [[str(x) for x in s["answer"]["symbols"]] for s in samples])
    result["allowed"] = {
        str(k): allowed_share(model, tok, stream, samples, random_cells(k), args.seed * 31 + k) for k in masked
    }
    result["row_rule"] = allowed_share(model, tok, stream, samples, one_column, args.seed)
    result["column_rule"] = allowed_share(model, tok, stream, samples, one_row, args.seed)
    result["seconds"] = round(time.perf_counter() - start, 1)
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    from dlm_decode.cli import run_script

    run_script(main, "train_demo/latin_probe.py")
