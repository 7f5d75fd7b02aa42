"""ParallelBench task loading and chat construction.

The benchmark's test data lives outside the package (``../shared/data/parallelbench`` next to the
repository, or any directory with the same layout): one folder per task group, each holding a
``task_config.yaml`` (a mapping ``"<group>/<task>" -> config``) and one ``<task>.jsonl`` file per task.
A task is listed when its config key has a matching jsonl file. The key (which is also the file name)
is the task's name; the config's own ``name`` field is not used because it can disagree with the key
(the sudoku config says ``puzzle/sudoku_4x4_4`` for the ``puzzle/sudoku_n4_12`` file).

Chat construction follows the official ParallelBench dataset class (``ParallelBench.__getitem__``):

* for each in-context example in ``sample["input"]["icl_examples"]``: a user turn with
  ``prompt.format(**example["input"])`` and an assistant turn with the example's answer, which is the
  answer itself when it is a string and ``answer["example"]`` when it is a mapping;
* then the user turn ``prompt.format(**sample["input"])``.

Every user turn has the two-character sequence backslash-n replaced by a real newline *after*
formatting (the sudoku prompt is stored with literal ``\\n`` escapes). Extra keys of the input (such
as ``icl_examples`` itself) are ignored by ``str.format``, exactly as in the official code.

Official samples are read straight from the jsonl files with :mod:`json`; the official loader goes
through pandas and ``datasets``, which yields the same values for every field used here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "Task",
    "answer_text",
    "build_messages",
    "is_deterministic",
    "list_tasks",
    "load_task",
    "max_new_tokens",
    "metric_name",
    "task_kind",
    "task_op",
]

#: Generation budget (new tokens) per task kind, as used by the paper.
MAX_NEW_TOKENS = {"waiting_line": 32, "puzzle": 64, "text": 64}

# Group prefixes (the part before "/") that map to each task kind. The official repository has used
# both "puzzle" and "puzzles", and groups text tasks as "words_to_sentence", "paraphrase_summarize"
# or "text_writing" depending on the version.
_GROUP_KIND = {
    "waiting_line": "waiting_line",
    "puzzle": "puzzle",
    "puzzles": "puzzle",
    "words_to_sentence": "text",
    "paraphrase_summarize": "text",
    "text_writing": "text",
    "paraphrase": "text",
    "summarize": "text",
}

# Metric of each task, by the last component of its name (used when only a name is known).
_WAITING_LINE_METRICS = {
    "copy": "list_match_score",
    "reverse": "list_match_score",
    "sort": "list_match_score",
    "insert_index": "list_match_score",
    "remove_index": "list_match_score",
    "replace_index": "list_match_score",
    "shuffle": "list_shuffle_score",
    "insert_random": "list_random_insert_score",
    "remove_random": "list_random_remove_score",
    "replace_random": "list_random_replace_score",
}


@dataclass(frozen=True)
class Task:
    """One ParallelBench task: its name (``group/task``), its config and its samples."""

    name: str
    config: dict = field(repr=False)
    samples: list[dict] = field(repr=False)

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def prompt(self) -> str:
        return self.config["prompt"]

    @property
    def metric(self) -> str:
        return metric_name(self.name if "metric" not in self.config else self.config)

    def messages(self, index: int) -> list[dict[str, str]]:
        """Chat messages of sample ``index`` (see :func:`build_messages`)."""
        return build_messages(self.config, self.samples[index])


def _require_dir(data_dir: str | Path) -> Path:
    path = Path(data_dir)
    if path.exists() and not path.is_dir():
        raise ValueError(f"ParallelBench data directory {str(path)!r} is a file, not a directory")
    if not path.is_dir():
        raise FileNotFoundError(
            f"ParallelBench data directory not found: {str(path)!r} (expected a folder holding one "
            "sub-folder per task group with task_config.yaml and <task>.jsonl files)"
        )
    return path


def _read_group_configs(data_dir: Path) -> dict[str, tuple[Path, dict]]:
    """Map every task name that has a jsonl file to (jsonl path, config)."""
    found: dict[str, tuple[Path, dict]] = {}
    for config_file in sorted(data_dir.glob("*/task_config.yaml")):
        configs = _read_yaml(config_file) or {}
        if not isinstance(configs, Mapping):
            raise ValueError(f"{config_file}: expected a mapping of task name -> config")
        for key, config in configs.items():
            if not isinstance(key, str) or "/" not in key or not isinstance(config, Mapping):
                continue
            jsonl = data_dir / f"{key}.jsonl"
            if jsonl.is_file():
                found[key] = (jsonl, dict(config))
    return found


def _read_yaml(path: Path) -> Any:
    """A task group's YAML config; a file that is not UTF-8 or not YAML is an error naming it (and the line)."""
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        what = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ValueError(f"{path} is not valid YAML{where}: {what}") from None


