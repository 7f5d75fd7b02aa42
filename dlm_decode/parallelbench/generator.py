"""Regenerate ParallelBench tasks (waiting line, latin square, 4x4 sudoku) for any seed.

:func:`generate_task` returns samples in the official jsonl schema (``input`` with
``icl_examples``, ``answer``, ``output_format`` where the official files have it, ``metadata``), drawn
from ``random.Random(seed)``, so a seed always gives the same samples. :func:`random_answer` draws
one correct answer (uniformly among the valid ones for the random-output tasks), and
:func:`sample_key` gives a hashable identity of a sample's input, to keep generated training data
apart from the official test samples.

**Waiting line** -- follows the official generator (``task_generators.py`` / ``task.py`` /
``task_utils.py`` of furiosa-ai/ParallelBench). Three details differ from the current public code
and were recovered from the official test files instead (the public code cannot reproduce them):

* a list is redrawn (same length) until no first name and no last name repeats within it;
* positions are 0-based everywhere and the prompt's ``index`` is that 0-based position: insert at
  ``rng.randint(0, length)``, remove/replace at ``rng.randint(0, length - 1)`` (the public code now
  uses 1..length for ``insert_index`` and 1-based prompt positions for remove/replace);
* shuffle's example answer reshuffles a copy until it differs from the input (no short-list guard).

The rest is as in the official code:

* the pool of people is every ``first + " " + last`` pair of the names file (first-name major order,
  duplicated last names kept, as ``itertools.product`` builds it); a list's length is
  ``rng.randint(min_length, max_length)`` and its people are ``rng.sample(pool, length)``;
* the new person of insert/replace tasks is ``rng.choice`` over the pool minus the list, drawn before
  the position (it may share a first or last name with someone in the list);
* sort sorts the full names as strings, i.e. by first name, although the prompt says "by last name";
* the ``*_random`` tasks store ``{"input": list, ("word": new person,) "example": one valid answer}``
  as their answer; copy, shuffle and the insert/replace tasks carry an ``output_format`` of
  ``[MASK]`` items, the others do not;
* with ``samples_per_length``, samples come from one endless stream and are kept per length until
  every length has its share; the output is ordered by length;
* the in-context examples are then drawn from the same rng and generator, one batch of
  ``num_samples`` (here ``n``) per example slot, and example ``i`` of each slot goes to sample ``i``;
* the seed in an official ``task_config.yaml`` is already the final one (the official tool hashes the
  task name into its base seed before writing the config) and is used as ``random.Random(seed)``.

With the official seeds this reproduces the ten official waiting-line files and the latin-square file
exactly: same samples, same in-context examples, same order, and the same bytes when each sample is
written with ``json.dumps(sample, separators=(",", ":"))`` (the test suite checks it). The sudoku
file is not reproduced (see below).

**Latin square** -- official algorithm: symbols are ``rng.sample`` of A-Z and 0-9; the square is the
cyclic square of those symbols with its rows and then its columns shuffled.

**Sudoku** -- the official ``sudoku_n4_12`` file was not made by the public generator (it has no seed
and uses ``0`` for blanks), so this is our own generator with the same format and statistics: a full
4x4 grid from randomized backtracking, ``16 - givens`` blanks written as ``0`` (12 givens for
``sudoku_n4_12``), redrawn until the puzzle has exactly one solution, no repeated puzzle and (while
there are enough grids, i.e. up to 288 samples) no repeated solution, ``metadata = {"length":
givens}``, and as its in-context example another puzzle of the same set, as in the official file.

Deliberate differences: ``n`` may be any count (lengths get equal shares, the first lengths one more
when it does not divide), and ``exclude`` / ``unique`` can skip samples (these options are off by
default and leave the official stream untouched when unused).
"""

from __future__ import annotations

import itertools
import json
import random
import re
from collections.abc import Collection, Hashable, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from dlm_decode.parallelbench.tasks import task_kind, task_op

