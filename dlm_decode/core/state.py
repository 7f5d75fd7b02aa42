"""The decoding state: one object holding everything a step reads or writes (no module globals).

Canvas coordinates are shared by all rows: prompts are left-padded to a common length ``P`` and generation slots
are ``[P, P + L)`` for every row. Padded slots are invisible keys (``key_mask``) and rope positions count only real
tokens (``cumsum(mask) - 1``), so a padded row computes exactly what the same prompt computes alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dlm_decode.core.config import DecodeConfig


@dataclass
class DecodeState:
    canvas: torch.Tensor  # [B, T] token ids; MASK at undecoded slots
    positions: torch.Tensor  # [B, T] rope positions
    valid: torch.Tensor  # [B, T] bool, False on left padding
    prompt_len: int  # P: first generation slot
    config: DecodeConfig
    mask_id: int
    eos_ids: torch.Tensor  # [E] ids that end a row's answer
    fill_id: int  # written after an early stop at EOS
    generator: torch.Generator
    block_length: int
    num_blocks: int
    block_index: int = 0
    block_start: int = 0  # slot where the current block starts (shared by all rows)
    block_end: torch.Tensor = field(default=None)  # [B] exclusive end of the current block per row
    block_starts: torch.Tensor = field(default=None)  # [B] each row's own block start (>= block_start; rows differ
    # only with variable blocks, where a sampler moves block_end and each row's next block starts at its old end)
    step: int = 0  # forwards so far in this call (NFE)
    block_step: int = 0  # forwards so far in the current block
    block_limit: int = 0  # forwards allowed in the current block (the sampler's bound; the last one finishes it)
    logit_shift: int = 0  # the model's: the hidden state predicting slot i sits at i - logit_shift (Dream: 1)
    finished: torch.Tensor = field(default=None)  # [B] bool: row needs no more forwards
    failed: list[str | None] = field(default_factory=list)  # per-row error message, None when fine
    gen_end: torch.Tensor = field(default=None)  # [B] slots at or after gen_end are cut (EoTP / EOS fill)
    trace: torch.Tensor = field(default=None)  # [B, L] step that committed each slot, -1 if none
    row_steps: torch.Tensor = field(default=None)  # [B] forwards each row took part in while unfinished
    tokens_per_step: list[list[int]] = field(default_factory=list)  # per step, commits per row
    token_forwards: int = 0  # query positions computed by the model (summed over rows and steps)
    scratch: dict = field(default_factory=dict)  # per-call memory of samplers and caches, keyed by owner

    @property
    def batch(self) -> int:
        return self.canvas.shape[0]

    @property
    def total_length(self) -> int:
        return self.canvas.shape[1]

    @property
    def gen_length(self) -> int:
        return self.config.gen_length

    @property
    def device(self) -> torch.device:
        return self.canvas.device

    def is_masked(self) -> torch.Tensor:  # [B, T]
        return self.canvas == self.mask_id

    def key_mask(self) -> torch.Tensor | None:  # [B, T] or None when no row is padded
        return None if bool(self.valid.all()) else self.valid

    def in_block(self) -> torch.Tensor:  # [B, T] bool: slot lies in the row's current block
        idx = torch.arange(self.total_length, device=self.device)
        return (idx >= self.block_start) & (idx < self.block_end[:, None])

    def block_masked(self) -> torch.Tensor:  # [B, T]: masked slots of the current block of unfinished rows
        return self.is_masked() & self.in_block() & ~self.finished[:, None]

    def region(self) -> tuple[int, int]:
        """Default logits region: the current block (widest row)."""
        return self.block_start, int(self.block_end.max())
