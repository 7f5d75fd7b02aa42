"""Counts and lists in messages: ``1 row`` / ``2 rows``, and long name lists cut to a few and a count."""

from __future__ import annotations

from collections.abc import Sequence


def plural(n: int, word: str, words: str | None = None) -> str:
    """``plural(1, "row")`` -> ``1 row``; ``plural(2, "row")`` -> ``2 rows`` (``words``: an irregular plural)."""
    return f"{n} {word if n == 1 else (words or word + 's')}"


def some(names: Sequence[str], shown: int = 3) -> str:
    """The first ``shown`` names, then how many more: ``a, b, c and 21 more``."""
    head = ", ".join(names[:shown])
    return head + (f" and {len(names) - shown} more" if len(names) > shown else "")
