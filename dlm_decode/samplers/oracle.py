"""The "extremely greedy parallel" oracle of Learn2PD (Bao et al. 2025): a per-sample bound on parallel decoding
and the source of the filter's training data.

Reference: ``generate_data`` in Learn2PD's ``llada/generate_training_data.py``. First decode the prompt once with
LLaDA's low-confidence rule (one token per step by default) to get the reference answer ``y``. Then re-decode: at
every step commit exactly the masked block slots whose current proposal equals ``y`` (with ``y``'s token), and
record the block's confidence vector (probability of the proposal at every block slot, decoded or not) with the
labels ``proposal == y``. If a step's block proposals are all equal to the previous step's (the model is stuck),
the block is filled with ``y`` after that step's record, as the reference does. The number of forwards of the second
pass is the oracle NFE: the fewest steps a decoder can take that reproduces ``y`` from the model's own predictions.

``Oracle(reference=...)`` is the second pass as a sampler (not in the ``SAMPLERS`` registry: it needs each row's
reference answer); ``dlm_decode.decode.oracle.oracle_generate(model, prompts, ...)`` runs both passes.
Differences: confidences are float64 (the reference: model dtype); MASK is never proposed; a block is bounded by
``2 * block_length`` forwards (the loop then fills it with ``y``), where the reference relies on the stuck test
alone.

Block-causal models (LLaDA2): the reference answer is the open-ended one-token-per-step decode, which ends after the
block holding the first EOS (its later ``gen_length`` slots read the EOS fill). The oracle pass commits only ``y``'s
tokens, so its canvas equals the reference's block by block and it stops after the same block, never decoding the
filled slots. The last grid block may run past ``gen_length`` (the reference decodes it whole and returns
``gen_length`` tokens): those slots have no reference token, so the oracle takes its proposal there at once (label 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from dlm_decode.core.state import DecodeState
from dlm_decode.samplers.base import Sampler, Selection, block_slots, block_vectors, candidates


def check_reference(who: str, reference: tuple[tuple[int, ...], ...], gen_length: int) -> None:
    """Every row's reference answer is there and has ``gen_length`` tokens (checked before any forward)."""
    if not reference:
        raise ValueError(f"{who}: needs the reference answer of every row (see oracle_generate)")
    bad = [i for i, r in enumerate(reference) if len(r) != gen_length]
    if bad:
        raise ValueError(f"{who}: reference rows {bad} do not have gen_length ({gen_length}) tokens")


def reference_canvas(who: str, reference: tuple[tuple[int, ...], ...], state: DecodeState) -> torch.Tensor:
    """[B, T] canvas holding each row's reference answer after the prompt (MASK over the prompt), to compare a step's
    proposals with."""
    if len(reference) != state.batch:
        raise ValueError(f"{who}: {len(reference)} reference rows for a batch of {state.batch}")
    y = torch.full_like(state.canvas, state.mask_id)
    ref = torch.tensor(reference, dtype=torch.long, device=state.device)  # [B, gen_length]
    y[:, state.prompt_len : state.prompt_len + ref.shape[1]] = ref  # a block-causal canvas may run past gen_length
    return y


@dataclass(frozen=True)
class Oracle(Sampler):
    reference: tuple[tuple[int, ...], ...] = ()  # per row, the gen_length reference tokens
    record: bool = False  # keep (confidence, label) block vectors per step in the call's scratch

    name: ClassVar[str] = "oracle"

    def check(self, config, num_blocks: int) -> None:
        check_reference(self.name, self.reference, config.gen_length)

    def max_block_steps(self, state: DecodeState) -> int:
        return 2 * int((state.block_end - state.block_start).max())

    def begin_block(self, state: DecodeState) -> None:
        mem = state.scratch.setdefault(self.name, {"conf": [], "label": []})
        if "y" not in mem:
            mem["y"] = reference_canvas(self.name, self.reference, state)  # [B, T]
        mem["prev"] = None

    def select(self, state: DecodeState, logits: torch.Tensor, r0: int) -> Selection:
        mem = state.scratch[self.name]
        x0, conf = self.proposals(state, logits)  # [B, R]
        r = logits.shape[1]
        y = mem["y"][:, r0 : r0 + r]
        cand = candidates(state, r0, r0 + r)
        in_block = state.in_block()[:, r0 : r0 + r]
        free = y == state.mask_id  # past gen_length in a block-causal model's last grid block: no reference there
        correct = (x0 == y) | free
        y = torch.where(free, x0, y)
        active = cand.any(1)
        if self.record and bool(active.any()):  # each row's block as block_length columns (base.block_vectors)
            slots = block_slots(state, r0, r0 + r)
            mem["conf"].append(block_vectors(conf, slots)[active].float().cpu())
            mem["label"].append(block_vectors(correct, slots, fill=True)[active].cpu())
        prev = mem["prev"]
        stuck = torch.zeros_like(active) if prev is None else ((x0 == prev) | ~in_block).all(1)
        mem["prev"] = x0
        commit = cand & (correct | stuck[:, None])
        return Selection(commit=commit, tokens=y)