__all__ = [
    "WAITING_LINE_OPS",
    "full_names",
    "generate_task",
    "is_valid_sudoku_solution",
    "list_to_str",
    "load_names",
    "random_answer",
    "sample_key",
    "sudoku_solutions",
    "valid_answers",
]

WAITING_LINE_OPS = (
    "copy",
    "insert_index",
    "insert_random",
    "remove_index",
    "remove_random",
    "replace_index",
    "replace_random",
    "reverse",
    "shuffle",
    "sort",
)
MASK = "[MASK]"
#: Size of the official sudoku_n4_12 file (its config has no num_samples).
OFFICIAL_SUDOKU_SAMPLES = 108
LATIN_SYMBOLS = [chr(c) for c in range(ord("A"), ord("Z") + 1)] + [str(d) for d in range(10)]


# --------------------------------------------------------------------------------------- helpers


def list_to_str(items: Sequence[Any]) -> str:
    """``["A", "B"]`` written the benchmark's way: ``'["A", "B"]'``."""
    return "[" + ", ".join(f'"{item}"' for item in items) + "]"


def load_names(path: str | Path) -> list[list[str]]:
    """Read a names file (YAML ``[first_names, last_names]``)."""
    with open(path, encoding="utf-8") as f:
        names = yaml.safe_load(f)
    _check_names(names)
    return names


def _check_names(names: Any) -> None:
    if (
        not isinstance(names, Sequence)
        or len(names) != 2
        or not all(isinstance(part, Sequence) and not isinstance(part, str) and part for part in names)
    ):
        raise ValueError("names must be [first_names, last_names], two non-empty lists of strings")


def full_names(names: Sequence[Sequence[str]]) -> list[str]:
    """Every ``first last`` combination, first-name major, duplicates kept (the official pool)."""
    _check_names(names)
    first, last = names
    return [f"{a} {b}" for a, b in itertools.product(first, last)]


def _split_name(full: str) -> tuple[str, str]:
    first, _, last = full.partition(" ")
    return first, last


def _distinct_people(people: Sequence[str]) -> bool:
    firsts, lasts = zip(*(_split_name(p) for p in people), strict=True)
    return len(set(firsts)) == len(people) and len(set(lasts)) == len(people)


def _draw_people(rng: random.Random, pool: Sequence[str], length: int) -> list[str]:
    for _ in range(100_000):
        people = rng.sample(pool, length)
        if _distinct_people(people):
            return people
    raise ValueError(f"cannot draw {length} people with distinct first and last names from the pool")


class _Pool(Sequence):
    """The official pool of people, with a fast "pool minus these people" view for ``rng.choice``."""

    def __init__(self, people: list[str]):
        self.people = people
        self.positions: dict[str, list[int]] = {}
        for i, person in enumerate(people):
            self.positions.setdefault(person, []).append(i)

    def __len__(self) -> int:
        return len(self.people)

    def __getitem__(self, index):
        return self.people[index]

    def without(self, people: Sequence[str]) -> _PoolView:
        skipped = sorted({i for person in set(people) for i in self.positions.get(person, ())})
        return _PoolView(self.people, skipped)


class _PoolView(Sequence):
    """``[p for p in pool if p not in people]`` without building the list (same order, same length)."""

    def __init__(self, people: list[str], skipped: list[int]):
        self.people, self.skipped = people, skipped

    def __len__(self) -> int:
        return len(self.people) - len(self.skipped)

    def __getitem__(self, index):
        if not 0 <= index < len(self):
            raise IndexError(index)
        for position in self.skipped:
            if position <= index:
                index += 1
            else:
                break
        return self.people[index]


@cache
def _pool(first: tuple[str, ...], last: tuple[str, ...]) -> _Pool:
    """The pool of a names list, built once (it is read-only; training streams call generate_task every step)."""
    return _Pool(full_names([list(first), list(last)]))


