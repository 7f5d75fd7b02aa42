"""Early commit on answer convergence (Li et al. 2025, "Diffusion Language Models Know the Answer Before Decoding",
Prophet).

Reference: ``generate()`` in Prophet's ``generate_earlyexit.py`` with ``should_early_exit``. The base decoder runs as
usual (LLaDA's fixed-budget low-confidence rule; ``base="threshold"`` stacks Prophet on Fast-dLLM's threshold rule);
before each commit the mean gap between the top-1 and top-2 **raw logits** over an answer region A is compared with
a staged threshold chosen by progress ``p = step / budget`` (step counted from 1 over the whole call, budget =
``DecodeConfig.steps`` or ``gen_length``): ``thresholds[0]`` if ``p < phases[0]``, ``thresholds[1]`` if
``p < phases[1]``, else ``thresholds[2]``; code default (7.5, 5.0, 2.5) at (0.33, 0.67), the paper's per-task table
(8.0, 5.0, 3.5) for GSM8K and (7.5, 5.0, 4.5) for code (see ``presets``). If ``gap >= tau(p)`` the row commits
every remaining MASK of the whole canvas with its proposal in this step and stops (``Selection.stop_rows``).

Answer region. The reference forces words at fixed generation offsets (its GSM8K recipe: "The answer is" at offsets
200, 201, 202, option ``constraints_text``) and watches ``answer_length`` (5) slots from ``answer_start_pos``:
``prefix_ids`` are written at ``prefix_offset, prefix_offset + 1, ...`` before the first forward (they are context,
never decoded; their trace stays -1) and the watched region starts at ``answer_offset`` (default: right after the
forced prefix). Like the reference, the gap is averaged over every watched slot, decoded or not. Without an answer
spec (no ``answer_offset``, no prefix) the documented fallback watches the still-masked slots of the row's current
block. An answer region outside the generation window is an error.

Differences: rows decide independently (the reference runs one row); MASK is never proposed in the all-in commit;
the gap uses the logits dtype (bf16 in the reference, fp32 on our tests). To fill the whole canvas in the exit step
the sampler asks the loop for logits of every slot from the block start (or the answer region, if earlier) to the
end of the canvas, so a cache has to compute those slots every step (the reference has no cache path).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from dlm_decode.core.config import DecodeConfig
from dlm_decode.core.state import DecodeState
from dlm_decode.samplers.base import Sampler, SamplerTraits, Selection, candidates
from dlm_decode.samplers.low_confidence import LowConfidence
from dlm_decode.samplers.threshold import Threshold

BASES = ("low_confidence", "threshold")


def answer_prefix_ids(tokenizer: Any, text: str = "The answer is") -> tuple[int, ...]:
    """Token ids of ``text`` word by word (each word encoded alone, no special tokens), like the reference's
    ``constraints_text`` "200:The|201:answer|202:is"."""
    ids: list[int] = []
    for word in text.split():
        ids.extend(tokenizer.encode(word, add_special_tokens=False))
    return tuple(ids)


def logit_gap(logits: torch.Tensor) -> torch.Tensor:
    """[B, R, V] -> [B, R] top-1 minus top-2 raw logit (float64)."""
    top2 = torch.topk(logits, 2, dim=-1).values
    return (top2[..., 0] - top2[..., 1]).to(torch.float64)


@dataclass(frozen=True)
class EarlyCommit(Sampler):
    thresholds: tuple[float, ...] = (7.5, 5.0, 2.5)
    phases: tuple[float, ...] = (0.33, 0.67)
    base: str = "low_confidence"
    threshold: float = 0.9  # only for base="threshold"
    answer_offset: int | None = None  # generation offset of the first watched slot
    answer_length: int = 5
    prefix_ids: tuple[int, ...] = ()  # forced tokens, e.g. answer_prefix_ids(tokenizer)
    prefix_offset: int = 200

    name: ClassVar[str] = "early_commit"

    def __post_init__(self) -> None:
        if len(self.thresholds) != 3 or not all(math.isfinite(t) for t in self.thresholds):
            raise ValueError(f"{self.name}: thresholds must be three finite numbers, got {self.thresholds!r}")
        if len(self.phases) != 2 or not 0.0 < self.phases[0] <= self.phases[1]:
            raise ValueError(f"{self.name}: phases must be two increasing progress fractions, got {self.phases!r}")
        if self.base not in BASES:
            raise ValueError(f"{self.name}: base must be one of {', '.join(BASES)}, got {self.base!r}")
        if self.answer_length < 1:
            raise ValueError(f"{self.name}: answer_length must be >= 1, got {self.answer_length!r}")
        self._base()  # validates the threshold

    def token_options(self) -> dict[str, tuple[tuple[int, ...], bool]]:
        return {"prefix_ids": (tuple(self.prefix_ids), True)}  # written into the canvas before the first forward

    # the base rule decides the budget, the step bound and the ordinary commits
    def _base(self) -> Sampler:
        return LowConfidence() if self.base == "low_confidence" else Threshold(self.threshold)

    @property
    def traits(self) -> SamplerTraits:  # type: ignore[override]
        return SamplerTraits(fixed_budget=self._base().traits.fixed_budget)

    def watched(self) -> tuple[int, int] | None:
        """Generation offsets [a0, a1) of the answer region, or None for the current-block fallback."""
        start = self.answer_offset
        if start is None and self.prefix_ids:
            start = self.prefix_offset + len(self.prefix_ids)
        return None if start is None else (start, start + self.answer_length)

    def check(self, config: DecodeConfig, num_blocks: int) -> None:
        # the base rule's budget checks (its ``traits.fixed_budget``), under this sampler's name in the messages
        super().check(config, num_blocks)
        n = config.gen_length
        spans = [("answer region", self.watched())]
        if self.prefix_ids:
            spans.append(("forced prefix", (self.prefix_offset, self.prefix_offset + len(self.prefix_ids))))
        for what, span in spans:
            if span is not None and (span[0] < 0 or span[1] > n):
                raise ValueError(
                    f"{self.name}: {what} [{span[0]}, {span[1]}) lies outside the generation window [0, {n})"
                )

    def max_block_steps(self, state: DecodeState) -> int:
        return self._base().max_block_steps(state)

    def forced_tokens(self, state: DecodeState) -> Selection | None:
        """The forced answer prefix, written as context before the first forward."""
        if not self.prefix_ids:
            return None
        s = state.prompt_len + self.prefix_offset
        commit = torch.zeros_like(state.canvas, dtype=torch.bool)  # [B, T]
        commit[:, s : s + len(self.prefix_ids)] = True
        tokens = torch.full_like(state.canvas, state.mask_id)
        tokens[:, s : s + len(self.prefix_ids)] = torch.tensor(self.prefix_ids, dtype=torch.long, device=state.device)
        return Selection(commit=commit, tokens=tokens)

    def begin_block(self, state: DecodeState) -> None:
        self._base().begin_block(state)

    def region(self, state: DecodeState) -> tuple[int, int]:
        r0 = state.block_start
        span = self.watched()
        if span is not None:
            r0 = min(r0, state.prompt_len + span[0])
        return r0, state.total_length

    def tau(self, state: DecodeState) -> float:
        progress = (state.step + 1) / state.steps  # over the call's whole budget
        t = self.thresholds
        return t[0] if progress < self.phases[0] else t[1] if progress < self.phases[1] else t[2]

    def select(self, state: DecodeState, logits: torch.Tensor, r0: int) -> Selection:
        b, r = logits.shape[:2]
        s, e = state.block_start, int(state.block_end.max())
        inner = self._base().select(state, logits[:, s - r0 : e - r0], s)  # the ordinary step on the block
        commit = torch.zeros(b, r, dtype=torch.bool, device=logits.device)
        commit[:, s - r0 : e - r0] = inner.commit
        tokens = torch.full((b, r), state.mask_id, dtype=torch.long, device=logits.device)
        tokens[:, s - r0 : e - r0] = inner.tokens

        cand = candidates(state, r0, r0 + r)  # [B, R] masked slots of the current block
        span = self.watched()
        if span is None:  # fallback: the still-masked slots of the current block
            watch = cand
        else:
            idx = torch.arange(r0, r0 + r, device=logits.device)
            a0, a1 = state.prompt_len + span[0], state.prompt_len + span[1]
            watch = ((idx >= a0) & (idx < a1))[None, :].expand(b, r)
        n = watch.sum(1)
        gap = torch.where(watch, logit_gap(logits), 0.0).sum(1) / n.clamp(min=1)  # [B]
        stop = (gap >= self.tau(state)) & (n > 0) & cand.any(1)
        if not bool(stop.any()):
            return Selection(commit=commit, tokens=tokens)
        x0, _ = self.proposals(state, logits)  # proposals for every slot of the region
        rest = state.is_masked()[:, r0 : r0 + r] & stop[:, None]
        rest[:, : max(0, state.prompt_len - r0)] = False
        return Selection(
            commit=torch.where(stop[:, None], rest, commit),
            tokens=torch.where(stop[:, None], x0, tokens),
            stop_rows=stop,
        )
