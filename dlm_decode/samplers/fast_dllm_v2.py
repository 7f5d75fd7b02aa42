"""Fast-dLLM v2's decoding rule (Wu et al. 2025, "Fast-dLLM v2: Efficient Block-Diffusion LLM"; ``ALGORITHMS.md``
§14): blocks split into sub-blocks decoded left to right, each step committing every masked slot of the sub-block
over a confidence threshold plus its most confident one.

Reference: ``batch_sample`` of NVlabs/Fast-dLLM ``v2/generation_functions.py`` (and the hub ``modeling.py``'s
``generate``, the same rule for one row). Per block of ``block_length`` (32), sub-blocks of ``small_block_size`` (8),
left to right; while the current sub-block has a MASK: one forward of the block, logits shifted by one (slot i from
hidden i - 1), proposals the argmax (temperature 0) with their softmax probabilities, and the masked slots of the
sub-block with probability ``> threshold`` (strict) are committed together with the sub-block's most probable masked
slot (the first on ties, ``argmax``). Threshold 1 (the evaluation scripts' setting for gsm8k / math / ifeval) is one
slot per step.

The block's first slot. Its predicting hidden state is the previous block's last one, which does not see the block
(block-causal attention), so its token is fixed once the previous block is. The reference takes it as the argmax of
the last logit of the forward that writes the finished previous block into its cache (the prefill's forward when the
prompt ends on a block boundary), before the block's first sub-block step. Here the exact ``prefix`` cache writes the
finished block in the next block's first forward (``cache.plans.exact_block_plan``), which computes that same hidden
state from the same finished block and prefix: so this rule's first step of such a block commits that slot alone,
with that argmax (also at temperature > 0, as the reference), and the sub-block steps that follow see the same canvas
as the reference's. Same tokens; the same number of forwards (the reference's cache-write forward is our first step),
the first of them over two blocks instead of one. A block that starts inside the prompt has no such step.

The stop (the loop's, ``decode.blocks``): a row stops after the block holding its first EOS (config.json's
``eos_token_id``: 151645, the reference's ``stop_token``), as ``batch_sample`` does; the tokens up to and including that
EOS are the reference's (its later slots become the reference's ``pad_token_id``, here EOS).

Differences from the reference, on purpose:

* a prompt of exactly one block: ``batch_sample`` prefills only when the prompt is *longer* than a block, so such a
  prompt is never seen (its first generated block is decoded from position 0 without it). Here the prompt is
  prefilled as any other.
* rows of different prompt lengths: ``batch_sample`` right-pads them and decodes the pads as masks; a row whose prompt
  ends on a block boundary later than the shortest one gets that block's first slot from its own hidden state (the
  shift's duplicated first logit), not the previous block's. Here rows are left-padded onto their own grids and each
  row decodes what it decodes alone (checked against ``generate`` and the engine).
* MASK is never proposed (the reference's argmax could propose it; a trained checkpoint does not).
* temperature > 0: the proposals are the loop's Gumbel draws with top-p (the same distribution as the reference's
  ``multinomial`` after top-p, other random numbers); the confidence is the probability under the unfiltered softmax
  of the logits, as the reference's ``p_1t``.
* ``use_block_cache`` (the reference's approximate sub-block cache) is the ``sub_block`` cache
  (``cache.sub_block.SubBlockCache``; ``--cache sub_block``); the default is the exact ``prefix`` cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from dlm_decode.core.state import DecodeState
from dlm_decode.samplers.base import Sampler, SamplerTraits, Selection, candidates
from dlm_decode.samplers.llada2 import check_unit, greedy_proposals


@dataclass(frozen=True)
class FastDLLMV2(Sampler):
    threshold: float = 0.9  # eval.py's; the evaluation scripts use 1.0 for gsm8k / math / ifeval
    small_block_size: int = 8

    name: ClassVar[str] = "fast_dllm_v2"
    traits: ClassVar[SamplerTraits] = SamplerTraits(reads_candidates_only=True)

    def __post_init__(self) -> None:
        check_unit(self.name, "threshold", self.threshold)
        s = self.small_block_size
        if isinstance(s, bool) or not isinstance(s, int) or s < 1:
            raise ValueError(f"{self.name}: small_block_size must be a positive integer, got {s!r}")

    def check(self, config, num_blocks: int) -> None:
        super().check(config, num_blocks)
        if config.block_length is not None and config.block_length % self.small_block_size:
            raise ValueError(
                f"{self.name}: block_length ({config.block_length}) must be a multiple of small_block_size "
                f"({self.small_block_size})"
            )

    def count_bounds(self, block: int, block_steps: int, gen_length: int) -> dict[str, tuple[int, str]]:
        return {"small_block_size": (block, "the block length")}  # sub-blocks of a block

    def begin_block(self, state: DecodeState) -> None:
        state.scratch[f"{self.name}.small_block_size"] = self.small_block_size  # read by the ``sub_block`` cache

    def propose(self, state: DecodeState, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, R, V] -> proposals and confidences [B, R]: argmax (never MASK) at temperature 0, else the loop's draws;
        the confidence is the proposal's probability under softmax(logits)."""
        if state.config.temperature == 0:
            return greedy_proposals(state, logits)
        tok, _ = self.proposals(state, logits)
        return tok, torch.softmax(logits, dim=-1).gather(-1, tok[..., None])[..., 0]

    def _sub_block_proposals(self, state, logits, busy, current, start) -> tuple[torch.Tensor, torch.Tensor]:
        """Proposals and confidences [B, R] of ``propose``, at temperature 0 computed on each row's current sub-block
        alone (``start``: [B] the block's first region column, ``current`` [B, 1] the sub-block, ``busy`` [B, 1] rows
        with one): the only slots a step commits, a ``small_block_size / block_length`` share of the [B, R, V] passes
        (most of a step's host time at a real vocabulary); per slot the same numbers. Elsewhere: meaningless."""
        b, r, v = logits.shape
        if state.config.temperature != 0 or r <= self.small_block_size:
            return self.propose(state, logits)
        first = start[:, None] + torch.where(busy, current, 0) * self.small_block_size  # [B, 1] its first column
        k = torch.arange(self.small_block_size, device=logits.device)
        cols = (first + k).clamp(0, r - 1)  # [B, S] (clamped columns lie outside the region: never read back)
        tok, conf = self.propose(state, logits.gather(1, cols[..., None].expand(b, -1, v)))  # [B, S]
        back = (torch.arange(r, device=logits.device)[None, :] - first).clamp(0, self.small_block_size - 1)  # [B, R]
        return tok.gather(1, back), conf.gather(1, back)

    def select(self, state: DecodeState, logits: torch.Tensor, r0: int) -> Selection:
        b, r, _ = logits.shape
        cand = candidates(state, r0, r0 + r)  # [B, R] masked slots of each row's block
        slot = torch.arange(r0, r0 + r, device=logits.device)  # [R] absolute canvas slots
        start = state.block_end - state.block_length  # [B] each row's grid block start
        offset = slot[None, :] - start[:, None]  # [B, R] offset in the block
        sub = torch.div(offset, self.small_block_size, rounding_mode="floor")
        big = torch.iinfo(sub.dtype).max
        current = torch.where(cand, sub, big).min(1, keepdim=True).values  # [B, 1] first sub-block with a MASK
        in_sub = cand & (sub == current)  # [B, R]
        tok, conf = self._sub_block_proposals(state, logits, in_sub.any(1, keepdim=True), current, start - r0)
        score = torch.where(in_sub, conf, float("-inf"))
        commit = in_sub & (score > self.threshold)
        top = score.argmax(1)  # [B] the sub-block's most probable masked slot (the first on ties)
        commit[torch.arange(b, device=logits.device), top] |= in_sub.any(1)
        first = cand & (offset == 0)  # [B, R] the block's first slot, still masked: committed alone, argmax
        lead = first.any(1, keepdim=True)
        if state.config.temperature != 0:
            tok = torch.where(first, greedy_proposals(state, logits)[0], tok)
        return Selection(commit=torch.where(lead, first, commit), tokens=tok)
