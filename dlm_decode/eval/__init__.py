"""lm-evaluation-harness integration: the ``dlm_decode`` model and offline tasks (see docs/eval.md).

``import dlm_decode.eval`` registers the model with lm-eval 0.4.13 (which does not discover entry points itself).

    import lm_eval
    from dlm_decode.eval import DLMDecodeLM, task_manager
    results = lm_eval.simple_evaluate(
        model="dlm_decode", model_args="pretrained=demo-llada,sampler=low_confidence,gen_length=32",
        tasks=["parallelbench_waiting_line_copy"], apply_chat_template=True, limit=8,
        task_manager=task_manager(parallelbench_dir="/path/to/parallelbench"),
    )

CLI: ``dlm-decode eval --model_args pretrained=demo-llada --tasks dlm_tiny_mc`` (or ``python -m dlm_decode.eval``).
"""

from __future__ import annotations

from typing import Any

from dlm_decode.eval.answers import Generation, StatsTask
from dlm_decode.eval.lm import DLMDecodeLM
from dlm_decode.eval.options import EvalOptions, parse_model_args
from dlm_decode.eval.tasks import TASKS_DIR

__all__ = [
    "TASKS_DIR",
    "DLMDecodeLM",
    "EvalOptions",
    "Generation",
    "StatsTask",
    "parse_model_args",
    "task_manager",
]


def task_manager(
    parallelbench_dir: str | None = None,
    *,
    include_defaults: bool = False,
    include_path: list[str] | None = None,
    metadata: dict[str, Any] | None = None,
):
    """An lm-eval ``TaskManager`` that sees the shipped tasks (plus ``include_path``); built-in tasks are skipped
    by default (they need the hub, and indexing them costs ~10 s)."""
    from lm_eval.tasks import TaskManager

    meta = dict(metadata or {})
    if parallelbench_dir is not None:
        meta["parallelbench_dir"] = str(parallelbench_dir)
    return TaskManager(
        include_path=[str(TASKS_DIR), *(include_path or [])],
        include_defaults=include_defaults,
        metadata=meta or None,
    )
