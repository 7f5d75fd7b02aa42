"""Confidence-factor parallel decoding, the second rule of Fast-dLLM (Wu et al. 2025).

Reference: ``get_transfer_index_dynamic`` in Fast-dLLM's ``llada/generate.py`` (``generate(..., factor=f)``). Per
step, sort the block's masked confidences descending ``c(1) >= c(2) >= ...`` and walk ``j = 1, 2, ...`` to the first
``j`` with ``c(j) < 1 - f / (j + 1)`` (``j = 1`` never fails: its threshold is -1); commit the ``j - 1`` most
confident slots. Two quirks of the reference are kept because its published numbers come from them: when no ``j``
fails, or when the first failing ``j`` is the last masked slot, every masked slot of the block is committed. At
temperature 0 tokens and NFE equal the reference (batch of one and equal-length batches).

Differences: MASK is never proposed; the committed slots are the row's top ``count`` by ``torch.topk`` over the
region (the reference: over the whole canvas row), which can differ only on exactly tied confidences.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from dlm_decode.core.state import DecodeState
from dlm_decode.samplers.base import Sampler, SamplerTraits, Selection, candidates, top_k_per_row


def factor_counts(conf: torch.Tensor, cand: torch.Tensor, factor: float) -> torch.Tensor:
    """[B, R] float64 confidences, [B, R] candidates -> [B] tokens to commit under the factor rule (with its quirk)."""
    n = cand.sum(1)  # [B]
    vals = torch.sort(torch.where(cand, conf, float("-inf")), dim=1, descending=True).values  # [B, R]
    j = torch.arange(1, vals.shape[1] + 1, device=conf.device, dtype=torch.float64)
    thresh = 1.0 - factor / (j + 1.0)
    thresh[0] = -1.0  # the most confident slot always passes
    fail = (vals < thresh) & (j[None, :] <= n[:, None])
    first = torch.where(fail.any(1), fail.float().argmax(1), n - 1)  # 0-based index of the first failure
    count = torch.where((first == 0) | (first == n - 1), first + 1, first)
    return torch.where(n > 0, count, torch.zeros_like(count))


@dataclass(frozen=True)
class Factor(Sampler):
    factor: float = 1.0

    name: ClassVar[str] = "factor"
    traits: ClassVar[SamplerTraits] = SamplerTraits(reads_candidates_only=True)

    def __post_init__(self) -> None:
        if not (isinstance(self.factor, int | float) and math.isfinite(self.factor) and self.factor > 0):
            raise ValueError(f"{self.name}: factor must be a finite number > 0, got {self.factor!r}")

    def select(self, state: DecodeState, logits: torch.Tensor, r0: int) -> Selection:
        cand = candidates(state, r0, r0 + logits.shape[1])
        x0, conf = self.proposals(state, logits, cand)
        k = factor_counts(conf, cand, self.factor)
        score = torch.where(cand, conf, float("-inf"))
        return Selection(commit=top_k_per_row(score, k) & cand, tokens=x0)