def _sample(raw: bytes, path: Path, line_no: int) -> dict | None:
    """One JSONL line -> a sample (None for a blank line); a line that is not UTF-8, not JSON, or not a sample with
    an ``input`` object and an ``answer`` is an error naming ``path:line``."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        bad = f"byte 0x{raw[e.start]:02x} at column {e.start + 1}"
        raise ValueError(f"{path}:{line_no}: not UTF-8 text ({bad})") from None
    if not line.strip():
        return None
    try:
        sample = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{line_no}: invalid JSON ({exc})") from None
    if not isinstance(sample, dict) or not isinstance(sample.get("input"), dict) or "answer" not in sample:
        keys = sorted(sample) if isinstance(sample, dict) else type(sample).__name__
        raise ValueError(
            f"{path}:{line_no}: a ParallelBench sample is an object with an 'input' object and an 'answer'; got {keys}"
        )
    return sample


def list_tasks(data_dir: str | Path) -> list[str]:
    """Sorted names (``"group/task"``) of every task in ``data_dir`` that has both a config entry and
    a jsonl file."""
    return sorted(_read_group_configs(_require_dir(data_dir)))


def load_task(data_dir: str | Path, name: str, limit: int | None = None) -> Task:
    """Load task ``name`` (e.g. ``"waiting_line/copy"``) from ``data_dir``.

    ``limit`` keeps only the first ``limit`` samples (file order). Raises :class:`FileNotFoundError`
    when ``data_dir`` does not exist and :class:`KeyError` (listing the valid names) for an unknown
    task.
    """
    tasks = _read_group_configs(_require_dir(data_dir))
    if name not in tasks:
        valid = ", ".join(sorted(tasks)) or "(none)"
        raise KeyError(f"unknown ParallelBench task {name!r} in {str(data_dir)!r}; valid tasks: {valid}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    path, config = tasks[name]
    samples: list[dict] = []
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, start=1):
            if limit is not None and len(samples) >= limit:
                break
            sample = _sample(raw, path, line_no)
            if sample is not None:
                samples.append(sample)
    return Task(name=name, config=config, samples=samples)


def answer_text(answer: Any) -> str:
    """The reference text of an answer: the string itself, or ``answer["example"]`` for the
    mapping-style answers of random-output tasks (as the official chat and SFT code do)."""
    if isinstance(answer, str):
        return answer
    if isinstance(answer, Mapping) and "example" in answer:
        return answer["example"]
    raise ValueError(f"answer has no reference text: {answer!r}")


def _user_turn(prompt: str, values: Mapping[str, Any]) -> str:
    return prompt.format(**values).replace("\\n", "\n")


def build_messages(task_config: Mapping[str, Any], sample: Mapping[str, Any]) -> list[dict[str, str]]:
    """The chat for one sample, built exactly as the official benchmark builds it (module docstring)."""
    prompt = task_config["prompt"]
    messages: list[dict[str, str]] = []
    for example in sample["input"].get("icl_examples") or []:
        messages.append({"role": "user", "content": _user_turn(prompt, example["input"])})
        messages.append({"role": "assistant", "content": answer_text(example["answer"])})
    messages.append({"role": "user", "content": _user_turn(prompt, sample["input"])})
    return messages


def _name_of(name_or_config: str | Mapping[str, Any]) -> str:
    if isinstance(name_or_config, str):
        return name_or_config
    if isinstance(name_or_config, Mapping) and isinstance(name_or_config.get("name"), str):
        return name_or_config["name"]
    raise ValueError(f"expected a task name or a task config with a 'name', got {name_or_config!r}")


def task_op(name: str) -> str:
    """The task's own part of its name: ``"waiting_line/copy"`` -> ``"copy"``."""
    return name.rstrip("/").rsplit("/", 1)[-1]


