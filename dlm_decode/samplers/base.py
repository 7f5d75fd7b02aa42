"""The sampler interface: what a sampler may read, and what it hands back to the loop.

A sampler decides; the loop loops. A sampler is a frozen dataclass whose fields are its hyperparameters. Per call
it may keep tensors in ``state.scratch[name]`` (schedules, counters); it never runs the model and never writes the
canvas or the block cursor: everything it changes comes back in a ``Selection``.

The contract, in the order the loop calls it (``dlm_decode.decode``):

* ``check(config, num_blocks)``: before any work (from ``check_request``); raise ``ValueError`` on a bad request.
* ``forced_tokens(state)``: once, before the call's first forward; a ``Selection`` over the whole canvas whose
  commits are written as context (never decoded: no trace, not counted), or None.
* per block: ``begin_block(state)``, then ``max_block_steps(state)`` (the bound; the loop finishes the block at it).
* per step: ``region(state)`` (the slots ``[r0, r1)`` that get logits), then ``select(state, logits, r0)``.

``select`` returns which slots of the region to commit and with which tokens. The loop then enforces the contract
(only masked slots of the row's current block, never MASK, only unfinished rows) and the step bound. Three generic
extensions ride on the same ``Selection``: ``block_end`` at a block's first step moves each row's block end (variable
blocks: the row's next block then starts there); a row in ``stop_rows`` may commit every masked generation slot of
the region in that step (an all-in commit), after which it stops; ``cut_at`` cuts a row's canvas (EoTP).

Draft-and-verify (``lossless``). Before a step's forward the loop asks ``draft(state, r0, r1)``; the default, None,
is the ordinary step above. A sampler that returns ``Drafts`` (D canvases: the current one with extra region slots
filled in) gets one batched forward over the current canvas and its D drafts, then ``verify(state, logits, drafts,
r0)`` with logits ``[B, 1 + D, R, V]`` (index 0: the current canvas) instead of ``select``. ``verify`` returns an
ordinary ``Selection`` (committed against the current canvas, under the same contract) whose ``steps`` says how many
steps of the rule it follows the commit stands for; the loop counts them (``accepted_steps``). Drafts never touch the
canvas, the cursor or the cache's K/V store: only the returned commit does. ``check_cache(cache)`` lets a sampler
refuse a cache it cannot run with, before any work.

What ``select`` reads. A sampler whose ``select`` looks at the logits of its candidates only (the masked slots of the
current block, ``candidates(state, r0, r1)``) says so with ``traits.reads_candidates_only``; the loop then has the model
compute logits at those slots alone and hands zeros elsewhere, in the same ``[B, R, V]`` shape (so random draws over
the region are unchanged). Everything a sampler decides from the candidates' logits stays the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

import torch

from dlm_decode.core.config import DecodeConfig, resolve_lengths
from dlm_decode.core.inputs import ModelFacts
from dlm_decode.core.proposals import gumbel_proposals
from dlm_decode.core.state import DecodeState


@dataclass(frozen=True)
class Selection:
    """What a sampler hands back to the loop for one step (or, from ``forced_tokens``, the context it forces)."""

    commit: torch.Tensor  # [B, R] bool: slots of the region to commit now
    tokens: torch.Tensor  # [B, R] long: the token for each committed slot
    stop_rows: torch.Tensor | None = None  # [B] bool: rows whose decoding ends after this step (all-in commit)
    cut_at: torch.Tensor | None = None  # [B] long: absolute slot from which the row's canvas is cut (EoTP), -1 none
    block_end: torch.Tensor | None = None  # [B] long: each row's new exclusive block end (a block's first step only)
    # [B] long: steps of the followed rule this commit stands for (draft-and-verify: accepted drafts + 1); None: one
    steps: torch.Tensor | None = None
    # [B, R] bool: decoded generation slots of the row's current block to rewrite with ``tokens`` (token editing,
    # samplers with ``edits``; the loop ignores it elsewhere)
    edit: torch.Tensor | None = None


@dataclass(frozen=True)
class Drafts:
    """Canvases a draft-and-verify sampler asks the loop to run beside the current one in the step's forward."""

    commit: torch.Tensor  # [B, D, R] bool: region slots draft j fills on top of the current canvas
    tokens: torch.Tensor  # [B, R] long: the token each drafted slot gets (the same in every draft)