def _mask_template(length: int) -> str:
    return list_to_str([MASK] * length)


def sample_key(sample: Mapping[str, Any]) -> Hashable:
    """Hashable identity of a sample's input (everything but its in-context examples)."""
    values = {k: v for k, v in sample["input"].items() if k != "icl_examples"}
    return json.dumps(values, sort_keys=True, ensure_ascii=False)


# ---------------------------------------------------------------------------------- waiting line


def _waiting_line_sample(rng: random.Random, op: str, people: list[str], pool: _Pool) -> dict:
    length = len(people)
    context = list_to_str(people)
    if op in ("copy", "reverse", "sort"):
        target = {"copy": people, "reverse": people[::-1], "sort": sorted(people)}[op]
        sample: dict[str, Any] = {"input": {"context": context}, "answer": list_to_str(target)}
        if op == "copy":
            sample["output_format"] = _mask_template(length)
        sample["metadata"] = {"length": length}
        return sample
    if op == "shuffle":
        if len(set(people)) < 2:
            raise ValueError("shuffle needs lists of at least two people (set min_length >= 2)")
        shuffled = list(people)
        while shuffled == people:
            rng.shuffle(shuffled)
        return {
            "input": {"context": context},
            "answer": {"input": list(people), "example": list_to_str(shuffled)},
            "output_format": _mask_template(length),
            "metadata": {"length": length},
        }
    action, _, mode = op.partition("_")
    random_position = mode == "random"
    if action in ("insert", "replace"):
        word = rng.choice(pool.without(people))
    if action == "insert":
        index = rng.randint(0, length)
        target = people[:index] + [word] + people[index:]
    elif action == "remove":
        index = rng.randint(0, length - 1)
        target = people[:index] + people[index + 1 :]
    else:
        index = rng.randint(0, length - 1)
        target = people[:index] + [word] + people[index + 1 :]
    sample_input: dict[str, Any] = {"context": context}
    if action != "remove":
        sample_input["word"] = word
    if random_position:
        answer: Any = {"input": list(people)}
        if action != "remove":
            answer["word"] = word
        answer["example"] = list_to_str(target)
    else:
        sample_input["index"] = index
        answer = list_to_str(target)
    sample = {"input": sample_input, "answer": answer}
    if action != "remove":
        sample["output_format"] = _mask_template(len(target))
    metadata: dict[str, Any] = {"length": length, "index": None if random_position else index}
    if action != "remove":
        metadata["word"] = word
    sample["metadata"] = metadata
    return sample


def _waiting_line_stream(rng: random.Random, op: str, config: Mapping[str, Any], pool: _Pool):
    lo, hi = int(config.get("min_length", 3)), int(config.get("max_length", 6))
    if not 1 <= lo <= hi:
        raise ValueError(f"bad list lengths min_length={lo}, max_length={hi}")
    while True:
        length = rng.randint(lo, hi)
        yield _waiting_line_sample(rng, op, _draw_people(rng, pool, length), pool)


# ----------------------------------------------------------------------------------- latin square


def _cyclic_latin_square(rng: random.Random, symbols: list[str]) -> list[list[str]]:
    size = len(symbols)
    rows = [symbols[i:] + symbols[:i] for i in range(size)]
    rng.shuffle(rows)
    columns = [list(col) for col in zip(*rows, strict=True)]
    rng.shuffle(columns)
    return [list(row) for row in zip(*columns, strict=True)]


def _square_to_csv(square: Sequence[Sequence[str]]) -> str:
    return "\n".join(",".join(str(cell) for cell in row) for row in square)


def _latin_square_stream(rng: random.Random, config: Mapping[str, Any]):
    size = int(config.get("size", 4))
    if not 1 <= size <= len(LATIN_SYMBOLS):
        raise ValueError(f"bad latin square size {size}")
    while True:
        symbols = rng.sample(LATIN_SYMBOLS, size)
        square = _cyclic_latin_square(rng, symbols)
        yield {
            "input": {"size": size, "symbols": "[" + ", ".join(symbols) + "]"},
            "answer": {"symbols": symbols, "example": _square_to_csv(square)},
            "metadata": {"length": size},
        }


