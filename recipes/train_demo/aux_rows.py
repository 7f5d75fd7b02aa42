"""The demo models' training-only row kinds: questions about a generated sample that no benchmark task asks, each a
skill the official tasks need in its simplest form. A stage takes them only when it names them (``stream.RowStream``
builds their rows: short, or as a chat; ``probe.py`` reads them back).

* **find rows** (``aux/find``, training only, when a stage names ``find``): ``find ["Cy", "Ann"] ["Ann Lee", "Bo
  Kim", "Cy Fox"]`` -> ``["Cy Fox", "Ann Lee"]``. Short, or as a full row: the official copy chat with the query as
  one more line of its last user turn. The demo models retrieve by position only (given a first name they cannot
  produce its last name when the position route fails: official reverse of 5-6 people, the operand of insert); these
  rows have no position route.
* **exclude rows** (``aux/exclude``, training only, when a stage names ``exclude``): ``remove ["Cy Fox", "Ann Lee"]
  ["Ann Lee", "Bo Kim", "Cy Fox"]`` -> ``["Bo Kim"]``: the list without the named people (1..n-1 people are left, in
  list order; the named ones in a random order). Short, or the official copy chat with the ``remove`` line appended.
  This is the skill the random-output tasks lack (ninth round, ``exclusion_probe.py``): which people of the list are
  not already written elsewhere, a comparison by content with no position route. ``aux/missing`` (``missing``): the
  same with exactly one person kept, the simplest form of the question (no counting of the survivors).
* **last rows** (``aux/last``, training only, when a stage names ``last``): ``last ["Cy"] ["Ann Lee", "Bo Kim", "Cy
  Fox"]`` -> `` Fox``: one person, asked for by a first name that is unique in the list, answered by the last name
  alone, as the list spells it after a first name (with its space: one token, the same token as in the list). The
  look-up of ``find`` reduced to one answer token (the form in which the comparison formed as ``missing_first``): the
  queried person sits anywhere in the list, so the token can only come from finding the first name and reading the
  token after it (seventeenth round: the random-output tasks' wrong answers are the right names paired wrong).
  ``aux/next`` (``next``): the same question with the answer begun: the prompt ends in ``["Cy`` and the answer is
  `` Fox"]``, so the slot to fill sits right after its first name, as a last name does on the canvas of a shuffle
  once its first name is written (the classic induction pattern: ... A B ... A -> B).
* **latin_fill rows** (``aux/latin_fill``, training only, when a stage names ``latin_fill``): ``latin [H, 4, C, A]``
  then a square with 1..16 cells blanked (``_``) -> the whole square; as a full row the official latin-square chat
  with the grid appended. The sudoku's form (givens in the prompt) for the one task whose official prompt gives
  none: with few blanks a cell is the one symbol of the prompt's list that its row and column lack, the exclusion
  the latin square needs at every step (twenty-first round: the twentieth round's model, trained on the official
  rows alone, put the right symbol in a single masked cell 25% of the time, chance).
* **sort_close rows** (``aux/sort_close``, training only, when a stage names ``sort_close``): sort rows (short, or
  the official sort chat) whose people's first names lie within a window of n..n+3 consecutive names of the
  alphabetical first-name list (``close_people``). The sort task orders people by first name; the shipped
  demo-llada's wrong sorts are valid permutations with pairs of near names inverted (rank distance 1: 12 of 24 such
  pairs inverted on the official file, chance; distance 10 or more: 1 of 686), and in random lists only ~3% of the
  pairs are that close. These rows make every comparison a close one (twenty-third round).
* **self rows** (``aux/self``, training only, when a stage names ``self`` and ``--self-rows`` gives their files): the
  model's own verified one-token-per-step answers to fresh official-format prompts (``self_rows.py``), as chats;
  like a variant they fill official slots, also under ``auxchat=0`` (twenty-fourth round).
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from typing import Any

from dlm_decode.parallelbench.generator import list_to_str

# training-only row kinds, never benchmark tasks; a stage takes them only when it names them
LOOKUP = "aux/find"
EXCLUDE = "aux/exclude"
MISSING = "aux/missing"
MISSING_FIRST = "aux/missing_first"
LAST = "aux/last"
NEXT = "aux/next"
LATIN_FILL = "aux/latin_fill"
LATIN_REST = "aux/latin_rest"
SORT_CLOSE = "aux/sort_close"
SELF = "aux/self"  # rows read from files of the model's own verified answers (self_rows.py), not generated here
AUX_TASKS = (LOOKUP, EXCLUDE, MISSING, MISSING_FIRST, LAST, NEXT, LATIN_FILL, LATIN_REST, SORT_CLOSE, SELF)
LATIN_TASKS = (LATIN_FILL, LATIN_REST)  # the training-only kinds asked about a latin-square sample
LOOKUP_SOURCE = "waiting_line/copy"  # a find row's people are those of a generated copy sample
LATIN = "puzzle/latin_square_n4"
BLANK = "_"  # a latin_fill row's empty cell (one token in the demo tokenizer, never a latin symbol)


def lookup_query(sample: Mapping[str, Any], rng: random.Random, one: bool = False) -> tuple[list[str], list[str]]:
    """A find row's query and answer: 1..n of the list's people (those whose first name is unique in it; exactly one
    with ``one``) in a random order, the query holding their first names only, the answer their full names. The order
    carries no position, so the only way to the last name is to find the first name in the list and read the token
    after it (induction)."""
    people = list(json.loads(sample["input"]["context"]))
    firsts = [p.split(" ", 1)[0] for p in people]
    unique = [p for p, f in zip(people, firsts, strict=True) if firsts.count(f) == 1] or people[:1]
    chosen = rng.sample(unique, 1 if one else rng.randint(1, len(unique)))
    return [p.split(" ", 1)[0] for p in chosen], chosen


def last_query(sample: Mapping[str, Any], rng: random.Random) -> tuple[list[str], list[str]]:
    """A last row's query and answer: one person whose first name is unique in the list, drawn uniformly, asked for
    by that first name and answered by the last name alone (one token in the demo tokenizer)."""
    first, last = lookup_query(sample, rng, one=True)
    return first, [last[0].split(" ", 1)[1]]


def exclude_query(
    sample: Mapping[str, Any], rng: random.Random, keep: int | None = None
) -> tuple[list[str], list[str]]:
    """An exclude row's named people and answer: ``keep`` (default 1..n-1 at random) of the list's people are kept
    (the answer, in list order), the others are named in a random order, so which entry survives depends on who is
    named, not where."""
    people = list(json.loads(sample["input"]["context"]))
    kept = set(rng.sample(range(len(people)), keep or rng.randint(1, max(len(people) - 1, 1))))
    named = [p for i, p in enumerate(people) if i not in kept]
    rng.shuffle(named)
    return named, [p for i, p in enumerate(people) if i in kept]


def missing_query(sample: Mapping[str, Any], rng: random.Random) -> tuple[list[str], list[str]]:
    """An exclude row with one person kept: the one person of the list that the line does not name. This is the
    exclusion probe's question (``exclusion_probe.py``) with the other people named in the prompt instead of on the
    canvas; one answer entry, so no counting of survivors is needed."""
    return exclude_query(sample, rng, keep=1)


def first_names_only(sample: Mapping[str, Any]) -> dict:
    """The sample with its list reduced to the people's distinct first names (one token each in the demo tokenizer):
    the ``missing_first`` rows ask the missing-person question over single-token items, the simplest form of the
    comparison by content (is this item among those named?)."""
    firsts = list(dict.fromkeys(p.split(" ", 1)[0] for p in json.loads(sample["input"]["context"])))
    return {**sample, "input": {**sample["input"], "context": list_to_str(firsts)}}


def _whole(sample: Mapping[str, Any]) -> Mapping[str, Any]:
    return sample


def _list_answer(query: Sequence[str], answer: Sequence[str]) -> tuple[str, str]:
    return "", list_to_str(answer)


def _last_name_answer(query: Sequence[str], answer: Sequence[str]) -> tuple[str, str]:
    return "", " " + answer[0]  # " Fox": the list's own token for a last name (without the space it is spelled apart)


def _next_name_answer(query: Sequence[str], answer: Sequence[str]) -> tuple[str, str]:
    return '["' + query[0], " " + answer[0] + '"]'  # the answer begun with the first name: '["Cy' + ' Fox"]'


def close_people(n: int, rng: random.Random, names: Sequence[Sequence[str]]) -> list[str]:
    """``n`` people (a random order) whose first names are ``n`` distinct names of a window of ``n``..``n + 3``
    consecutive names of the alphabetically sorted first names in ``names`` ([first names, last names]); last names
    drawn at random."""
    firsts = sorted(set(names[0]))
    if not 1 <= n <= len(firsts):
        raise ValueError(f"close_people: {n} people from {len(firsts)} first names")
    width = min(len(firsts), n + rng.randint(0, 3))
    start = rng.randrange(len(firsts) - width + 1)
    return [f"{first} {rng.choice(names[1])}" for first in rng.sample(firsts[start : start + width], n)]


def close_sort_sample(sample: Mapping[str, Any], rng: random.Random, names: Sequence[Sequence[str]]) -> dict:
    """A generated sort ``sample`` with its people replaced by ``close_people`` (as many), its answer their sorted
    list; the in-context examples stay."""
    people = close_people(len(json.loads(sample["input"]["context"])), rng, names)
    return {
        **sample,
        "input": {**sample["input"], "context": list_to_str(people)},
        "answer": list_to_str(sorted(people)),
    }


def latin_fill_grid(square: str, rng: random.Random) -> str:
    """A latin_fill row's partial square: ``square`` (CSV rows) with 1..all of its cells, drawn uniformly, replaced by
    ``BLANK``. Few blanks make a cell's symbol a pure exclusion (the one symbol its row and column lack, read against
    the prompt's symbol list); all blanks is the official task in the grid format."""
    rows = [row.split(",") for row in square.split("\n")]
    cells = [(r, c) for r in range(len(rows)) for c in range(len(rows[r]))]
    for r, c in rng.sample(cells, rng.randint(1, len(cells))):
        rows[r][c] = BLANK
    return "\n".join(",".join(row) for row in rows)


