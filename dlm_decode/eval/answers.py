"""Answers of ``generate_until``: cutting at ``until`` strings, per-request statistics, and where they go.

Answers go back to lm-eval as plain ``str``: lm-eval 0.4.13's ``Task.process_results`` casts each gold answer with
``type(result)(gold)``, so any other type breaks ordinary tasks. lm-eval also gives a model no way to add fields to
logged samples, so the statistics travel beside the text: the model keeps every record (``lm.request_stats``,
``stats_path`` JSONL) and attaches each request's records to lm-eval's request object (:func:`attach_stats`), the
one thing both the model and the task see. Tasks built on :class:`StatsTask` (the shipped generate_until tasks)
hand their ``process_results`` a :class:`Generation` (the text plus ``.stats``) and report ``nfe`` and
``tokens_per_step`` per sample; every other task sees plain text.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lm_eval.api.task import ConfigurableTask

STATS_ATTR = "dlm_decode_stats"  # attribute of lm-eval's Instance: one statistics record per response, in order


class Generation(str):
    """An answer with its decoding statistics (``.stats``; empty when unknown) as a :class:`StatsTask` hands it to
    ``process_results``; compares and serializes as text. ``Generation(text)`` works, so lm-eval's gold cast does."""

    stats: dict[str, Any]

    def __new__(cls, text: str, stats: dict[str, Any] | None = None) -> Generation:
        obj = super().__new__(cls, text)
        obj.stats = dict(stats or {})
        return obj

    def __reduce__(self):  # pickling (gathering logged samples across ranks) keeps the statistics
        return (Generation, (str(self), self.stats))


def attach_stats(request: Any, stats: dict[str, Any]) -> None:
    """Record the statistics of one response on lm-eval's request (a request repeated K times gets K records, in the
    order of its responses)."""
    records = getattr(request, STATS_ATTR, None)
    if records is None:
        records = []
        setattr(request, STATS_ATTR, records)
    records.append(stats)


def stats_of(request: Any) -> list[dict[str, Any]]:
    """The statistics records :func:`attach_stats` left on a request (empty for cached or foreign answers)."""
    return list(getattr(request, STATS_ATTR, None) or [])


class StatsTask(ConfigurableTask):
    """A YAML task (``class: !function dlm_decode.eval.answers.StatsTask``) whose ``process_results`` receives each
    filtered answer as a :class:`Generation` carrying the statistics of the response it came from."""

    def __init__(self, config: dict | None = None, **kwargs: Any) -> None:
        config = dict(config or {})
        config.pop("class", None)  # lm-eval hands the YAML's ``class`` key to the constructor as config
        super().__init__(config=config, **kwargs)

    def apply_filters(self) -> Any:
        out = super().apply_filters()
        for inst in self.instances:
            records = stats_of(inst)
            if not records:
                continue
            for key, resp in inst.filtered_resps.items():
                if isinstance(resp, str) and not isinstance(resp, Generation):
                    i = inst.resps.index(resp) if resp in inst.resps else 0  # the response it came from
                    inst.filtered_resps[key] = Generation(resp, records[min(i, len(records) - 1)])
        return out


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


def answer_stats(req: Any, result: Any, prompt_tokens: int, gen_length: int, rows: int) -> dict[str, Any]:
    """Statistics of one answer (an ``engine.EngineResult``): forwards it took part in (``nfe``), tokens it committed,
    their ratio (``tokens_per_step``), the per-step commits (trailing idle steps dropped), the requests decoded beside
    it at most (``batch_rows``) and its own decoding seconds."""
    per_step = list(result.commits)
    while per_step and per_step[-1] == 0:
        per_step.pop()
    committed = sum(per_step)
    return {
        "task": getattr(req, "task_name", None),
        "doc_id": getattr(req, "doc_id", None),
        "idx": getattr(req, "idx", None),
        "prompt_tokens": prompt_tokens,
        "gen_length": gen_length,
        "nfe": result.nfe,
        "committed": committed,
        "tokens_per_step": committed / result.nfe if result.nfe else 0.0,
        "step_commits": per_step,
        "batch_rows": rows,
        "seconds": result.seconds,
        "sampler": result.stats.get("sampler", {}),
        "cache": result.stats.get("cache", {}),
    } | ({"error": result.error} if result.error else {})


def append_jsonl(path: str | Path, records: list[dict[str, Any]], rank: int = 0, world_size: int = 1) -> None:
    """Append ``records``; with several processes each writes ``<stem>.rank<r><suffix>``."""
    path = Path(path)
    if world_size > 1:
        path = path.with_name(f"{path.stem}.rank{rank}{path.suffix}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, default=str) + "\n")