@cache
def _all_latin_squares(size: int) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """Every Latin square over 0..size-1 (used for size <= 4: 1, 2, 12 and 576 squares)."""
    squares: list[tuple[tuple[int, ...], ...]] = []
    perms = list(itertools.permutations(range(size)))

    def extend(rows: list[tuple[int, ...]]) -> None:
        if len(rows) == size:
            squares.append(tuple(rows))
            return
        for perm in perms:
            if all(perm[c] != row[c] for row in rows for c in range(size)):
                extend(rows + [perm])

    extend([])
    return tuple(squares)


def _random_latin_square(rng: random.Random, symbols: Sequence[str]) -> list[list[str]]:
    size = len(symbols)
    if size <= 4:
        square = rng.choice(_all_latin_squares(size))
        return [[symbols[i] for i in row] for row in square]
    # larger sizes: randomized backtracking, cell by cell
    grid = [[-1] * size for _ in range(size)]

    def fill(pos: int) -> bool:
        if pos == size * size:
            return True
        r, c = divmod(pos, size)
        options = [v for v in range(size) if v not in grid[r] and all(grid[i][c] != v for i in range(r))]
        rng.shuffle(options)
        for v in options:
            grid[r][c] = v
            if fill(pos + 1):
                return True
        grid[r][c] = -1
        return False

    fill(0)
    return [[symbols[i] for i in row] for row in grid]


# ----------------------------------------------------------------------------------------- sudoku


def _box(size: int) -> int:
    box = int(round(size**0.5))
    if box * box != size:
        raise ValueError(f"sudoku size must be a perfect square, got {size}")
    return box


def _allowed(grid: list[list[int]], r: int, c: int, v: int, box: int) -> bool:
    size = len(grid)
    if v in grid[r] or any(grid[i][c] == v for i in range(size)):
        return False
    br, bc = r - r % box, c - c % box
    return all(grid[i][j] != v for i in range(br, br + box) for j in range(bc, bc + box))


def _random_full_grid(rng: random.Random, size: int) -> list[list[int]]:
    box = _box(size)
    grid = [[0] * size for _ in range(size)]

    def fill(pos: int) -> bool:
        if pos == size * size:
            return True
        r, c = divmod(pos, size)
        digits = list(range(1, size + 1))
        rng.shuffle(digits)
        for v in digits:
            if _allowed(grid, r, c, v, box):
                grid[r][c] = v
                if fill(pos + 1):
                    return True
                grid[r][c] = 0
        return False

    fill(0)
    return grid


def sudoku_solutions(puzzle: str | Sequence[Sequence[int]], limit: int = 2) -> list[list[list[int]]]:
    """Up to ``limit`` solutions of a puzzle (digit lines with ``0`` for blanks)."""
    if isinstance(puzzle, str):
        grid = [[int(ch) for ch in line.strip()] for line in puzzle.strip().split("\n")]
    else:
        grid = [list(row) for row in puzzle]
    size = len(grid)
    box = _box(size)
    found: list[list[list[int]]] = []

    def solve() -> None:
        for r in range(size):
            for c in range(size):
                if grid[r][c] == 0:
                    for v in range(1, size + 1):
                        if _allowed(grid, r, c, v, box):
                            grid[r][c] = v
                            solve()
                            grid[r][c] = 0
                            if len(found) >= limit:
                                return
                    return
        found.append([row[:] for row in grid])

    solve()
    return found


