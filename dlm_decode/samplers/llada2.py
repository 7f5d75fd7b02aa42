"""LLaDA2.0's decoding rule (inclusionAI 2025, "LLaDA2.0"; ``ALGORITHMS.md`` §12): a strict confidence threshold
with a fallback to the step's scheduled count.

Reference: ``LLaDA2MoeModelLM.generate()`` (ZHZisZZ/dllm ``dllm/pipelines/llada2/models/modeling_llada2_moe.py``).
Per block, up to ``steps`` forwards (``steps = min(DecodeConfig.steps, gen_length)``: the reference's ``steps`` is
*per block*); step s has the scheduled count n_s, the block length B split evenly over the steps (``B // steps``,
the first ``B % steps`` get one more; over the whole B even for the prompt's partial block). The masked slots whose
proposal probability is ``> threshold`` (strict) are committed when there are at least n_s of them, else the n_s
most confident (``torch.topk``). Threshold 1.0 is the pure schedule, 0.0 commits every mask at once.

Probabilities are the softmax of the logits in their own dtype over the whole vocabulary, as the reference; the
proposal is the argmax over every id but MASK (the reference could propose MASK; a model that does is broken).
At temperature > 0 the proposals are the loop's Gumbel draws, not the reference's multinomial (same distribution,
other random numbers). The block grid, the EOS stop and the exact cache belong to the loop (``decode.blocks``,
``cache.plans.exact_block_plan``); on a bidirectional model this rule runs on the loop's relative blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from dlm_decode.core.state import DecodeState
from dlm_decode.options import is_real
from dlm_decode.samplers.base import Sampler, SamplerTraits, Selection, candidates, top_k_per_row


def check_unit(owner: str, key: str, value: object) -> None:
    """A probability threshold in [0, 1] (0: commit every mask at once, 1: the pure schedule)."""
    if not is_real(value) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{owner}: {key} must be a number in [0, 1], got {value!r}")


def block_schedule(block_length: int, steps: int, device: torch.device) -> torch.Tensor:
    """``_get_num_transfer_tokens``: [steps] counts, B split evenly, the first ``B % steps`` one more."""
    base, rem = divmod(block_length, steps)
    return base + (torch.arange(steps, device=device) < rem).long()


def greedy_proposals(state: DecodeState, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, R, V] -> proposals and their probabilities [B, R] as the LLaDA2 references compute them at temperature 0
    (softmax in the logits' dtype over the whole vocabulary; MASK never proposed)."""
    probs = torch.softmax(logits, dim=-1)
    tok = probs.index_fill(-1, torch.tensor([state.mask_id], device=logits.device), -1.0).argmax(-1)
    return tok, probs.gather(-1, tok[..., None])[..., 0]


def threshold_or_top(conf: torch.Tensor, cand: torch.Tensor, threshold: float, n: torch.Tensor) -> torch.Tensor:
    """[B, R] bool: candidates with conf > threshold where a row has at least n[b] of them, else its top n[b]."""
    high = cand & (conf > threshold)
    enough = high.sum(1) >= n  # [B]
    top = top_k_per_row(torch.where(cand, conf, float("-inf")), torch.minimum(n, cand.sum(1))) & cand
    return torch.where(enough[:, None], high, top)


@dataclass(frozen=True)
class LLaDA2(Sampler):
    threshold: float = 0.95

    name: ClassVar[str] = "llada2"
    traits: ClassVar[SamplerTraits] = SamplerTraits(reads_candidates_only=True)

    def __post_init__(self) -> None:
        check_unit(self.name, "threshold", self.threshold)

    def steps_per_block(self, state: DecodeState) -> int:
        return max(1, min(state.steps, state.gen_length))

    def max_block_steps(self, state: DecodeState) -> int:
        return self.steps_per_block(state)

    def begin_block(self, state: DecodeState) -> None:
        state.scratch[self.name] = block_schedule(state.block_length, self.steps_per_block(state), state.device)

    def propose(self, state: DecodeState, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if state.config.temperature == 0:
            return greedy_proposals(state, logits)
        return self.proposals(state, logits)

    def select(self, state: DecodeState, logits: torch.Tensor, r0: int) -> Selection:
        x0, conf = self.propose(state, logits)  # [B, R] each
        cand = candidates(state, r0, r0 + logits.shape[1])
        n = state.scratch[self.name][state.block_step].expand(state.batch)  # [B]
        return Selection(commit=threshold_or_top(conf, cand, self.threshold, n), tokens=x0)
