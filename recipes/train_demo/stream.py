"""The demo models' training rows, generated afresh for every step: short retrieval rows and full-template chats.

Two kinds of row, both drawn with ``dlm_decode.parallelbench.generator`` from the official task configs with seeds
that are functions of (run seed, step), so every batch is reproducible and a resumed run sees the same data:

* **short rows** (the retrieval pre-stage): the operation word, its operands and the bare list or grid, with no task
  template and no in-context turn, as the one user turn of the chat template::

      copy ["Ann Lee", "Bo Kim", "Cy Fox"]
      insert "Di Ray" at 2 ["Ann Lee", "Bo Kim", "Cy Fox"]
      replace 1 with "Di Ray" ["Ann Lee", "Bo Kim", "Cy Fox"]
      latin [H, 4, C, A]
      sudoku
      0042
      ...

  In-context retrieval (find the list in the prompt, write it back transformed) forms on these rows within a few
  hundred steps at batch >= 128, where the full prompts (115-240 tokens) sat on a loss plateau for thousands.
  With a stage's ``gap=G`` each short row ends in 0..G filler words (a span of its own task's official template,
  so the filler never names another operation) after its list, the way the official prompts put their instruction
  between the list and the answer: the demo model trained without it retrieved only within ~47 tokens of the answer
  (official reverse and insert_index failed on exactly the entries farther away), and the short rows never put a
  list farther than that.
* **full rows**: the official prompt exactly as ``build_messages`` builds it (ICL turn included).
* **training-only rows** (``aux/...``, when a stage names them): the questions of ``aux_rows.py`` (find, exclude,
  missing, missing_first, last, next, latin_fill), short or as a chat.

Targets are drawn by ``random_answer`` afresh for every row: the random-output tasks (shuffle, insert / remove /
replace at random, latin square) keep their real diversity (any valid answer), the others get their unique answer.
``data.shuffle_answer`` (``Mix.shuffle_answer``) can give shuffle one fixed valid answer instead (``fixed_shuffle``):
the prompts, in-context example included, stay the official ones; only the target is no longer a distribution.
Samples whose ``sample_key`` is in ``exclude`` (the official test samples and the held-out eval samples) are never
produced, so neither is trained on.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dlm_decode.parallelbench.generator import (
    WAITING_LINE_OPS,
    generate_task,
    list_to_str,
    load_names,
    random_answer,
    sample_key,
)
from dlm_decode.parallelbench.tasks import answer_text, build_messages, load_task, max_new_tokens
from recipes.train_demo.aux_rows import (  # noqa: F401 (the row kinds' names and questions, imported from here by tests)
    _AUX,
    AUX_TASKS,
    BLANK,
    EXCLUDE,
    LAST,
    LATIN,
    LATIN_FILL,
    LATIN_REST,
    LATIN_TASKS,
    LOOKUP,
    LOOKUP_SOURCE,
    MISSING,
    MISSING_FIRST,
    NEXT,
    OFFICIAL_CHAT_KINDS,
    SELF,
    SORT_CLOSE,
    VARIANTS,
    close_people,
    close_sort_sample,
    exclude_query,
    first_names_only,
    last_query,
    latin_fill_grid,
    latin_rest_split,
    lookup_query,
    missing_query,
)

# the generator's ten operations, the four whole-list ones first; the order fixes which task a seeded draw picks, so it
# is part of the data
_FIRST = ("copy", "reverse", "sort", "shuffle")
WAITING_LINE = _FIRST + tuple(op for op in WAITING_LINE_OPS if op not in _FIRST)
TASKS = tuple(f"waiting_line/{op}" for op in WAITING_LINE) + ("puzzle/latin_square_n4", "puzzle/sudoku_n4_12")
# training-only row kinds (aux_rows.py), never benchmark tasks; a stage takes them only when it names them
STAGE_TASKS = TASKS + AUX_TASKS


def short_prompt(task: str, sample: Mapping[str, Any]) -> str:
    """The short-row prompt of a generated sample: operation word, operands, the bare list or grid."""
    inp = sample["input"]
    if task == "puzzle/latin_square_n4":
        return f"latin {inp['symbols']}"
    if task == "puzzle/sudoku_n4_12":
        return "sudoku\n" + inp["sudoku"]
    op = task.split("/", 1)[1]
    action, _, mode = op.partition("_")
    ctx = inp["context"]
    word = f'"{inp["word"]}"' if "word" in inp else ""
    if mode == "index":
        index = inp["index"]
        if action == "insert":
            return f"insert {word} at {index} {ctx}"
        if action == "remove":
            return f"remove {index} {ctx}"
        return f"replace {index} with {word} {ctx}"
    if mode == "random":
        if action == "insert":
            return f"insert {word} {ctx}"
        if action == "remove":
            return f"remove {ctx}"
        return f"replace with {word} {ctx}"
    return f"{op} {ctx}"


def chat_prompt_ids(tok: Any, messages: list[dict]) -> list[int]:
    """A chat's prompt ids as ``dlm_decode.generate`` builds them (template with the generation prompt, no specials
    added); the answer canvas follows them directly."""
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tok(text, add_special_tokens=False)["input_ids"])


def encode_row(
    tok: Any, messages: list[dict], target: str, gen_length: int, lead: str = ""
) -> tuple[list[int], list[int]]:
    """(prompt ids as dlm_decode.generate builds them, response = answer, ``<|eot_id|>``, then EOS up to
    exactly ``gen_length``); ``lead``: the answer's given start, appended to the prompt ids."""
    prompt = chat_prompt_ids(tok, messages) + (list(tok(lead, add_special_tokens=False)["input_ids"]) if lead else [])
    return prompt, response_canvases(tok, [target], gen_length)[0]