def is_valid_sudoku_solution(text: str, size: int = 4) -> bool:
    """Whether ``text`` is a complete, valid ``size`` x ``size`` sudoku grid (digit lines)."""
    lines = text.strip().split("\n")
    if len(lines) != size or any(len(line) != size or not line.isdigit() for line in lines):
        return False
    grid = [[int(ch) for ch in line] for line in lines]
    digits = set(range(1, size + 1))
    box = _box(size)
    boxes = [
        {grid[i][j] for i in range(br, br + box) for j in range(bc, bc + box)}
        for br in range(0, size, box)
        for bc in range(0, size, box)
    ]
    return (
        all(set(row) == digits for row in grid)
        and all({grid[i][c] for i in range(size)} == digits for c in range(size))
        and all(b == digits for b in boxes)
    )


def _grid_text(grid: Sequence[Sequence[int]]) -> str:
    return "\n".join("".join(str(v) for v in row) for row in grid)


def _sudoku_shape(name: str, config: Mapping[str, Any]) -> tuple[int, int]:
    """(size, number of given cells) from the config or from a ``sudoku_n<size>_<givens>`` name."""
    match = re.search(r"sudoku_n(\d+)_(\d+)", name)
    size = int(config.get("size", match.group(1) if match else 4))
    if "num_holes" in config:
        givens = size * size - int(config["num_holes"])
    elif "num_givens" in config:
        givens = int(config["num_givens"])
    elif match:
        givens = int(match.group(2))
    else:
        raise ValueError(f"cannot tell the number of given cells of sudoku task {name!r}")
    if not 0 <= givens <= size * size:
        raise ValueError(f"bad number of givens {givens} for a {size}x{size} sudoku")
    return size, givens


def _sudoku_puzzle(rng: random.Random, size: int, givens: int) -> tuple[str, str]:
    cells = [(r, c) for r in range(size) for c in range(size)]
    for _ in range(1000):
        grid = _random_full_grid(rng, size)
        for _ in range(50):
            puzzle = [row[:] for row in grid]
            for r, c in rng.sample(cells, size * size - givens):
                puzzle[r][c] = 0
            if len(sudoku_solutions(puzzle, limit=2)) == 1:
                return _grid_text(puzzle), _grid_text(grid)
    raise ValueError(f"cannot make a {size}x{size} sudoku with {givens} givens and a unique solution")


def _generate_sudoku(
    rng: random.Random, name: str, config: Mapping[str, Any], n: int, exclude: Collection[Hashable]
) -> list[dict]:
    size, givens = _sudoku_shape(name, config)
    distinct_solutions = n <= (288 if size == 4 else n)
    puzzles: list[tuple[str, str]] = []
    seen_puzzles: set[str] = set()
    seen_solutions: set[str] = set()
    attempts = 0
    while len(puzzles) < n + (1 if n == 1 else 0):
        attempts += 1
        if attempts > 1000 * (n + 10):
            raise ValueError(f"cannot draw {n} distinct sudoku puzzles for {name!r}")
        puzzle, solution = _sudoku_puzzle(rng, size, givens)
        if puzzle in seen_puzzles or (distinct_solutions and solution in seen_solutions):
            continue
        if len(puzzles) < n and sample_key({"input": {"sudoku": puzzle}}) in exclude:
            continue
        seen_puzzles.add(puzzle)
        seen_solutions.add(solution)
        puzzles.append((puzzle, solution))
    samples = []
    for i in range(n):
        j = rng.randrange(len(puzzles) - 1)  # any other puzzle of the set
        j += j >= i
        example = {"input": {"sudoku": puzzles[j][0]}, "answer": puzzles[j][1]}
        samples.append(
            {
                "input": {"sudoku": puzzles[i][0], "icl_examples": [example]},
                "answer": puzzles[i][1],
                "metadata": {"length": givens},
            }
        )
    return samples


# ------------------------------------------------------------------------------------ generation


