"""ParallelBench: tasks, chat prompts, metrics and a seeded task generator.

ParallelBench (furiosa-ai) measures how the quality of masked-diffusion LMs holds up as more tokens
are decoded per step. This package reads the official test files (kept outside the package, see
:mod:`dlm_decode.parallelbench.tasks`), builds each sample's chat the way the benchmark does, scores
outputs with reimplementations of the official metrics (:mod:`dlm_decode.parallelbench.metrics`),
and regenerates waiting-line, latin-square and sudoku tasks for any seed
(:mod:`dlm_decode.parallelbench.generator`).
"""

from dlm_decode.parallelbench.generator import generate_task, load_names, random_answer, sample_key, valid_answers
from dlm_decode.parallelbench.metrics import (
    METRICS,
    MetricUnavailable,
    latin_square_score,
    list_match_score,
    list_random_insert_score,
    list_random_remove_score,
    list_random_replace_score,
    list_shuffle_score,
    parse_list,
    score_sample,
    sudoku_score,
    text_metrics_available,
)
from dlm_decode.parallelbench.tasks import (
    Task,
    build_messages,
    is_deterministic,
    list_tasks,
    load_task,
    max_new_tokens,
    metric_name,
    task_kind,
)

__all__ = [
    "METRICS",
    "MetricUnavailable",
    "Task",
    "build_messages",
    "generate_task",
    "is_deterministic",
    "latin_square_score",
    "list_match_score",
    "list_random_insert_score",
    "list_random_remove_score",
    "list_random_replace_score",
    "list_shuffle_score",
    "list_tasks",
    "load_names",
    "load_task",
    "max_new_tokens",
    "metric_name",
    "parse_list",
    "random_answer",
    "sample_key",
    "score_sample",
    "sudoku_score",
    "task_kind",
    "text_metrics_available",
    "valid_answers",
]