@dataclass(frozen=True)
class SamplerTraits:
    """What the loop and ``check_request`` know about a sampler beyond its hyperparameters (a class's
    ``Sampler.traits``; change one with ``dataclasses.replace``)."""

    blockwise: bool = True  # default block 32 (False: one block over the whole generation)
    fixed_budget: bool = False  # uses DecodeConfig.steps (fixed number of forwards per block)
    # True: the sampler re-states the model's own generate, so options the caller leaves unset take the defaults
    # that generate takes from the checkpoint (``model.sampling_defaults``); then ``option_defaults`` (both filled
    # in by ``dlm_decode.decode.request.check_request``)
    follows_model_defaults: bool = False
    # the reference's own value of each unset (None) field (read-only)
    option_defaults: Mapping[str, Any] = field(default_factory=dict)
    # True: ``select`` reads the logits of ``candidates(state, r0, r1)`` only (see the module docstring)
    reads_candidates_only: bool = False
    # True: the sampler may rewrite decoded slots of its block (``Selection.edit``) and keeps a block open past its
    # last MASK while ``Sampler.block_open`` says so (LLaDA2.1's token editing)
    edits: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "option_defaults", MappingProxyType(dict(self.option_defaults)))


@dataclass(frozen=True)
class Sampler:
    """Base class. Subclasses set ``name`` (and ``traits`` where they differ from the defaults) and implement
    ``select``."""

    name: ClassVar[str] = "base"
    traits: ClassVar[SamplerTraits] = SamplerTraits()

    def with_model(self, facts: ModelFacts | None) -> Sampler:
        """The sampler with options that name the model's own files resolved (``learned_filter``'s
        ``filter="shipped"``); ``facts`` None: not known yet, left as given. Called before ``check``."""
        return self

    def check(self, config: DecodeConfig, num_blocks: int) -> None:
        """Validate the sampler against the decoding config (before any work)."""
        traits = self.traits
        if traits.fixed_budget:
            _, steps = resolve_lengths(config.gen_length, config.block_length, config.steps, blockwise=traits.blockwise)
            if steps % num_blocks:
                raise ValueError(
                    f"{self.name}: steps ({steps}) must be a multiple of the number of blocks ({num_blocks} = "
                    f"gen_length {config.gen_length} / block_length)"
                )
            if steps > config.gen_length:
                raise ValueError(f"{self.name}: steps ({steps}) must be <= gen_length ({config.gen_length})")

    def count_bounds(self, block: int, block_steps: int, gen_length: int) -> dict[str, tuple[int, str]]:
        """Options that count tokens or steps of one block (or of the generation): option -> (bound, what it is),
        checked by ``options.check_bounded`` from ``check_request``. ``block``: the block length; ``block_steps``: the
        most steps a block takes (a fixed budget's share, else one per slot). None by default."""
        return {}

    def token_options(self) -> dict[str, tuple[tuple[int, ...], bool]]:
        """Options holding token ids the sampler writes or looks for: option -> (ids, whether they are written into the
        canvas), checked against the model's vocabulary (and, written ones, its MASK id) by ``check_request``
        (``core.special_ids.check_option_ids``). None by default."""
        return {}

    def steps_per_block(self, state: DecodeState) -> int:
        return max(1, state.steps // state.num_blocks)

    def max_block_steps(self, state: DecodeState) -> int:
        """Upper bound on forwards in one block; the loop force-finishes a block that reaches it."""
        if self.traits.fixed_budget:
            return self.steps_per_block(state)
        return int((state.block_end - state.block_start).max())

    def forced_tokens(self, state: DecodeState) -> Selection | None:
        """Context the sampler forces before the call's first forward: a ``Selection`` over the whole canvas
        (``[B, T]``; its commits are written, never decoded), or None (the default)."""
        return None

    def begin_block(self, state: DecodeState) -> None:
        """Called once at each block start, before the block's first forward."""

    def region(self, state: DecodeState) -> tuple[int, int]:
        return state.region()

    def block_open(self, state: DecodeState) -> torch.Tensor | None:
        """[B] rows that keep iterating on their block with no MASK left (editing samplers); None: none."""
        return None

    def check_cache(self, cache: Any) -> None:
        """Validate the cache policy this sampler runs with (before any work); the default accepts every cache."""

    def multi_block(self) -> Any:
        """The frontier rule (``core.frontier.MultiBlock``) when the sampler decodes several blocks at once (its
        ``block_add_threshold`` / ``decoded_token_threshold``, ``samplers.multi_block``); None: block by block."""
        return None

    def select(self, state: DecodeState, logits: torch.Tensor, r0: int) -> Selection:
        raise NotImplementedError

    # draft-and-verify (see the module docstring); ordinary samplers keep the defaults
    def draft(self, state: DecodeState, r0: int, r1: int) -> Drafts | None:
        """Draft canvases to verify in this step's forward, or None for an ordinary step (the default)."""
        return None

    def verify(self, state: DecodeState, logits: torch.Tensor, drafts: Drafts, r0: int) -> Selection:
        """``logits`` [B, 1 + D, R, V]: the current canvas's, then each draft's. What to commit now."""
        raise NotImplementedError(f"{self.name}: returned drafts but has no verify")

    # helpers shared by the LLaDA-family samplers
    def proposals(
        self, state: DecodeState, logits: torch.Tensor, cand: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``gumbel_proposals`` of the region's logits; given the step's candidates ``cand`` [B, R], a sampler that
        reads only its candidates (``traits.reads_candidates_only``) gets them computed there alone (the other slots
        read x0 0, confidence 0), which changes nothing it reads."""
        c = state.config
        only = cand if self.traits.reads_candidates_only else None
        return gumbel_proposals(
            logits,
            mask_id=state.mask_id,
            temperature=c.temperature,
            top_p=c.top_p,
            top_k=c.top_k,
            generator=state.generator,
            only=only,
        )


def candidates(state: DecodeState, r0: int, r1: int, block_end: torch.Tensor | None = None) -> torch.Tensor:
    """[B, R] bool: masked slots of the current block (ending at ``block_end`` [B] when given, e.g. the one a
    sampler is about to return) of unfinished rows, restricted to the region."""
    return state.block_masked(block_end)[:, r0:r1]


def block_slots(state: DecodeState, r0: int, r1: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's current block as ``block_length`` columns of the region ``[r0, r1)``: ``(index [B, block], inside
    [B, block])``, the region column of every block slot and whether it lies in the region. A block starts at its
    end minus ``block_length``: the region's first column for a bidirectional model; for a block-causal model the
    row's grid block, whose leading prompt slots (a partial first block) lie before the region (``inside`` False)."""
    n = state.block_length
    start = state.block_end - n - r0  # [B] region column of each row's block start
    idx = start[:, None] + torch.arange(n, device=state.device)  # [B, block]
    inside = (idx >= 0) & (idx < r1 - r0)
    return idx.clamp(0, max(r1 - r0 - 1, 0)), inside


def block_vectors(values: torch.Tensor, slots: tuple[torch.Tensor, torch.Tensor], fill: float = 1.0) -> torch.Tensor:
    """[B, R] region values -> [B, block] each row's block (``slots`` from ``block_slots``); slots before the region
    (fixed prompt slots of a partial first block) read ``fill``. Learn2PD's filter input and its oracle records."""
    idx, inside = slots
    return torch.where(inside, values.gather(1, idx), torch.as_tensor(fill, dtype=values.dtype))


def editable(state: DecodeState, r0: int, r1: int) -> torch.Tensor:
    """[B, R] bool: decoded generation slots of the current block of unfinished rows, restricted to the region (where
    a token-editing sampler may rewrite; never the prompt, even in a block-causal model's partial first block)."""
    idx = torch.arange(r0, r1, device=state.device)
    decoded = ~state.is_masked()[:, r0:r1] & (idx[None, :] >= state.prompt_len)
    return decoded & state.in_block()[:, r0:r1] & ~state.finished[:, None]


def top_k_per_row(score: torch.Tensor, k: torch.Tensor, kmax: int | None = None) -> torch.Tensor:
    """[B, R] scores, [B] counts -> [B, R] bool of each row's k highest scores (torch.topk order on ties).

    ``kmax``: ``k.max()`` when the caller knows it on the host (no device sync); None: read here."""
    if kmax is None:
        kmax = int(k.max()) if k.numel() else 0
    out = torch.zeros_like(score, dtype=torch.bool)
    if kmax == 0:
        return out
    idx = torch.topk(score, kmax, dim=-1).indices  # [B, kmax]
    keep = torch.arange(kmax, device=score.device)[None, :] < k[:, None]
    return out.scatter(1, idx, keep)  # rows keep only their first k picks
