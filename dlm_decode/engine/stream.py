"""What a request may stream: the part of its answer that can no longer change, as token ids and as text.

``settled_ids``: the longest run of committed generation slots from the answer's start, cut before the first end id
(the answer ends there). Which commits count as final depends on the rule:

* most samplers never rewrite a committed slot, so every committed slot of that run is final, whatever block it
  lies in (on bidirectional models tokens commit out of order: the run grows when its first gap is filled);
* a sampler that can rewrite committed slots (token editing, ``SamplerTraits.edits``) or cut the canvas behind them
  (Learn2PD's End-of-Text Prediction, ``eotp``) makes a slot final only when its block has ended (token editing stays
  inside the current block, and a cut lands in it too), so only the finished blocks stream;
* on block-causal models this is each finished block as it ends, plus, for the non-editing rules, the committed
  run inside the current one.

``TextStream`` turns a growing id run into text deltas: it holds back the last token's text (a tokenizer may join
it with the next one) and any incomplete UTF-8 tail, so nothing it emits is ever taken back; the deltas joined equal
the text of the finished request.
"""

from __future__ import annotations

from typing import Any

import torch

from dlm_decode.decode.loop import Unit


def _final_by_block(unit: Unit) -> bool:
    smp = unit.sampler
    return bool(smp.traits.edits or getattr(smp, "eotp", False))


def settled_ids(unit: Unit, done: bool) -> tuple[list[int], bool]:
    """(the answer ids that are final now, whether the answer is complete: an end id reached or ``done``)."""
    state = unit.state
    p, n = state.prompt_len, state.gen_length
    gen = state.canvas[0, p : p + n]  # [L]
    limit = n
    if not done and _final_by_block(unit):
        start = state.cursor.block_starts if unit.in_block else state.cursor.next_start
        limit = max(0, int(start[0]) - p)
    head = gen[:limit]
    masked = (head == state.mask_id).nonzero()
    run = head if len(masked) == 0 else head[: int(masked[0])]
    ends = torch.isin(run, state.eos_ids).nonzero()
    if len(ends):
        return run[: int(ends[0])].tolist(), True
    return run.tolist(), done


class TextStream:
    """Text deltas of a growing run of final ids (see the module docstring)."""

    def __init__(self, tokenizer: Any | None) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []  # the final ids seen so far
        self.sent_ids = 0  # ids already handed out as id deltas
        self.text = ""  # text already handed out

    def update(self, ids: list[int], complete: bool) -> tuple[list[int], str]:
        """The new final ids and the new text since the last call (``ids`` extends the previous run)."""
        if ids[: len(self.ids)] != self.ids:
            raise RuntimeError("a streamed token changed: the settled run must only grow")
        self.ids = ids
        new_ids = ids[self.sent_ids :]
        self.sent_ids = len(ids)
        if self.tokenizer is None:
            return new_ids, ""
        upto = ids if complete else ids[:-1]  # the last token's text may still merge with the next one's
        text = self.tokenizer.decode(upto, skip_special_tokens=True)
        if not complete:
            text = text.rstrip("\ufffd")  # an incomplete UTF-8 sequence waits for its next token
        if not text.startswith(self.text) or len(text) <= len(self.text):
            return new_ids, ""
        delta, self.text = text[len(self.text) :], text
        return new_ids, delta
