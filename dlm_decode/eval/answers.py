"""Answers of ``generate_until``: cutting at ``until`` strings, per-request statistics, and the JSONL they go to.

lm-eval 0.4.13 builds each logged sample from the request, the raw and filtered responses and the task's metrics;
a model cannot add fields. So an answer is a :class:`Generation`, a ``str`` that also carries ``.stats``: it
compares, filters and serializes as plain text, and tasks that know about it (the shipped ones) turn the statistics
into per-sample metrics. The same records are kept on the model and appended to ``stats_path`` as JSONL.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class Generation(str):
    """A generated answer that carries its decoding statistics (``.stats``); compares and serializes as text."""

    stats: dict[str, Any]

    def __new__(cls, text: str, stats: dict[str, Any]) -> Generation:
        obj = super().__new__(cls, text)
        obj.stats = stats
        return obj

    def __reduce__(self):  # pickling (lm-eval's response cache) keeps the statistics
        return (Generation, (str(self), self.stats))


def cut_answer(row: Any, until: list[str], tokenizer: Any, mask_id: int) -> str:
    """The row's text (already ended at EOS / end of turn by ``generate``), cut before the earliest ``until``."""
    text = row.text or ""
    special = set(getattr(tokenizer, "all_special_tokens", []))
    for u in until:  # special tokens are skipped when decoding, so those are cut on the ids
        if u in special:
            tid = tokenizer.convert_tokens_to_ids(u)
            if tid in row.generated_ids:
                head = row.generated_ids[: row.generated_ids.index(tid)]
                cut = tokenizer.decode([t for t in head if t != mask_id], skip_special_tokens=True)
                text = cut if len(cut) < len(text) else text
    ends = [text.find(u) for u in until if u in text]
    return text[: min(ends)] if ends else text


def answer_stats(req: Any, row: Any, out: Any, j: int, prompt_tokens: int, gen_length: int) -> dict[str, Any]:
    """Statistics of row ``j`` of a ``GenerateOutput``: forwards it took part in (``nfe``), tokens it committed,
    their ratio (``tokens_per_step``) and the per-step commits (trailing idle steps dropped)."""
    per_step = [step[j] for step in out.tokens_per_step]
    while per_step and per_step[-1] == 0:
        per_step.pop()
    committed = sum(per_step)
    return {
        "task": getattr(req, "task_name", None),
        "doc_id": getattr(req, "doc_id", None),
        "idx": getattr(req, "idx", None),
        "prompt_tokens": prompt_tokens,
        "gen_length": gen_length,
        "nfe": row.nfe,
        "committed": committed,
        "tokens_per_step": committed / row.nfe if row.nfe else 0.0,
        "step_commits": per_step,
        "batch_rows": len(out.rows),
        "batch_seconds": out.seconds,
        "sampler": out.sampler,
        "cache": out.cache,
    } | ({"error": row.error} if row.error else {})


def append_jsonl(path: str | Path, records: list[dict[str, Any]], rank: int = 0, world_size: int = 1) -> None:
    """Append ``records``; with several processes each writes ``<stem>.rank<r><suffix>``."""
    path = Path(path)
    if world_size > 1:
        path = path.with_name(f"{path.stem}.rank{rank}{path.suffix}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, default=str) + "\n")
