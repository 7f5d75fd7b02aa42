"""The decoding state of one call, in three parts plus the canvas (no module globals).

* ``DecodeInputs``: what the call decodes with, fixed before the first forward (config, ids, lengths, RNG).
* ``BlockCursor``: where the loop stands (current block per row, step counters); only the loop moves it.
* ``DecodeStats``: what the loop records (trace, per-step commits, forwards, failures); read back at the end.

``DecodeState`` holds them with the canvas, the per-row finish flags and the samplers' / caches' ``scratch``, and
offers read-only views (``state.prompt_len``, ``state.block_end``, ...) so samplers and caches read one object but
cannot move the cursor: what a sampler changes comes back to the loop in its ``Selection``.

Canvas coordinates are shared by all rows: prompts are left-padded to a common length ``P`` and generation slots
are ``[P, P + L)`` for every row. Padded slots are invisible keys (``key_mask``) and rope positions count only real
tokens (``cumsum(mask) - 1``), so a padded row computes exactly what the same prompt computes alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from dlm_decode.core.config import DecodeConfig


@dataclass(frozen=True)
class DecodeInputs:
    """What one call decodes with; fixed once the call starts."""

    positions: torch.Tensor  # [B, T] rope positions
    valid: torch.Tensor  # [B, T] bool, False on left padding
    prompt_len: int  # P: first generation slot
    config: DecodeConfig  # with the sampler's reference defaults filled in
    mask_id: int
    eos_ids: torch.Tensor  # [E] ids that end a row's answer
    fill_id: int  # written after an early stop (EOS, cut, all-in commit)
    generator: torch.Generator  # every random draw of the call
    block_length: int  # resolved (``core.config.resolve_lengths``)
    num_blocks: int  # gen_length // block_length
    steps: int  # resolved total step budget of fixed-budget samplers
    key_mask: torch.Tensor | None = None  # [B, T] ``valid``, or None when no row is padded
    logit_shift: int = 0  # the model's: the hidden state predicting slot i sits at i - logit_shift (Dream: 1)
    # block-causal models (LLaDA2): blocks lie on each row's absolute position grid, the attention is block-causal,
    # and a row stops after the block that holds its first EOS (``decode.blocks``)
    block_causal: bool = False
    grid_offset: torch.Tensor | None = None  # [B] slot of position 0 in each row (its left padding)
    # D2F's attention on a bidirectional model (``DecodeConfig.attention``): a ``models.visibility.AnswerBlocks``
    answer_blocks: Any = None


@dataclass
class BlockCursor:
    """Where the loop stands. Blocks advance per row: a row's next block starts where its last one ended."""

    next_start: torch.Tensor  # [B] where each row's next block starts
    block_index: int = 0
    block_start: int = 0  # slot where the current block starts (shared: the earliest start of an unfinished row)
    block_starts: torch.Tensor | None = None  # [B] each row's own block start (>= block_start)
    step: int = 0  # forwards so far in this call (NFE)
    block_step: int = 0  # forwards so far in the current block
    block_limit: int = 0  # forwards allowed in the current block (the sampler's bound; the last one finishes it)
    # host copy of ``block_end.max()``, read at the step's sync (``region`` reads it instead of syncing); None
    # whenever ``block_end`` is set anew, so it is never stale
    widest_end: int | None = None
    # several blocks in flight (``core.frontier.Frontier``): the open blocks per row; the current "block" is then each
    # row's span from its first open block with a MASK to the end of its last opened one. None: one block at a time
    frontier: Any = None
    _block_end: torch.Tensor | None = field(default=None, repr=False)

    @property
    def block_end(self) -> torch.Tensor | None:
        """[B] exclusive end of the current block per row."""
        return self._block_end

    @block_end.setter
    def block_end(self, value: torch.Tensor | None) -> None:
        self._block_end = value
        self.widest_end = None


@dataclass
class DecodeStats:
    """What the loop records, kept on the device until the call ends (no host sync per step)."""

    trace: torch.Tensor  # [B, L] step that committed each slot, -1 if none
    row_steps: torch.Tensor  # [B] forwards each row took part in while unfinished
    accepted_steps: torch.Tensor  # [B] steps of the followed rule the row's commits stand for (= row_steps, except
    # for draft-and-verify samplers, whose one forward may accept several)
    fail_step: torch.Tensor  # [B] step whose logits turned non-finite (-1: none)
    fail_block: torch.Tensor  # [B] block of that step
    mask_committed: torch.Tensor  # [] bool: a sampler proposed MASK for a committed slot (the loop raises)
    commits: list[torch.Tensor] = field(default_factory=list)  # per step, [B] tokens committed in each row
    token_forwards: int = 0  # query positions computed by the model (summed over rows and steps)
    refreshes: int = 0  # steps that recomputed every slot

    @classmethod
    def empty(cls, batch: int, gen_length: int, device: torch.device) -> DecodeStats:
        def minus_one(*shape: int) -> torch.Tensor:
            return torch.full(shape, -1, dtype=torch.long, device=device)

        return cls(
            trace=minus_one(batch, gen_length),
            row_steps=torch.zeros(batch, dtype=torch.long, device=device),
            accepted_steps=torch.zeros(batch, dtype=torch.long, device=device),
            fail_step=minus_one(batch),
            fail_block=minus_one(batch),
            mask_committed=torch.zeros((), dtype=torch.bool, device=device),
        )

    def tokens_per_step(self) -> list[list[int]]:
        """Per step, tokens committed in each row (one host copy, at the end)."""
        return torch.stack(self.commits).tolist() if self.commits else []

    def failures(self) -> list[str | None]:
        """Per row, why it stopped early (None when fine)."""
        pairs = zip(self.fail_step.tolist(), self.fail_block.tolist(), strict=True)
        return [None if s < 0 else f"non-finite logits at step {s} (block {b}); row stopped" for s, b in pairs]


