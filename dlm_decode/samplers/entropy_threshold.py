"""Entropy-threshold parallel decoding, the test-time decoder of dParallel (Chen et al. 2025, "dParallel: Learnable
Parallel Decoding for dLLMs").

Reference: ``get_transfer_index_entropy`` in dParallel's ``generate.py`` (``generate(..., threshold=eta)``). Per step,
inside the current block, the entropy ``H = -sum p log(p + 1e-12)`` of the float64 softmax (the reference's epsilon)
is computed at every masked slot; the lowest-entropy masked slot is always committed, and every other masked slot
is committed unless ``H > eta``, i.e. ``H <= eta`` commits (the code's comparison; the paper writes ``H < eta``).
Tokens are the argmax (Gumbel-max at temperature > 0, as the reference). A block ends when it has no MASK left.
Defaults: eta 0.5 (LLaDA GSM8K/MATH/HumanEval), 0.45 for LLaDA MBPP; Dream uses 0.45 (GSM8K, MATH) and 0.5 (code).

Differences: MASK is never proposed; the lowest-entropy slot is chosen with ``torch.topk`` over the region (the
reference: over the canvas row), which can differ only on exactly tied entropies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from dlm_decode.core.frontier import MultiBlock
from dlm_decode.core.state import DecodeState
from dlm_decode.options import QUIET
from dlm_decode.samplers import multi_block
from dlm_decode.samplers.base import Sampler, SamplerTraits, Selection, candidates
from dlm_decode.samplers.threshold import top1


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """[B, R, V] logits -> [B, R] float64 entropy with dParallel's epsilon."""
    p = torch.softmax(logits.to(torch.float64), dim=-1)
    return -(p * torch.log(p + 1e-12)).sum(-1)


@dataclass(frozen=True)
class EntropyThreshold(Sampler):
    eta: float = 0.5
    # several blocks in flight (d3LLM's global rule, ``samplers.multi_block``); unset: one block at a time
    block_add_threshold: float | None = field(default=None, metadata=QUIET)
    decoded_token_threshold: float | None = field(default=None, metadata=QUIET)
    early_stop: bool = field(default=False, metadata=QUIET)  # d3LLM's early stop at the first end id
    # d3LLM's LLaDA decoder always takes the lowest-entropy mask of the open blocks; its Dream decoder does not
    global_best: bool = field(default=True, metadata=QUIET)

    name: ClassVar[str] = "entropy_threshold"
    traits: ClassVar[SamplerTraits] = SamplerTraits(reads_candidates_only=True)

    def __post_init__(self) -> None:
        if not (isinstance(self.eta, int | float) and math.isfinite(self.eta) and self.eta > 0):
            raise ValueError(f"{self.name}: eta must be a finite number > 0, got {self.eta!r}")
        multi_block.check_fields(self.name, self)
        if not isinstance(self.global_best, bool):
            raise ValueError(f"{self.name}: global_best must be true or false, got {self.global_best!r}")
        if not self.global_best and self.multi_block() is None:
            raise ValueError(
                f"{self.name}: global_best=false is d3LLM's Dream selection over several blocks in flight; set "
                "block_add_threshold and decoded_token_threshold too"
            )

    def multi_block(self) -> MultiBlock | None:
        return multi_block.rule_of(self, "global", self.early_stop)

    def select(self, state: DecodeState, logits: torch.Tensor, r0: int) -> Selection:
        cand = candidates(state, r0, r0 + logits.shape[1])
        x0, _ = self.proposals(state, logits, cand)
        h = entropy(logits)  # [B, R]
        sure = cand & (h <= self.eta)
        if state.cursor.frontier is not None:  # several blocks in flight
            commit = multi_block.global_pick(state, -h, sure, cand, r0, best=self.global_best)
            return Selection(commit=commit, tokens=x0)
        return Selection(commit=top1(-h, cand) | sure, tokens=x0)
