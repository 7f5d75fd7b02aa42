"""Confidence-threshold parallel decoding (Wu et al. 2025, "Fast-dLLM: Training-free Acceleration of Diffusion LLM
by Enabling KV Cache and Parallel Decoding").

Reference: ``generate()`` in Fast-dLLM's ``llada/generate.py`` with ``threshold`` set (``get_transfer_index``).
Every step commits, inside the current block, the most confident masked slot plus every other masked slot whose
confidence (float64 softmax probability of the proposed token) is ``>= threshold``; a block ends when it has no
MASK left, so the step count is data-dependent (``DecodeConfig.steps`` is ignored). At temperature 0 the tokens and
the NFE equal the reference on the same checkpoint, batch of one and batch of equal-length prompts (the reference
loops over a block until no row has a MASK in it, like our loop).

Differences, on purpose: MASK is never proposed; the top-1 is picked with ``torch.topk`` over the region, the
reference over the whole canvas row, which can differ only on exactly tied confidences. Fast-dLLM's Dream variant
(``dream/model/generation_utils_block.py``) differs from its LLaDA one: the first forward of each block commits only
the block's first slot and confidences use the model dtype; we follow the LLaDA variant for both models.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from dlm_decode.core.frontier import MultiBlock
from dlm_decode.core.state import DecodeState
from dlm_decode.options import QUIET, check_probability
from dlm_decode.samplers import multi_block
from dlm_decode.samplers.base import Sampler, SamplerTraits, Selection, candidates, top_k_per_row


def top1(score: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
    """[B, R] bool: each row's single highest-scoring candidate (none for rows without candidates)."""
    return top_k_per_row(torch.where(cand, score, float("-inf")), cand.any(1).long(), kmax=1) & cand


@dataclass(frozen=True)
class Threshold(Sampler):
    threshold: float = 0.9
    # several blocks in flight (D2F's per-block rule, ``samplers.multi_block``); unset: one block at a time
    block_add_threshold: float | None = field(default=None, metadata=QUIET)
    decoded_token_threshold: float | None = field(default=None, metadata=QUIET)
    early_stop: bool = field(default=False, metadata=QUIET)  # no block opens after an end id (D2F)

    name: ClassVar[str] = "threshold"
    traits: ClassVar[SamplerTraits] = SamplerTraits(reads_candidates_only=True)

    def __post_init__(self) -> None:
        check_probability(self.name, "threshold", self.threshold)
        multi_block.check_fields(self.name, self)

    def multi_block(self) -> MultiBlock | None:
        return multi_block.rule_of(self, "per_block", self.early_stop)

    def select(self, state: DecodeState, logits: torch.Tensor, r0: int) -> Selection:
        cand = candidates(state, r0, r0 + logits.shape[1])
        x0, conf = self.proposals(state, logits, cand)  # [B, R], [B, R] float64
        sure = cand & (conf >= self.threshold)
        if state.cursor.frontier is not None:  # several blocks in flight
            return Selection(commit=multi_block.per_block(state, conf, sure, cand, r0), tokens=x0)
        return Selection(commit=top1(conf, cand) | sure, tokens=x0)