@dataclass
class DecodeState:
    inputs: DecodeInputs
    canvas: torch.Tensor  # [B, T] token ids; MASK at undecoded slots (written by the loop only)
    finished: torch.Tensor  # [B] bool: row needs no more forwards
    gen_end: torch.Tensor  # [B] slots at or after gen_end are cut (EoTP / EOS fill)
    cursor: BlockCursor
    stats: DecodeStats
    scratch: dict[str, Any] = field(default_factory=dict)  # per-call memory of samplers and caches, keyed by owner
    # [B, T] bool or None: slots the loop filled at this step's start that still count as masked slots of the block
    # for this step's selection (d3LLM's early stop, ``core.frontier``); cleared at the next step's start
    phantom: torch.Tensor | None = None
    _memo: dict[str, Any] = field(default_factory=dict, repr=False)  # derived views shared within a step

    # -- read-only views of the inputs
    @property
    def positions(self) -> torch.Tensor:
        return self.inputs.positions

    @property
    def valid(self) -> torch.Tensor:
        return self.inputs.valid

    @property
    def prompt_len(self) -> int:
        return self.inputs.prompt_len

    @property
    def config(self) -> DecodeConfig:
        return self.inputs.config

    @property
    def mask_id(self) -> int:
        return self.inputs.mask_id

    @property
    def eos_ids(self) -> torch.Tensor:
        return self.inputs.eos_ids

    @property
    def fill_id(self) -> int:
        return self.inputs.fill_id

    @property
    def generator(self) -> torch.Generator:
        return self.inputs.generator

    @property
    def block_length(self) -> int:
        return self.inputs.block_length

    @property
    def num_blocks(self) -> int:
        return self.inputs.num_blocks

    @property
    def steps(self) -> int:
        return self.inputs.steps

    @property
    def logit_shift(self) -> int:
        return self.inputs.logit_shift

    # -- read-only views of the cursor
    @property
    def block_index(self) -> int:
        return self.cursor.block_index

    @property
    def block_start(self) -> int:
        return self.cursor.block_start

    @property
    def block_end(self) -> torch.Tensor:
        return self.cursor.block_end

    @property
    def block_starts(self) -> torch.Tensor:
        return self.cursor.block_starts

    @property
    def step(self) -> int:
        return self.cursor.step

    @property
    def block_step(self) -> int:
        return self.cursor.block_step

    @property
    def block_limit(self) -> int:
        return self.cursor.block_limit

    # -- derived
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
        return self.inputs.key_mask

    def in_block(self, block_end: torch.Tensor | None = None) -> torch.Tensor:
        """[B, T] bool: slot lies in the row's current block (ending at ``block_end`` [B] when given)."""
        end = self.block_end if block_end is None else block_end
        idx = torch.arange(self.total_length, device=self.device)
        return (idx >= self.block_start) & (idx < end[:, None])

    def block_masked(self, block_end: torch.Tensor | None = None) -> torch.Tensor:
        """[B, T]: masked slots of the current block (ending at ``block_end`` when given) of unfinished rows.

        The loop, the cache plan and the sampler all ask for it several times a step; without ``block_end`` it is
        computed once per change of what it reads (the canvas, the finish flags, the block; keyed on the tensors
        themselves and their in-place versions) and shared. Callers must not write into it."""
        if block_end is not None:
            return self._block_masked(block_end)
        cur = self.cursor
        key = (self.canvas, self.canvas._version, self.finished, self.finished._version, cur.block_start, self.phantom)
        key += (cur.block_end, None if cur.block_end is None else cur.block_end._version)
        memo = self._memo.get("block_masked")
        if memo is None or not all(_same(a, b) for a, b in zip(memo[0], key, strict=True)):
            memo = (key, self._block_masked(None))
            self._memo["block_masked"] = memo
        return memo[1]

    def _block_masked(self, block_end: torch.Tensor | None) -> torch.Tensor:  # [B, T], the rule itself
        masked = self.is_masked() if self.phantom is None else self.is_masked() | self.phantom
        return masked & self.in_block(block_end) & ~self.finished[:, None]

    def region(self) -> tuple[int, int]:
        """Default logits region: the current block (widest row)."""
        cur = self.cursor
        if cur.widest_end is None:  # block_end changed since the last read (the loop's sync usually fills it)
            cur.widest_end = int(cur.block_end.max())
        return self.block_start, cur.widest_end


def _same(a: Any, b: Any) -> bool:
    """A memo key's entries match: the same tensor object, or equal plain values (versions, ints, None)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return a is b
    return a == b
