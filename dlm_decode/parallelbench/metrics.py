"""ParallelBench metrics, reimplemented from the rules of the official scorer.

Every metric takes the model's output text and the sample's ``answer`` field and returns a float in
[0, 1]; :func:`score_sample` returns both the lenient and the strict score, like the official
``{"score", "score_strict"}`` dicts. Malformed outputs score 0 and never raise.

Behaviour that follows the official code (furiosa-ai/ParallelBench, ``datasets/metrics.py``), including
its quirks:

* **List parsing** (:func:`parse_list`). Lenient: keep what follows the *last* ``[``, cut at the next
  ``]``, split on commas, strip double quotes and spaces from each item (single quotes, tabs and
  newlines are *not* stripped) and drop empty items. A missing bracket is not an error in lenient
  mode: text without ``[`` or ``]`` is parsed as a bare comma list, so ``A, B, C`` parses to three
  items and an unclosed ``["A", "B"`` still parses. Strict: both brackets are required and the
  content must be ``", "``-separated items that each start and end with ``"`` and hold no other
  ``"``; otherwise the output scores 0. ``[]`` is an empty list leniently and invalid strictly.
* **list_match_score**: parsed list equals the reference list.
* **list_shuffle_score**: same multiset as the input list *and* a different order. A list of length
  one (or with all items equal) therefore can never score.
* **list_random_insert_score**: remove the first occurrence of the new person from the prediction;
  what is left must equal the input list (so any insertion position is accepted). Without a
  ``word`` in the answer, it is scored as the reverse of a random removal.
* **list_random_remove_score**: one fewer item, exactly one distinct name missing (set difference),
  and the input list minus that name's first occurrence equals the prediction. A removed name that
  also occurs elsewhere in the input is not detected by the set difference and scores 0.
* **list_random_replace_score**: same length; the first occurrence of the new person marks the
  replaced position, and the input with that position replaced must equal the prediction. Without a
  ``word``, exactly ``n_words`` positions must differ.
* **latin_square_score**: lines of the output are kept only if their comma-separated, stripped cells
  form exactly the symbol set (other lines such as prose or code fences are skipped); the first
  ``size`` kept lines must have every row and every column equal to the symbol set (columns are
  built with ``zip``, so they are truncated to the shortest row). An optional ``first_row`` in the
  answer must match. Lenient and strict scores are the same.
* **sudoku_score**: the parsed grid must equal the reference solution. Lenient parsing removes spaces
  and commas, keeps the lines that contain exactly four digits and needs exactly four such lines;
  strict parsing needs exactly four non-empty lines of exactly four digit characters.
* The text tasks (words_to_sentence, paraphrase, summarize) are scored officially with LanguageTool
  grammar checks and ``evaluate``'s ROUGE/BLEU/BERTScore. Those need external packages, a Java
  server and model downloads, so this module does not score them: :func:`score_sample` raises
  :class:`MetricUnavailable` for them and :func:`text_metrics_available` says whether the scorer
  packages could even be imported.

Deliberate differences: predictions that are not strings (``None``) are scored as empty text instead
of raising, and the metric functions accept a ``strict`` flag instead of always computing both scores.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable, Mapping
from typing import Any

from dlm_decode.parallelbench.tasks import answer_text, metric_name

__all__ = [
    "LIST_METRICS",
    "METRICS",
    "TEXT_METRICS",
    "MetricUnavailable",
    "latin_square_score",
    "list_match_score",
    "list_random_insert_score",
    "list_random_remove_score",
    "list_random_replace_score",
    "list_shuffle_score",
    "parse_list",
    "parse_sudoku",
    "score_sample",
    "sudoku_score",
    "text_metrics_available",
]


class MetricUnavailable(RuntimeError):
    """The task's official metric needs scorers (grammar checker, BERTScore, ROUGE) that are not
    available here."""


def _as_text(prediction: Any) -> str:
    if prediction is None:
        return ""
    return prediction if isinstance(prediction, str) else str(prediction)


def parse_list(text: str | list, strict: bool = False) -> list[str] | None:
    """Parse a list from model output; ``None`` when strict parsing fails (see module docstring)."""
    if isinstance(text, list):
        return text
    text = _as_text(text)
    if "[" in text:
        text = text.rsplit("[", 1)[1]
    elif strict:
        return None
    if "]" in text:
        text = text.split("]", 1)[0]
    elif strict:
        return None
    if not strict:
        return [item.strip('" ') for item in text.strip("[]").split(",") if item.strip()]
    items = []
    for item in text.split(", "):
        if not (item.startswith('"') and item.endswith('"')):
            return None
        inner = item[1:-1]  # a lone '"' passes the check above and becomes an empty item
        if '"' in inner:
            return None
        items.append(inner)
    return items


def list_match_score(prediction: str, answer: Any, strict: bool = False) -> float:
    """Exact list match against the reference list (a list string such as ``'["A", "B"]'``)."""
    predicted = parse_list(prediction, strict)
    if predicted is None:
        return 0.0
    return float(predicted == parse_list(answer_text(answer), strict=False))


def list_shuffle_score(prediction: str, answer: Mapping[str, Any], strict: bool = False) -> float:
    """Same items as ``answer["input"]`` in a different order."""
    predicted = parse_list(prediction, strict)
    if predicted is None:
        return 0.0
    original = list(answer["input"])
    return float(sorted(predicted) == sorted(original) and predicted != original)


def _remove_valid(predicted: list[str] | None, original: list[str] | None, n_words: int = 1) -> float:
    if predicted is None or original is None:
        return 0.0
    remaining = list(original)
    if len(predicted) != len(remaining) - n_words:
        return 0.0
    missing = set(remaining) - set(predicted)
    if len(missing) != n_words:
        return 0.0
    for name in missing:
        remaining.remove(name)
    return float(predicted == remaining)


def _insert_valid(predicted: list[str] | None, original: list[str], word: Any, n_words: int = 1) -> float:
    if predicted is None or original is None:
        return 0.0
    if word is None:
        return _remove_valid(list(original), predicted, n_words)
    left = list(predicted)
    for new in [word] if isinstance(word, str) else list(word):
        if new not in left:
            return 0.0
        left.remove(new)
    return float(left == list(original))


def list_random_insert_score(prediction: str, answer: Mapping[str, Any], strict: bool = False) -> float:
    """``answer["word"]`` inserted anywhere into ``answer["input"]``, nothing else changed."""
    return _insert_valid(
        parse_list(prediction, strict), list(answer["input"]), answer.get("word"), answer.get("n_words", 1)
    )


def list_random_remove_score(prediction: str, answer: Mapping[str, Any], strict: bool = False) -> float:
    """Exactly one (``n_words``) person removed from ``answer["input"]``, order kept."""
    return _remove_valid(parse_list(prediction, strict), list(answer["input"]), answer.get("n_words", 1))


def list_random_replace_score(prediction: str, answer: Mapping[str, Any], strict: bool = False) -> float:
    """One person of ``answer["input"]`` replaced by ``answer["word"]``, nothing else changed."""
    predicted = parse_list(prediction, strict)
    if predicted is None:
        return 0.0
    original = list(answer["input"])
    if len(predicted) != len(original):
        return 0.0
    word = answer.get("word")
    if word is None:
        n_words = answer.get("n_words", 1)
        return float(sum(p != o for p, o in zip(predicted, original, strict=True)) == n_words)
    if word not in predicted:
        return 0.0
    original[predicted.index(word)] = word
    return float(predicted == original)


def latin_square_score(prediction: str, answer: Mapping[str, Any], strict: bool = False) -> float:
    """Any Latin square over ``answer["symbols"]`` written as CSV lines (``strict`` has no effect, as
    in the official metric)."""
    del strict
    symbols = {str(s) for s in answer["symbols"]}
    size = len(symbols)
    first_row = answer.get("first_row")
    lines = [line.strip() for line in _as_text(prediction).split("\n") if line.strip()]
    rows = [[cell.strip() for cell in line.split(",")] for line in lines]
    rows = [row for row in rows if set(row) == symbols]
    if len(rows) < size:
        return 0.0
    rows = rows[:size]
    if any(set(row) != symbols for row in rows):
        return 0.0
    if any(set(column) != symbols for column in zip(*rows, strict=False)):
        return 0.0
    if first_row is not None and rows[0] != list(first_row):
        return 0.0
    return 1.0


def parse_sudoku(text: str | list, n: int = 4, strict: bool = False) -> list[list[int]] | None:
    """Parse an ``n`` x ``n`` digit grid (see module docstring); ``None`` when it cannot be read."""
    if isinstance(text, list):
        return text
    text = _as_text(text).strip()
    if not strict:
        text = text.replace(" ", "").replace(",", "")
        grid = []
        for line in text.split("\n"):
            digits = re.findall(r"\d", line.strip())
            if len(digits) == n:
                grid.append([int(d) for d in digits])
        return grid if len(grid) == n else None
    lines = [line.strip() for line in text.split("\n") if line.strip()]
    if len(lines) != n:
        return None
    grid = []
    for line in lines:
        if len(line) != n:
            return None
        try:
            grid.append([int(ch) for ch in line])
        except ValueError:
            return None
    return grid


def sudoku_score(prediction: str, answer: str, strict: bool = False) -> float:
    """The exact solution grid ``answer`` (four lines of four digits)."""
    predicted = parse_sudoku(prediction, strict=strict)
    if predicted is None:
        return 0.0
    return float(predicted == parse_sudoku(answer, strict=True))


#: Metric functions by official metric name; each is ``f(prediction, answer, strict=False) -> float``.
LIST_METRICS: dict[str, Callable[..., float]] = {
    "list_match_score": list_match_score,
    "list_shuffle_score": list_shuffle_score,
    "list_random_insert_score": list_random_insert_score,
    "list_random_remove_score": list_random_remove_score,
    "list_random_replace_score": list_random_replace_score,
}
METRICS: dict[str, Callable[..., float]] = {
    **LIST_METRICS,
    "latin_square_score": latin_square_score,
    "sudoku_score": sudoku_score,
}
#: Official metrics of the text tasks, which need model-based scorers (not implemented here).
TEXT_METRICS = frozenset({"sentence_to_words_score", "paraphrase_score", "summary_score", "grammar_score"})

# Packages the official text metrics import: LanguageTool for grammar, `evaluate` (with rouge_score
# and bert_score behind it) for ROUGE/BLEU/BERTScore.
_TEXT_SCORER_MODULES = ("language_tool_python", "evaluate", "rouge_score", "bert_score")


def text_metrics_available() -> bool:
    """True only if every package behind the official text metrics can be imported. Even then the
    LanguageTool server and the BERTScore model must be downloadable, and this module still does not
    compute those metrics itself."""
    return all(importlib.util.find_spec(module) is not None for module in _TEXT_SCORER_MODULES)


def score_sample(
    task_name_or_metric: str | Mapping[str, Any], prediction_text: str, sample: Mapping[str, Any]
) -> dict[str, float]:
    """Score one output: ``{"score": lenient, "score_strict": strict}``.

    ``task_name_or_metric`` is a metric name (``"list_match_score"``), a task name
    (``"waiting_line/copy"``) or a task config with a ``metric`` entry. Raises
    :class:`MetricUnavailable` for the text tasks and :class:`ValueError` for unknown names.
    """
    if isinstance(task_name_or_metric, str) and (task_name_or_metric in METRICS or task_name_or_metric in TEXT_METRICS):
        metric = task_name_or_metric
    else:
        metric = metric_name(task_name_or_metric)
    if metric in TEXT_METRICS:
        missing = [m for m in _TEXT_SCORER_MODULES if importlib.util.find_spec(m) is None]
        why = f"missing packages: {', '.join(missing)}" if missing else "not reimplemented in dlm_decode"
        raise MetricUnavailable(
            f"{metric} needs a grammar checker / ROUGE / BERTScore ({why}); score text tasks with the "
            "official ParallelBench scorer"
        )
    if metric not in METRICS:
        raise ValueError(f"unknown ParallelBench metric {metric!r}; known: {', '.join(sorted(METRICS))}")
    func = METRICS[metric]
    answer = sample["answer"]
    return {
        "score": func(prediction_text, answer, strict=False),
        "score_strict": func(prediction_text, answer, strict=True),
    }
