"""LLaDA2.1's token editing (inclusionAI 2026, "LLaDA2.1"; SGLang calls it JointThreshold; ``ALGORITHMS.md`` §12).

Reference: ``generate()`` of ZHZisZZ/dllm ``dllm/pipelines/llada21/models/modeling_llada21_moe.py``. Per block the
reference loops: an iteration that starts with no MASK in the block counts a post step, and the block ends once
more than ``max_post_steps`` of them were counted. Each iteration is one forward; x0 and p are the proposals and
their probabilities. Masks: those with p > ``threshold`` (strict) when at least ``num_to_transfer`` of them pass,
else the ``num_to_transfer`` most confident. Edits: every decoded, non-prompt slot of the block whose x0 differs
from its token and whose p > ``editing_threshold`` is rewritten with x0. Both apply; the block also ends after an
iteration that started with no MASK and edited nothing. ``DecodeConfig.steps`` is unused.

Defaults are the reference's: threshold 0.95, editing_threshold 0.9, max_post_steps 16, num_to_transfer 1.

Differences, on purpose: the loop stops a row after the block holding its first EOS (the reference without
``eos_early_stop`` runs every block); a finished block never changes again, so the answer, the tokens up to the
first EOS, is the same, with fewer forwards. At temperature 0 the proposal is the argmax of the logits (the 2.1
reference's own choice); at temperature > 0 the loop's Gumbel draws stand in for the reference's multinomial.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from dlm_decode.core.state import DecodeState
from dlm_decode.options import check_count
from dlm_decode.samplers.base import Sampler, SamplerTraits, Selection, candidates, editable
from dlm_decode.samplers.llada2 import check_unit, threshold_or_top


@dataclass(frozen=True)
class TokenEditing(Sampler):
    threshold: float = 0.95
    editing_threshold: float = 0.9
    max_post_steps: int = 16
    num_to_transfer: int = 1

    name: ClassVar[str] = "token_editing"
    traits: ClassVar[SamplerTraits] = SamplerTraits(edits=True)

    def __post_init__(self) -> None:
        check_unit(self.name, "threshold", self.threshold)
        check_unit(self.name, "editing_threshold", self.editing_threshold)
        check_count(self.name, "num_to_transfer", self.num_to_transfer)
        if not isinstance(self.max_post_steps, int) or isinstance(self.max_post_steps, bool) or self.max_post_steps < 0:
            raise ValueError(f"{self.name}: max_post_steps must be an integer >= 0, got {self.max_post_steps!r}")

    def count_bounds(self, block: int, block_steps: int, gen_length: int) -> dict[str, tuple[int, str]]:
        return {"num_to_transfer": (block, "the block length")}  # tokens committed per step, of one block

    def max_block_steps(self, state: DecodeState) -> int:
        """Every iteration with a MASK commits one at least, then at most ``max_post_steps`` more: the bound."""
        return int((state.block_end - state.block_start).max()) + self.max_post_steps + 1

    def begin_block(self, state: DecodeState) -> None:
        zero = torch.zeros(state.batch, dtype=torch.long, device=state.device)
        state.scratch[self.name] = {"post": zero, "open": ~state.finished.clone()}

    def block_open(self, state: DecodeState) -> torch.Tensor:
        """[B] rows still iterating on their block (with or without a MASK left)."""
        return state.scratch[self.name]["open"] & ~state.finished

    def propose(self, state: DecodeState, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if state.config.temperature > 0:
            return self.proposals(state, logits)
        probs = torch.softmax(logits, dim=-1)
        tok = logits.index_fill(-1, torch.tensor([state.mask_id], device=logits.device), float("-inf")).argmax(-1)
        return tok, probs.gather(-1, tok[..., None])[..., 0]

    def select(self, state: DecodeState, logits: torch.Tensor, r0: int) -> Selection:
        r1 = r0 + logits.shape[1]
        x0, conf = self.propose(state, logits)  # [B, R] each
        mem = state.scratch[self.name]
        rows = self.block_open(state)[:, None]  # [B, 1]
        cand = candidates(state, r0, r1) & rows
        n = torch.full((state.batch,), self.num_to_transfer, device=state.device)
        commit = threshold_or_top(conf, cand, self.threshold, n)
        edit = editable(state, r0, r1) & rows & (conf > self.editing_threshold) & (x0 != state.canvas[:, r0:r1])
        had_masks = cand.any(1)  # [B]
        masks_after = (cand & ~commit).any(1)
        post = mem["post"] + (~masks_after).long()  # the next iteration's count, were it to start
        mem["open"] = mem["open"] & ~(~had_masks & ~edit.any(1)) & (post <= self.max_post_steps)
        mem["post"] = post
        return Selection(commit=commit, tokens=x0, edit=edit)
