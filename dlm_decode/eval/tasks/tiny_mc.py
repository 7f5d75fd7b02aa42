"""``dlm_tiny_mc``: twelve hand-written multiple-choice questions (shipped jsonl) that exercise ``loglikelihood``.

A smoke test for likelihood scoring, not a benchmark: the questions are elementary general knowledge, each with
four one- or two-word answers, so a working model scores well above chance (25 %) and a broken one does not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "tiny_mc" / "dlm_tiny_mc.jsonl"


def load(**_: Any):
    import datasets

    return datasets.DatasetDict({"test": datasets.Dataset.from_json(str(DATA))})