def response_canvases(tok: Any, targets: list[str], gen_length: int) -> list[list[int]]:
    """Each target's response canvas: the answer's ids, ``<|eot_id|>``, then EOS up to exactly ``gen_length``
    (the targets tokenized in one call)."""
    eot, eos = tok.convert_tokens_to_ids("<|eot_id|>"), tok.eos_token_id
    out = []
    for target, ids in zip(targets, tok(targets, add_special_tokens=False)["input_ids"], strict=True):
        if len(ids) + 1 > gen_length:
            raise ValueError(f"answer of {len(ids)} tokens does not fit in gen_length {gen_length}: {target!r}")
        out.append([*ids, eot] + [eos] * (gen_length - len(ids) - 1))
    return out


@dataclass(frozen=True)
class Mix:
    """What one step's batch holds: ``batch`` rows, ``short_share`` of them short rows, tasks drawn by weight."""

    batch: int
    short_share: float
    tasks: tuple[str, ...] = TASKS
    weights: tuple[float, ...] | None = None
    bare: bool = False  # short rows as raw text (bos + prompt, no chat turn) answered by answer + eot, no padding
    pad: bool = False  # bare short rows padded with EOS to the task's gen length, like the official rows' responses
    icl: float = 0.0  # share of short rows that first show the sample's in-context example, answered (two lists)
    gap: int = 0  # short rows end in 0..gap filler words after their list (retrieval from farther away)
    lengths: tuple[int, int] | None = None  # (lo, hi) people per waiting-line list, None: the task's own range
    uniform_lengths: bool = False  # list lengths drawn uniformly per row, not in the generator's buckets (config.py)
    # training-only tasks (AUX_TASKS) also fill a full stage's official slots, as the copy chat with their question
    # appended; False: they come as short rows only, and the official slots draw from the other tasks
    aux_chat: bool = True
    # EOS padding of the training-only rows (find, missing, ...); None: as ``pad``. ``aux_pad=False`` beside ``pad``
    # keeps the comparison rows short (one answer token in four weighs what it needs; "Thirteenth round") while the
    # ten tasks' rows stay padded as the shipped model learned them
    aux_pad: bool | None = None
    # full rows' responses padded with EOS to a length drawn uniformly in [the task's canvas, canvas]; 0: the task's
    # own canvas (the official gen length), as the shipped models were trained
    canvas: int = 0
    # shuffle's target: "random" (a uniform draw among the valid orders, every shipped stage so far) or one of
    # fixed_shuffle's rules, the same valid order for every row of a list
    shuffle_answer: str = "random"

    def for_aux(self) -> Mix:
        """The mix a training-only row is built with: ``aux_pad`` in place of ``pad`` when it is set."""
        return self if self.aux_pad is None else replace(self, pad=self.aux_pad)