def _bucket_targets(config: Mapping[str, Any], kind: str, n: int) -> list[tuple[int, int]] | None:
    """(length, count) per bucket, or None when samples are taken as they come."""
    if not config.get("samples_per_length"):
        return None
    if kind == "waiting_line":
        lengths = list(range(int(config.get("min_length", 3)), int(config.get("max_length", 6)) + 1))
    else:
        lengths = [int(config.get("size", 4))]
    share, extra = divmod(n, len(lengths))
    return [(length, share + (1 if i < extra else 0)) for i, length in enumerate(lengths)]


def _take(stream, n: int, targets, exclude: Collection[Hashable], unique: bool) -> list[dict]:
    seen: set[Hashable] = set()
    budget = 20 * (n + 100)  # draws before giving up (e.g. unique=True on a too-small name pool)

    def draw() -> dict:
        nonlocal budget
        budget -= 1
        if budget < 0:
            raise ValueError(f"could not draw {n} samples that pass the exclude/unique filters")
        return next(stream)

    def wanted(sample: dict) -> bool:
        key = sample_key(sample)
        if key in exclude or (unique and key in seen):
            return False
        seen.add(key)
        return True

    if targets is None:
        out = []
        while len(out) < n:
            sample = draw()
            if wanted(sample):
                out.append(sample)
        return out
    quota = dict(targets)
    buckets: dict[int, list[dict]] = {length: [] for length in quota}
    while any(len(buckets[length]) < count for length, count in quota.items()):
        sample = draw()
        length = sample["metadata"]["length"]
        if length in quota and len(buckets[length]) < quota[length] and wanted(sample):
            buckets[length].append(sample)
    return [sample for length, _ in targets for sample in buckets[length]]


def generate_task(
    name: str,
    config: Mapping[str, Any],
    names: Sequence[Sequence[str]] | None = None,
    n: int | None = None,
    seed: int | None = None,
    *,
    exclude: Collection[Hashable] = (),
    unique: bool = False,
) -> list[dict]:
    """Generate the samples of task ``name`` (``"waiting_line/<op>"``, ``"puzzle/latin_square_n4"``,
    ``"puzzle/sudoku_n4_12"``) from its official-style ``config``.

    ``names`` is ``[first_names, last_names]`` (needed for waiting-line tasks). ``n`` defaults to the
    config's ``num_samples`` (when absent: 108 for sudoku, like the official file, else 100) and
    ``seed`` to the config's ``seed``. Samples whose :func:`sample_key` is in ``exclude`` are skipped,
    and ``unique=True`` also skips repeats within the generated set (sudoku puzzles are always
    distinct). In-context examples are not filtered.
    """
    kind = task_kind(name)
    op = task_op(name)
    if seed is None:
        if "seed" not in config:
            raise ValueError(f"the config of {name!r} has no seed; pass seed=")
        seed = int(config["seed"])
    if n is None:
        default = OFFICIAL_SUDOKU_SAMPLES if op.startswith("sudoku") else 100
        n = int(config.get("num_samples", default))
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = random.Random(seed)
    exclude = exclude if isinstance(exclude, set | frozenset | dict) else set(exclude)

    if kind == "puzzle" and op.startswith("sudoku"):
        return _generate_sudoku(rng, name, config, n, exclude) if n else []

    if kind == "waiting_line":
        if op not in WAITING_LINE_OPS:
            raise ValueError(f"unknown waiting-line task {name!r}; known: {', '.join(WAITING_LINE_OPS)}")
        if names is None:
            raise ValueError("waiting-line tasks need names=[first_names, last_names]")
        _check_names(names)
        pool = _pool(tuple(names[0]), tuple(names[1]))

        def new_stream():
            return _waiting_line_stream(rng, op, config, pool)
    elif kind == "puzzle" and op.startswith("latin_square"):

        def new_stream():
            return _latin_square_stream(rng, config)
    else:
        raise ValueError(f"no generator for ParallelBench task {name!r}")

    samples = _take(new_stream(), n, _bucket_targets(config, kind, n), exclude, unique)
    slots = int(config.get("icl_example_count", 0))
    # Each example slot draws as many examples as the official num_samples (n here) from a fresh
    # generator on the same rng; sample i takes example i of every slot.
    examples = [_take(new_stream(), n, None, (), False) for _ in range(slots)]
    for i, sample in enumerate(samples):
        if slots:
            sample["input"]["icl_examples"] = [slot[i] for slot in examples]
        _move_last(sample)
    return samples