def task_kind(name_or_config: str | Mapping[str, Any]) -> str:
    """``"waiting_line"``, ``"puzzle"`` or ``"text"`` (words_to_sentence, paraphrase, summarize)."""
    name = _name_of(name_or_config)
    group = name.split("/", 1)[0] if "/" in name else ""
    kind = _GROUP_KIND.get(group)
    if kind is None and group.startswith("waiting_line"):  # e.g. waiting_line_n15
        kind = "waiting_line"
    if kind is None:
        op = task_op(name)
        if op in _WAITING_LINE_METRICS:
            kind = "waiting_line"
        elif op.startswith(("latin_square", "sudoku")):
            kind = "puzzle"
    if kind is None:
        raise ValueError(f"cannot tell the kind of ParallelBench task {name!r}")
    return kind


def max_new_tokens(name_or_config: str | Mapping[str, Any]) -> int:
    """Generation budget: 32 new tokens for waiting-line tasks, 64 for puzzles and text tasks."""
    return MAX_NEW_TOKENS[task_kind(name_or_config)]


def is_deterministic(name: str) -> bool:
    """Whether the task has exactly one correct answer.

    copy, reverse, sort, the ``*_index`` tasks and sudoku (unique solution) are deterministic;
    shuffle, the ``*_random`` tasks, latin squares and the open-ended text tasks are not.
    """
    kind = task_kind(name)
    op = task_op(name)
    if kind == "text":
        return False
    if kind == "puzzle":
        if op.startswith("sudoku"):
            return True
        if op.startswith("latin_square"):
            return False
        raise ValueError(f"unknown puzzle task {name!r}")
    if op in ("copy", "reverse", "sort") or op.endswith("_index"):
        return True
    if op == "shuffle" or op.endswith("_random"):
        return False
    raise ValueError(f"unknown waiting-line task {name!r}")


def metric_name(name_or_config: str | Mapping[str, Any]) -> str:
    """Official metric name of a task: the config's ``metric`` when a config is given, otherwise
    derived from the task name."""
    if isinstance(name_or_config, Mapping) and isinstance(name_or_config.get("metric"), str):
        return name_or_config["metric"]
    name = _name_of(name_or_config)
    kind = task_kind(name)
    op = task_op(name)
    if kind == "waiting_line":
        if op not in _WAITING_LINE_METRICS:
            raise ValueError(f"unknown waiting-line task {name!r}")
        return _WAITING_LINE_METRICS[op]
    if kind == "puzzle":
        if op.startswith("sudoku"):
            return "sudoku_score"
        if op.startswith("latin_square"):
            return "latin_square_score"
        raise ValueError(f"unknown puzzle task {name!r}")
    group = name.split("/", 1)[0]
    if group == "words_to_sentence" or op.startswith(("easy", "medium", "hard")):
        return "sentence_to_words_score"
    if "paraphrase" in name:
        return "paraphrase_score"
    if "summar" in name or "samsum" in name:
        return "summary_score"
    raise ValueError(f"unknown text task {name!r}")