# data.shuffle_answer's rules: the people of a list -> the one order a fixed-answer shuffle row is trained on
SHUFFLE_RULES = {
    "swap_first": lambda people: [people[1], people[0], *people[2:]],  # the first two swapped, the rest in place
    "rotate": lambda people: [*people[1:], people[0]],  # every person one place forward, the first last
    "reverse": lambda people: people[::-1],  # reverse's answer, which the model already writes for that task
}
SHUFFLE_ANSWERS = ("random", *SHUFFLE_RULES)
SHUFFLE = "waiting_line/shuffle"


def fixed_answer_tasks(shuffle_answer: str) -> tuple[str, ...]:
    """The tasks whose rows ``shuffle_answer`` trains on one fixed order (so their self rows, other orders, are
    skipped): shuffle under a rule, none under ``random``."""
    return () if shuffle_answer == "random" else (SHUFFLE,)


def fixed_shuffle(sample: Mapping[str, Any], rule: str) -> str:
    """Shuffle's answer text for ``sample`` under ``rule`` (``SHUFFLE_RULES``): a valid answer (the same people in
    another order) whenever the rule moves someone, which on the generator's lists of distinct names every rule
    does; a ValueError otherwise, since the rule's order would then be the original one."""
    people = list(sample["answer"]["input"])
    if rule not in SHUFFLE_RULES:
        raise ValueError(f"shuffle_answer {rule!r}; choose one of {', '.join(SHUFFLE_ANSWERS)}")
    order = SHUFFLE_RULES[rule](people) if len(people) > 1 else people
    if order == people:
        raise ValueError(f"shuffle_answer {rule} leaves {people} in its order, which is not a shuffle")
    return list_to_str(order)