def latin_rest_split(square: str, rng: random.Random) -> tuple[str, str]:
    """A latin_rest row's (given start, answer): the first 1..3 rows of ``square`` (3 half of the time) with their
    newline, and the rows after them. With three rows given, each cell of the last row is the one symbol its column
    lacks: the column rule alone, at the canvas's own offsets (8 tokens a row), which the row rule cannot answer."""
    rows = square.split("\n")
    given = rng.choice((1, 2, 3, 3))
    return "\n".join(rows[:given]) + "\n", "\n".join(rows[given:])


# training-only kinds that are an official task's rows with other operands (its prompt, its rule): the task, and
# (its generated sample, rng, names) -> the variant's sample; they fill a full stage's official slots as that task's
# chat, also under auxchat=0
VARIANTS = {SORT_CLOSE: ("waiting_line/sort", close_sort_sample)}
# the training-only kinds whose rows are an official task's chat (the variants, and the model's own answers to
# official-format prompts): they may fill a full stage's official slots, also under auxchat=0
OFFICIAL_CHAT_KINDS = frozenset((*VARIANTS, SELF))

# the training-only row kinds: the sample they are asked about (sample -> sample), their query (sample, rng) ->
# (query list, answer list), the word of their line, and (query, answer) -> (the answer's given start, the text to
# fill in)
_AUX = {
    LOOKUP: (_whole, lookup_query, "find", _list_answer),
    EXCLUDE: (_whole, exclude_query, "remove", _list_answer),
    MISSING: (_whole, missing_query, "remove", _list_answer),
    MISSING_FIRST: (first_names_only, missing_query, "remove", _list_answer),
    LAST: (_whole, last_query, "last", _last_name_answer),
    NEXT: (_whole, last_query, "last", _next_name_answer),
}
