"""Where the recipes find the official ParallelBench files: ``--data DIR``, else ``$DLM_PARALLELBENCH_DATA``.

The recipes read the task configs and the names list from it (to generate fresh samples) and the test samples (to
exclude them from training, never to train on). There is no machine path as a default: without either, a recipe stops
with one line before any model or data is loaded.
"""

from __future__ import annotations

import os
from pathlib import Path

DATA_ENV = "DLM_PARALLELBENCH_DATA"


def data_dir(given: str | Path | None, option: str = "--data") -> Path:
    """The ParallelBench directory named by ``option`` or ``$DLM_PARALLELBENCH_DATA``; ValueError when neither
    names an existing directory holding the waiting-line and puzzle task configs."""
    if given is None and not os.environ.get(DATA_ENV):
        raise ValueError(f"no ParallelBench data: pass {option} DIR (the official files) or set ${DATA_ENV}")
    path = Path(given if given is not None else os.environ[DATA_ENV])
    source = option if given is not None else f"${DATA_ENV}"
    if not path.is_dir():
        raise ValueError(f"{source}: ParallelBench data directory {str(path)!r} not found")
    missing = [g for g in ("waiting_line", "puzzle") if not (path / g / "task_config.yaml").is_file()]
    if missing:
        raise ValueError(f"{source}: {path} has no {missing[0]}/task_config.yaml (not the ParallelBench data)")
    return path