class RowStream:
    """Rows for a step, a function of (seed, step, mix): ``rows(step, mix) -> [(prompt_ids, response_ids, task)]``."""

    def __init__(
        self,
        data_dir: str | Path,
        tokenizer: Any,
        seed: int,
        exclude: Mapping[str, set] | None = None,
        self_rows: Sequence[tuple] = (),
    ) -> None:
        self.tok = tokenizer
        # aux/self's rows (self_rows.load_self_rows: prompt ids, response ids, task[, decode state]), drawn by index
        self.self_rows = list(self_rows)
        self.seed = seed
        self.names = load_names(Path(data_dir) / "first_last_names.yaml")
        self.configs = {t: load_task(data_dir, t, limit=0).config for t in TASKS}
        self.exclude = {t: set(exclude.get(t, ())) for t in TASKS} if exclude else {t: set() for t in TASKS}
        self.filler_words = {t: template_words(c) for t, c in self.configs.items()}

    def encode(self, messages: list[dict], target: str, gen_length: int, lead: str = "") -> tuple[list[int], list[int]]:
        return encode_row(self.tok, messages, target, gen_length, lead)

    def samples(
        self, task: str, n: int, seed: int, lengths: tuple[int, int] | None = None, uniform: bool = False
    ) -> list[dict]:
        """``n`` generated samples of ``task``; ``lengths`` (lo, hi) overrides a waiting-line task's list lengths (its
        in-context examples' too). ``uniform``: each list's length is drawn uniformly; otherwise the official config's
        ``samples_per_length`` buckets fill in order, so n=1 always gives the shortest list, n=2 the two shortest."""
        config = self.configs[task]
        if lengths is not None:
            config = {**config, "min_length": lengths[0], "max_length": lengths[1]}
        if uniform and task.startswith("waiting_line/"):
            config = {**config, "samples_per_length": 0}
        return generate_task(task, config, self.names, n=n, seed=seed, exclude=self.exclude[task])

    def rows(self, step: int, mix: Mix) -> list[tuple[list[int], list[int], str]]:
        rng = random.Random(self.seed * 1_000_003 + step)
        n_short = round(mix.batch * mix.short_share)
        kinds = ["short"] * n_short + ["full"] * (mix.batch - n_short)
        if mix.aux_chat or n_short == mix.batch:
            picks = rng.choices(range(len(mix.tasks)), weights=mix.weights, k=mix.batch)
        else:  # official slots from the official tasks alone (the draw above, unchanged, when aux rows may be chats)
            weights = mix.weights or [1.0] * len(mix.tasks)
            official = [
                0.0 if t in AUX_TASKS and t not in OFFICIAL_CHAT_KINDS else w
                for t, w in zip(mix.tasks, weights, strict=True)
            ]
            picks = rng.choices(range(len(mix.tasks)), weights=weights, k=n_short)
            picks += rng.choices(range(len(mix.tasks)), weights=official, k=mix.batch - n_short)
        wanted: dict[tuple[str, str], int] = {}
        for kind, i in zip(kinds, picks, strict=True):
            wanted[(kind, mix.tasks[i])] = wanted.get((kind, mix.tasks[i]), 0) + 1
        out = []
        icl_rng = random.Random(f"icl/{self.seed}/{step}")
        # the gap draws have their own generator too: rows without a gap are byte-identical to earlier runs'
        gap_rng = random.Random(f"gap/{self.seed}/{step}")
        for (kind, task), n in sorted(wanted.items()):
            answer_rng = random.Random(rng.randrange(2**62))
            if task == SELF:  # official chats with the model's own verified answers, in a short slot too
                if not self.self_rows:
                    raise ValueError("a stage names self, but the stream has no self rows (train.py --self-rows)")
                for i in answer_rng.choices(range(len(self.self_rows)), k=n):
                    prompt, resp, _, *state = self.self_rows[i]  # a decode-order row keeps its state
                    out.append((list(prompt), list(resp), f"{kind}/{task}", *state))
                continue
            if task in LATIN_TASKS:
                gen_length = max_new_tokens(LATIN)
                for s in self.samples(LATIN, n, rng.randrange(2**62)):
                    row = self.latin_aux_row(task, s, gen_length, mix, kind == "full", answer_rng)
                    out.append((*row, f"{kind}/{task}"))
                continue
            if task in _AUX:
                gen_length = max_new_tokens(LOOKUP_SOURCE)
                for s in self.samples(LOOKUP_SOURCE, n, rng.randrange(2**62), mix.lengths, mix.uniform_lengths):
                    gap = self.filler(LOOKUP_SOURCE, gap_rng, mix.gap) if kind == "short" else ""
                    row = self.lookup_row(s, gen_length, mix, kind == "full", answer_rng, gap, task)
                    out.append((*row, f"{kind}/{task}"))
                continue
            source = VARIANTS[task][0] if task in VARIANTS else task  # a variant is built as its task's rows
            gen_length = max_new_tokens(source)
            for s in self.samples(source, n, rng.randrange(2**62), mix.lengths, mix.uniform_lengths):
                if task in VARIANTS:
                    s = self.variant_sample(task, s, answer_rng)
                row = self.task_row(
                    source, kind, s, self.target(source, s, mix, answer_rng), gen_length, mix, icl_rng, gap_rng
                )
                out.append((*row, f"{kind}/{task}"))
        if mix.canvas:
            out = self.widen(out, mix.canvas, random.Random(f"canvas/{self.seed}/{step}"))
        rng.shuffle(out)
        return out

    @staticmethod
    def target(task: str, sample: Mapping[str, Any], mix: Mix, rng: random.Random) -> str:
        """A benchmark row's answer: shuffle's fixed order under ``mix.shuffle_answer``, else ``random_answer``'s
        draw (which still takes ``rng``'s draw for shuffle, so the other rows of a step are unchanged)."""
        drawn = random_answer(task, sample, rng)
        if task in fixed_answer_tasks(mix.shuffle_answer):
            return fixed_shuffle(sample, mix.shuffle_answer)
        return drawn

    def task_row(
        self,
        task: str,
        kind: str,
        sample: Mapping[str, Any],
        target: str,
        gen_length: int,
        mix: Mix,
        icl_rng: random.Random,
        gap_rng: random.Random,
    ) -> tuple[list[int], list[int]]:
        """A benchmark task's row: ``kind`` "short" (the in-context example with ``mix.icl``'s chance, filler words
        after the list) or "full" (the official chat)."""
        if kind != "short":
            return self.encode(build_messages(self.configs[task], sample), target, gen_length)
        # the ICL draw has its own generator, so rows without it are those of earlier runs (resume)
        with_icl = mix.icl > 0 and icl_rng.random() < mix.icl
        gap = self.filler(task, gap_rng, mix.gap)
        return self.short_row(task, sample, target, gen_length, mix, with_icl, gap)

    def variant_sample(self, task: str, sample: Mapping[str, Any], rng: random.Random) -> dict:
        """``sample`` of ``VARIANTS[task]``'s task with the variant's operands (``aux/sort_close``: close first names),
        redrawn while it collides with an excluded sample (official test or held-out)."""
        source, make = VARIANTS[task]
        for _ in range(100):
            out = make(sample, rng, self.names)
            if sample_key(out) not in self.exclude[source]:
                return out
        raise RuntimeError(f"{task}: 100 draws in a row collided with excluded {source} samples")

    def widen(
        self, rows: list[tuple[list[int], list[int], str]], canvas: int, rng: random.Random
    ) -> list[tuple[list[int], list[int], str]]:
        """The full rows with their EOS padding extended to a length drawn uniformly in [len(response), canvas] (its
        own generator, so rows without a canvas are those of earlier runs); short rows unchanged."""
        eos = self.tok.eos_token_id
        out = []
        for prompt, resp, label, *state in rows:
            if label.startswith("full/") and len(resp) < canvas:
                wider = resp + [eos] * (rng.randint(len(resp), canvas) - len(resp))
                if state:  # a decode-order row's new slots are still masked, as at decode time (never scored)
                    state = [(state[0][0] + tuple(range(len(resp), len(wider))), state[0][1])]
                resp = wider
            out.append((prompt, resp, label, *state))
        return out

    def filler(self, task: str, rng: random.Random, gap: int) -> str:
        """0..``gap`` consecutive words of ``task``'s template (wrapping round), "" without a gap."""
        if gap <= 0:
            return ""
        words = self.filler_words[task]
        n, start = rng.randint(0, gap), rng.randrange(len(words))
        return " ".join(words[(start + i) % len(words)] for i in range(n))

    def lookup_row(
        self,
        sample: Mapping[str, Any],
        gen_length: int,
        mix: Mix,
        full: bool,
        rng: random.Random,
        gap: str = "",
        task: str = LOOKUP,
    ) -> tuple[list[int], list[int]]:
        """One training-only row of ``task`` (``_AUX``: find, exclude, missing, missing_first, last): bare like the
        short rows, or ``full``: the official copy chat whose last user turn ends with the query line."""
        prepare, make_query, word, answer_text_of = _AUX[task]
        sample = prepare(sample)
        query, people = make_query(sample, rng)
        lead, answer = answer_text_of(query, people)
        line = f"{word} {list_to_str(query)}"
        if full:
            messages = build_messages(self.configs[LOOKUP_SOURCE], sample)
            messages[-1] = {**messages[-1], "content": messages[-1]["content"] + line + "\n"}
            return self.encode(messages, answer, gen_length, lead)
        prompt = _with_gap(f"{line} {sample['input']['context']}", gap)
        return self.text_row(prompt, answer, gen_length, mix.for_aux(), lead=lead)

    def latin_aux_row(
        self, task: str, sample: Mapping[str, Any], gen_length: int, mix: Mix, full: bool, rng: random.Random
    ) -> tuple[list[int], list[int]]:
        """One training-only latin-square row (``LATIN_TASKS``) of a drawn valid square. ``aux/latin_fill``: a partial
        square (``latin_fill_grid``) after the symbols, answered by the whole square: the sudoku's form (givens in the
        prompt) for the latin square, whose official prompt gives none. ``aux/latin_rest``: the square's first rows
        given as the answer's start (``latin_rest_split``), the rest to fill in, the canvas ending where the task's
        does. Bare like the short rows (``latin [H, 4, C, A]``), or ``full``: the official latin-square chat (with a
        latin_fill grid as one more paragraph of its last user turn)."""
        target = random_answer(LATIN, sample, rng)
        grid, lead = "", ""
        if task == LATIN_FILL:
            grid = latin_fill_grid(target, rng)
        else:
            lead, target = latin_rest_split(target, rng)
            gen_length -= len(self.tok(lead, add_special_tokens=False)["input_ids"])
        if full:
            messages = build_messages(self.configs[LATIN], sample)
            if grid:
                messages[-1] = {**messages[-1], "content": messages[-1]["content"] + "\n" + grid + "\n"}
            return self.encode(messages, target, gen_length, lead)
        prompt = short_prompt(LATIN, sample) + (f"\n{grid}" if grid else "")
        return self.text_row(prompt, target, gen_length, mix.for_aux(), lead=lead)

    def short_row(
        self,
        task: str,
        sample: Mapping[str, Any],
        target: str,
        gen_length: int,
        mix: Mix,
        icl: bool,
        gap: str = "",
    ) -> tuple[list[int], list[int]]:
        """One short row; with ``icl`` the sample's in-context example and its answer come first, as in the official
        prompt, so the row holds two lists and the answer must be read from the last one; ``gap`` (filler words)
        follows the row's own list."""
        examples = list(sample["input"].get("icl_examples") or []) if icl else []
        turns = [(short_prompt(task, ex), answer_text(ex["answer"])) for ex in examples]
        return self.text_row(_with_gap(short_prompt(task, sample), gap), target, gen_length, mix, turns)

    def text_row(
        self,
        prompt: str,
        target: str,
        gen_length: int,
        mix: Mix,
        turns: Sequence[tuple[str, str]] = (),
        lead: str = "",
    ) -> tuple[list[int], list[int]]:
        """A short-format row from its text: the (prompt, answer) ``turns`` first, then ``prompt`` answered by
        ``target``; bare text (``bos``, each turn ending in ``<|eot_id|>``, EOS padding when ``mix.pad``) or a chat.
        ``lead``: the answer's given start, the last prompt ids (the response is ``target`` alone)."""
        if mix.bare:
            eot = self.tok.convert_tokens_to_ids("<|eot_id|>")
            ids = [self.tok.bos_token_id]
            for p, a in turns:
                ids += [*self.tok(p + "\n" + a, add_special_tokens=False)["input_ids"], eot]
            ids += self.tok(prompt + "\n", add_special_tokens=False)["input_ids"]
            ids += self.tok(lead, add_special_tokens=False)["input_ids"] if lead else []
            resp = [*self.tok(target, add_special_tokens=False)["input_ids"], eot]
            if mix.pad:
                resp = resp + [self.tok.eos_token_id] * max(gen_length - len(resp), 0)
            return ids, resp
        chat = []
        for p, a in turns:
            chat += [{"role": "user", "content": p}, {"role": "assistant", "content": a}]
        chat.append({"role": "user", "content": prompt})
        return self.encode(chat, target, gen_length, lead)