def _move_last(sample: dict) -> None:
    """Put ``icl_examples`` last in ``input`` and keep the official top-level key order."""
    order = ["input", "answer", "output_format", "metadata"]
    items = {k: sample.pop(k) for k in order if k in sample}
    sample.update(items)


# ---------------------------------------------------------------------------------------- answers


def random_answer(name: str, sample: Mapping[str, Any], rng: random.Random) -> str:
    """One correct answer text for ``sample``.

    For the random-output tasks (shuffle, insert/remove/replace_random, latin square) it is drawn
    uniformly among all valid answers (shuffle: any order but the original one; latin square: any
    Latin square over the symbols), so training targets keep the task's real diversity; for the
    deterministic tasks it is the unique reference answer.
    """
    kind = task_kind(name)
    op = task_op(name)
    answer = sample["answer"]
    if kind == "text":
        raise ValueError(f"{name!r} is an open-ended text task; it has no checkable answer to draw")
    if kind == "puzzle":
        if op.startswith("sudoku"):
            return answer
        if op.startswith("latin_square"):
            return _square_to_csv(_random_latin_square(rng, [str(s) for s in answer["symbols"]]))
        raise ValueError(f"unknown puzzle task {name!r}")
    if isinstance(answer, str):
        return answer
    people = list(answer["input"])
    if op == "shuffle":
        if len(set(people)) < 2:
            raise ValueError("a list needs two different people to be shuffled into a new order")
        shuffled = list(people)
        while shuffled == people:
            rng.shuffle(shuffled)
        return list_to_str(shuffled)
    if op == "insert_random":
        index = rng.randint(0, len(people))
        return list_to_str(people[:index] + [answer["word"]] + people[index:])
    if op == "remove_random":
        index = rng.randrange(len(people))
        return list_to_str(people[:index] + people[index + 1 :])
    if op == "replace_random":
        index = rng.randrange(len(people))
        return list_to_str(people[:index] + [answer["word"]] + people[index + 1 :])
    raise ValueError(f"cannot draw an answer for task {name!r}")


def valid_answers(name: str, sample: Mapping[str, Any]) -> list[str]:
    """Every correct answer text of a waiting-line ``sample``, in a fixed order: the reference answer alone for a
    deterministic task; shuffle's every order but the original (``n! - 1``, at most 719 on the official lengths of
    3-6); insert_random's ``n + 1`` places; remove_random's and replace_random's ``n`` slots (a slot holding the same
    person as another gives the same text once). Puzzles and text tasks are a ValueError (a latin square has too many
    answers to list, a sudoku one)."""
    if task_kind(name) != "waiting_line":
        raise ValueError(f"valid_answers lists waiting-line answers only, not {name!r}")
    op, answer = task_op(name), sample["answer"]
    if isinstance(answer, str):
        return [answer]
    people = list(answer["input"])
    if op == "shuffle":
        lists = [list(p) for p in itertools.permutations(people) if list(p) != people]
    elif op == "insert_random":
        lists = [people[:i] + [answer["word"]] + people[i:] for i in range(len(people) + 1)]
    elif op == "remove_random":
        lists = [people[:i] + people[i + 1 :] for i in range(len(people))]
    elif op == "replace_random":
        lists = [people[:i] + [answer["word"]] + people[i + 1 :] for i in range(len(people))]
    else:
        raise ValueError(f"cannot list the answers of task {name!r}")
    return list(dict.fromkeys(list_to_str(x) for x in lists))
