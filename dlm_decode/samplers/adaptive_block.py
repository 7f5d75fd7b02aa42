"""Semantic-aware adaptive block sizes (Lu et al. 2025, "AdaBlock-dLLM: Semantic-Aware Diffusion LLM Inference via
Adaptive Block Size").

Reference: ``generate_adablock`` and ``compute_block_length`` in AdaBlock's ``llada/generate_adablock.py`` (Dream:
``_compute_block_length`` in ``dream/model/generation_utils_adablock.py``). The first forward of each block is also
its first denoising step. From it, look at the predicted tokens of a window of ``min(int(0.25 * gen_length),
remaining)`` slots starting at the block start; among window slots whose prediction is a delimiter take the most
confident one (the first on ties); if its confidence is ``>= delimiter_threshold`` the block ends on it (inclusive),
else the block is ``min(B0, remaining)`` slots long. ``B0`` is the loop's ``block_length`` (default 32). The block is
then decoded with Fast-dLLM's threshold rule (``threshold``, default 0.9: the top-1 plus every masked slot with
confidence ``>= threshold``). ``delimiter_threshold = inf`` reproduces fixed blocks (equal to ``threshold``).

Defaults follow the reference eval scripts: LLaDA ``delimiter_ids=(198,)`` (newline) with ``delimiter_threshold``
0.3; Dream ``DREAM_DELIMITER_IDS`` (the newline-bearing Qwen ids hard-coded in the reference) with 0.5 (see
``presets``). For another tokenizer (the demo models) use ``delimiter_ids_from_tokenizer(tok)``.

Batches: each row gets its own block ends (the reference runs one row); rows that finish a block wait for the others,
then every row starts its next block where its own previous one ended, so a row decodes as it would alone. The
chosen sizes are returned in ``out.scratch["adaptive_block"]`` (per block, per row; -1 for a finished row).
Differences: confidences are float64 softmax probabilities (the reference computes the delimiter confidence in the
logits dtype); MASK is never proposed; the top-1 of the threshold rule comes from ``torch.topk`` (reference: argmax).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from dlm_decode.core.state import DecodeState
from dlm_decode.options import check_probability
from dlm_decode.samplers.base import Sampler, Selection, candidates
from dlm_decode.samplers.threshold import top1

LLADA_DELIMITER_IDS = (198,)
DREAM_DELIMITER_IDS = (
    198, 271, 280, 319, 340, 382, 401, 532, 624, 630, 692, 698, 921, 1248, 1837, 1939, 2219, 2533, 3276, 3876, 4894,
    5267, 14750, 68327,
)  # fmt: skip


def delimiter_ids_from_tokenizer(tokenizer: Any, marker: str = "\n") -> tuple[int, ...]:
    """Ids of every vocabulary token whose decoded text contains ``marker`` (a newline by default)."""
    ids = []
    for tid in sorted(tokenizer.get_vocab().values()):
        if marker in tokenizer.decode([tid]):
            ids.append(tid)
    return tuple(ids)


@dataclass(frozen=True)
class AdaptiveBlock(Sampler):
    delimiter_ids: tuple[int, ...] = LLADA_DELIMITER_IDS
    delimiter_threshold: float = 0.3
    threshold: float = 0.9
    window_fraction: float = 0.25

    name: ClassVar[str] = "adaptive_block"

    def __post_init__(self) -> None:
        check_probability(self.name, "threshold", self.threshold)
        if math.isnan(self.delimiter_threshold):
            raise ValueError(f"{self.name}: delimiter_threshold must be a number (inf for fixed blocks), got nan")
        check_probability(self.name, "window_fraction", self.window_fraction)
        if any(i < 0 for i in self.delimiter_ids):
            raise ValueError(f"{self.name}: delimiter_ids must be token ids >= 0, got {self.delimiter_ids!r}")

    def token_options(self) -> dict[str, tuple[tuple[int, ...], bool]]:
        return {"delimiter_ids": (tuple(self.delimiter_ids), False)}  # looked for among the proposals (never MASK)

    def with_model(self, facts: Any) -> AdaptiveBlock:
        if facts is not None and getattr(facts, "block_causal", False):
            raise ValueError(
                f"{self.name}: moves block ends, but the block-causal model {facts.model_type!r} attends on a fixed "
                "block grid (its blocks are its attention mask); use llada2, threshold or another within-block rule"
            )
        return self

    def _window(self, state: DecodeState) -> torch.Tensor:  # [B] window length per row
        remaining = state.gen_end - state.block_starts
        return torch.clamp(remaining, max=int(self.window_fraction * state.gen_length)).clamp(min=0)

    def _b0(self, state: DecodeState) -> torch.Tensor:  # [B] default block end per row
        return torch.minimum(state.block_starts + state.block_length, state.gen_end)

    def max_block_steps(self, state: DecodeState) -> int:
        # >= 1 commit per step, so a block never takes more steps than its length (at most window or B0)
        ends = torch.maximum(state.block_starts + self._window(state), self._b0(state))
        return max(1, int((ends - state.block_start).max()))

    def region(self, state: DecodeState) -> tuple[int, int]:
        if state.block_step == 0:  # the window may reach past the default block
            ends = torch.maximum(state.block_starts + self._window(state), self._b0(state))
            return state.block_start, int(ends.max())
        return state.region()

    def _block_ends(self, state: DecodeState, x0: torch.Tensor, conf: torch.Tensor, r0: int) -> torch.Tensor:
        """[B] new exclusive block ends from the block's first forward (``compute_block_length``)."""
        b, r = x0.shape
        idx = torch.arange(r0, r0 + r, device=x0.device)  # [R] canvas slots of the region
        start = state.block_starts[:, None]
        in_window = (idx[None, :] >= start) & (idx[None, :] < start + self._window(state)[:, None])  # [B, R]
        ids = torch.tensor(self.delimiter_ids, dtype=torch.long, device=x0.device)
        is_delim = in_window & torch.isin(x0, ids)
        score = torch.where(is_delim, conf, -1.0)
        best = score.argmax(1)  # first maximum
        best_conf = score.gather(1, best[:, None])[:, 0]
        hit = is_delim.any(1) & (best_conf >= self.delimiter_threshold)
        return torch.where(hit, r0 + best + 1, self._b0(state))

    def select(self, state: DecodeState, logits: torch.Tensor, r0: int) -> Selection:
        x0, conf = self.proposals(state, logits)  # [B, R], [B, R] float64
        block_end = None  # [B] the block's new ends, returned to the loop at the block's first step
        if state.block_step == 0:
            todo = ~state.finished
            block_end = torch.where(todo, self._block_ends(state, x0, conf, r0), state.block_end)
            sizes = torch.where(todo, block_end - state.block_starts, -1)
            state.scratch.setdefault(self.name, []).append(sizes.tolist())  # block sizes per row (-1: idle)
        cand = candidates(state, r0, r0 + logits.shape[1], block_end)  # within the new ends
        commit = top1(conf, cand) | (cand & (conf >= self.threshold))
        return Selection(commit=commit, tokens=x0, block_end=block_end)