# people per list a length option may ask for: a list needs two people to be reordered, and the official lists stop
# at six (a longer answer outgrows the waiting-line tasks' 32-token canvas)
MIN_PEOPLE, MAX_PEOPLE = 2, 6


def list_lengths(text: str, where: str) -> tuple[int, int]:
    """``"2-3"`` -> (2, 3), ``"4"`` -> (4, 4): a list-length range (a stage's ``lengths``); a clear
    error naming ``where`` otherwise."""
    lo, dash, hi = text.partition("-")
    try:
        out = (int(lo), int(hi if dash else lo))
    except ValueError:
        out = (0, 0)
    if not MIN_PEOPLE <= out[0] <= out[1] <= MAX_PEOPLE:
        raise ValueError(f"{where}: len must be LO-HI with {MIN_PEOPLE} <= LO <= HI <= {MAX_PEOPLE}, got {text!r}")
    return out


def _with_gap(prompt: str, gap: str) -> str:
    return f"{prompt}\n{gap}" if gap else prompt


def template_words(config: Mapping[str, Any]) -> list[str]:
    """The words of a task's template with its ``{placeholders}`` and quotes dropped, in template order."""
    text = re.sub(r"\{[^}]*\}", " ", str(config.get("prompt", "")))
    words = text.replace('"', " ").split()
    if not words:
        raise ValueError(f"task {config.get('name', '?')!r} has no prompt text to draw filler words from")
    return words


