"""Self rows (``aux/self``): the model's own verified answers as training targets (rejection-sampling fine-tuning).

A random-output task (shuffle, insert / remove / replace at random) has many valid answers, and the training rows
draw a fresh one per row (``random_answer``): the target the model sees for a prompt is a distribution, and a model
that learned it only in part decodes, one token per step, mixtures of several answers (a person written twice, a
first name paired with another's last name). Self rows give such a task one answer per prompt that the model itself
already prefers: ``recipes/certainty_forcing/trajectories.py`` decodes fresh, non-official prompts with the model one
token per step and keeps an answer only when the task's verifier accepts it; a stage that names ``self`` trains on
those (prompt, answer) pairs with the ordinary objective, beside the generated rows that keep every other skill.
This is the data of rejection-sampling fine-tuning (Yuan et al., 2023, "Scaling Relationship on Learning
Mathematical Reasoning with Large Language Models"; STaR, Zelikman et al., 2022): the certainty-forcing runs on
these models, whose targets are the same trajectories, lifted shuffle from 80 to 91-95 one token per step
(``recipes/certainty_forcing/README.md``) while their LoRA and certainty loss cost the puzzles.

The other rows keep their real diversity, and the self rows are valid answers of the task: what the parallel
samplers get wrong on these tasks (two positions filled from two different answers) is still there to measure.
A run with a fixed shuffle answer (``data.shuffle_answer``, ``stream.fixed_shuffle``) skips the files' shuffle rows:
they hold other valid orders than the one its shuffle rows are trained on.

A decode-order row (``trajectories.py --states``) also names a state of the model's own decoding: ``masked`` (the
response slots still masked at that step), ``scored`` (those of the block being decoded) and ``next`` (those the
decoder committed from that state); it is trained in that state instead of a random draw (``objective.py``), on its
``scored`` slots, or with ``data.state_scoring: next`` on its ``next`` slots only: the choice the decoder makes
there, without also pulling every other open slot of the block towards the one answer the row holds.

``load_self_rows`` reads ``train.jsonl`` files of ``trajectories.py`` (task, prompt_ids, response_ids, score) and
refuses rows a stage must not train on: an unverified answer (``--keep-unverified`` runs), a response whose length is
not its task's canvas, an unknown task, token ids outside the tokenizer, and any prompt equal, token for token, to the
prompt of an excluded sample (the official test samples and the held-out evaluation samples), checked here against
the prompts this tokenizer builds for them, not taken on trust from the file's producer.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from recipes.train_demo.stream import fixed_answer_tasks

Row = tuple  # (prompt ids, response ids, task) or, for a decode-order row, (..., (masked slots, scored slots))


def load_self_rows(
    paths: Sequence[str | Path],
    *,
    vocab_size: int,
    canvas: Mapping[str, int],
    excluded_prompts: set[tuple[int, ...]],
    state_scoring: str = "block",
    shuffle_answer: str = "random",
) -> tuple[list[Row], dict[str, Any]]:
    """The rows of ``paths`` (``trajectories.py`` ``train.jsonl`` files) and a summary (rows per task, dropped, and
    ``sha256`` over the files' bytes in order: a resumed run must train on the same self rows).

    ``canvas``: task -> its response length (the official gen length); ``excluded_prompts``: prompt ids that must
    never be trained on. Raises ``ValueError`` naming the file and line for a row that cannot be a training target
    of this model; a prompt equal to an excluded one is dropped and counted (its sample was drawn independently of
    the exclusion list). ``state_scoring``: ``block`` scores a decode-order row's ``scored`` slots, ``next`` its
    ``next`` slots. ``shuffle_answer``: the stage's ``data.shuffle_answer``; under a fixed rule the rows of
    ``stream.fixed_answer_tasks`` are dropped and counted (the files' shuffle answers, other valid orders, are targets
    the stage must not train on), except those whose ``answer_rule`` is that rule (``trajectories.py
    --shuffle-answer``: they target that order)."""
    skip_tasks = fixed_answer_tasks(shuffle_answer)
    rows: list[Row] = []
    per_task: dict[str, int] = {}
    dropped = skipped = 0
    digest = hashlib.sha256()
    for path in paths:
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"--self-rows: {path} is not a file (give trajectories.py's train.jsonl)")
        data = path.read_bytes()
        digest.update(data)
        for n, line in enumerate(data.decode().split("\n"), 1):
            if not line.strip():
                continue
            where = f"--self-rows {path}, line {n}"
            try:
                r = json.loads(line)
                task, prompt, resp, score = r["task"], r["prompt_ids"], r["response_ids"], r["score"]
            except (json.JSONDecodeError, KeyError) as e:
                raise ValueError(f"{where}: not a trajectories.py row ({e})") from None
            if task not in canvas:
                raise ValueError(f"{where}: unknown task {task!r}; allowed: {', '.join(sorted(canvas))}")
            if score != 1.0:
                raise ValueError(f"{where}: an unverified answer (score {score}); self rows must be verified")
            if len(resp) != canvas[task]:
                raise ValueError(f"{where}: response of {len(resp)} tokens, {task}'s canvas is {canvas[task]}")
            ids = [*prompt, *resp]
            if not ids or min(ids) < 0 or max(ids) >= vocab_size:
                raise ValueError(f"{where}: token ids outside the tokenizer's {vocab_size}")
            state = decode_state(r, len(resp), where, state_scoring)
            if task in skip_tasks and r.get("answer_rule") != shuffle_answer:
                skipped += 1
                continue
            if tuple(prompt) in excluded_prompts:
                dropped += 1
                continue
            rows.append((list(prompt), list(resp), task, *state))
            per_task[task] = per_task.get(task, 0) + 1
    if not rows:
        raise ValueError(f"--self-rows: no usable row in {', '.join(map(str, paths))}")
    summary = {"rows": len(rows), "per_task": per_task, "dropped_excluded": dropped, "sha256": digest.hexdigest()}
    return rows, {**summary, "skipped_tasks": skipped} if skip_tasks else summary


# data.state_scoring -> the list of a decode-order row whose slots are scored
STATE_SCORING = {"block": "scored", "next": "next"}


def decode_state(row: Mapping[str, Any], length: int, where: str, scoring: str = "block") -> tuple:
    """() for an ordinary row; ``((masked, scored),)`` for a decode-order row, checked: response slot indices,
    the slots scored (its ``scored`` list, or with ``scoring`` ``next`` its ``next`` list) a non-empty subset of
    ``masked``."""
    if "masked" not in row and "scored" not in row:
        return ()
    if scoring not in STATE_SCORING:
        raise ValueError(f"state_scoring {scoring!r}; choose one of {', '.join(STATE_SCORING)}")
    key = STATE_SCORING[scoring]
    if key == "next" and "next" not in row:
        raise ValueError(
            f"{where}: data.state_scoring next needs the row's next slots; this file was written before "
            "trajectories.py recorded them (write it again, or use state_scoring block)"
        )
    masked, scored = row.get("masked"), row.get(key)
    ok = isinstance(masked, list) and isinstance(scored, list) and all(isinstance(i, int) for i in masked + scored)
    if not ok or not scored or not set(scored) <= set(masked) or min(masked) < 0 or max(masked) >= length:
        raise ValueError(
            f"{where}: a decode-order row needs masked and {key} lists of response slots (0-{length - 1}), {key} "
            "a non-empty subset of masked"
        )
    return ((tuple(masked), tuple(scored)),)
