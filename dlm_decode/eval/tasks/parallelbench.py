"""ParallelBench waiting-line and puzzle tasks for lm-eval, over the official jsonl files (never copied here).

Data directory, first found: the task metadata key ``parallelbench_dir`` (``--metadata parallelbench_dir=DIR`` on
the CLI, ``TaskManager(metadata={"parallelbench_dir": DIR})`` in Python), then ``$DLM_PARALLELBENCH_DATA``, then
``../shared/data/parallelbench`` beside the repository checkout.

Each sample's prompt is the official multi-turn chat (in-context examples as user/assistant turns) from
:func:`dlm_decode.parallelbench.tasks.build_messages`, rendered by the model's chat template: the tasks need
lm-eval's ``--apply_chat_template`` (``apply_chat_template=True`` in ``simple_evaluate``) and refuse to run without
it rather than score a prompt the benchmark never uses. Outputs are scored by
:func:`dlm_decode.parallelbench.metrics.score_sample` (``score`` lenient, ``score_strict``); generation stops at EOS
only (``until: []``) with the paper's budgets (32 new tokens for waiting line, 64 for puzzles). With the
``dlm_decode`` model each sample also reports ``nfe`` and ``tokens_per_step``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from dlm_decode.eval.answers import StatsTask
from dlm_decode.parallelbench.metrics import score_sample
from dlm_decode.parallelbench.tasks import answer_text, build_messages, load_task

DATA_ENV = "DLM_PARALLELBENCH_DATA"
_BESIDE_REPO = Path(__file__).resolve().parents[4] / "shared" / "data" / "parallelbench"


def data_dir(explicit: str | os.PathLike | None = None) -> Path:
    for candidate in (explicit, os.environ.get(DATA_ENV)):
        if candidate:
            path = Path(candidate)
            if not path.is_dir():
                raise FileNotFoundError(f"ParallelBench data directory not found: {str(path)!r}")
            return path
    if _BESIDE_REPO.is_dir():
        return _BESIDE_REPO
    raise FileNotFoundError(
        "no ParallelBench data directory: pass --metadata parallelbench_dir=DIR (Python: "
        f"TaskManager(metadata={{'parallelbench_dir': DIR}})) or set ${DATA_ENV}; DIR holds the official "
        "waiting_line/ and puzzle/ folders (task_config.yaml + <task>.jsonl)"
    )


def load(task: str, parallelbench_dir: str | None = None, **_: Any):
    """lm-eval ``custom_dataset``: the task's samples as a one-split DatasetDict (nested fields kept as JSON)."""
    import datasets

    t = load_task(data_dir(parallelbench_dir), task)
    rows = [
        {
            "index": i,
            "task": t.name,
            "metric": t.metric,
            "messages": json.dumps(build_messages(t.config, s)),
            "sample": json.dumps(s),
        }
        for i, s in enumerate(t.samples)
    ]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def doc_to_text(doc: dict) -> str:
    """The final user turn (what lm-eval shows in ``--write_out``); the model sees the whole chat."""
    return json.loads(doc["messages"])[-1]["content"]


def doc_to_target(doc: dict) -> str:
    return answer_text(json.loads(doc["sample"])["answer"])


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    prediction = results[0]
    out = dict(score_sample(doc["metric"], prediction, json.loads(doc["sample"])))
    stats = getattr(prediction, "stats", None)  # StatsTask hands over the dlm_decode model's decoding statistics
    if stats:
        out["nfe"] = float(stats["nfe"])
        out["tokens_per_step"] = float(stats["tokens_per_step"])
    return out


class ParallelBenchTask(StatsTask):
    """Builds each context from the sample's official chat instead of lm-eval's few-shot machinery."""

    def fewshot_context(
        self,
        doc: dict,
        num_fewshot: int,
        system_instruction: str | None = None,
        apply_chat_template: bool = False,
        fewshot_as_multiturn: bool = False,
        chat_template: Any = None,
        gen_prefix: str | None = None,
    ) -> str:
        if not (apply_chat_template and chat_template):
            raise ValueError(
                f"{self.config.task} is a chat task (ParallelBench prompts are multi-turn chats): run it with "
                "--apply_chat_template (simple_evaluate(..., apply_chat_template=True))"
            )
        messages = json.loads(doc["messages"])
        if system_instruction:
            messages = [{"role": "system", "content": system_instruction}, *messages]
        return chat_template(messages)