def heldout(data_dir: str | Path, seed: int, per_task: int, exclude: Mapping[str, set]) -> dict[str, list[dict]]:
    """Fresh-seed held-out samples per task (never an official test sample)."""
    names = load_names(Path(data_dir) / "first_last_names.yaml")
    out = {}
    for i, task in enumerate(TASKS):
        config = load_task(data_dir, task, limit=0).config
        out[task] = generate_task(task, config, names, n=per_task, seed=seed + 7919 * i, exclude=exclude.get(task, ()))
    return out


def official_keys(data_dir: str | Path) -> dict[str, set]:
    """``sample_key`` of every official test sample, per task."""
    return {t: {sample_key(s) for s in load_task(data_dir, t).samples} for t in TASKS}


def excluded_prompts(data_dir: str | Path, tok: Any, held: Mapping[str, Sequence[dict]]) -> set[tuple[int, ...]]:
    """The chat prompt ids (as ``dlm_decode.generate`` builds them) of every official test sample and every ``held``
    sample: what a file of self rows (``self_rows.py``) must not contain."""
    out: set[tuple[int, ...]] = set()
    for task in TASKS:
        loaded = load_task(data_dir, task)
        for s in [*loaded.samples, *held.get(task, ())]:
            out.add(tuple(chat_prompt_ids(tok, build_messages(loaded.config, s))))
    return out


def keys_of(samples: Mapping[str, Sequence[dict]]) -> dict[str, set]:
    return {t: {sample_key(s) for s in ss} for t, ss in samples.items()}


def eval_items(
    samples: Mapping[str, Sequence[dict]], data_dir: str | Path, short: bool
) -> dict[str, tuple[list, list, int]]:
    """task -> (chats, samples, gen_length) for scoring.score_tasks; ``short`` builds the short-row prompts."""
    items = {}
    for task, ss in samples.items():
        config = load_task(data_dir, task, limit=0).config
        chats = [
            [{"role": "user", "content": short_prompt(task, s)}] if short else build_messages(config, s) for s in ss
        ]
        items[("short/" if short else "") + task] = (chats, list(ss), max_new_tokens(task))
    return items


def corpus(data_dir: str | Path, per_task: int, seed: int) -> list[str]:
    """Text for the tokenizer: full prompts, short prompts and answers of ``per_task`` fresh samples per task."""
    names = load_names(Path(data_dir) / "first_last_names.yaml")
    rng = random.Random(seed)
    texts = []
    for i, task in enumerate(TASKS):
        config = load_task(data_dir, task, limit=0).config
        for s in generate_task(task, config, names, n=per_task, seed=seed + 104_729 * i):
            texts += [m["content"] for m in build_messages(config, s)]
            texts += [short_prompt(task, s), random_answer(task, s, rng)]
    return texts
