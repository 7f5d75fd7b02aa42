"""The sampler interface and registry.

A sampler decides; the loop loops. A sampler is a frozen dataclass whose fields are its hyperparameters. Per call
it may keep tensors in ``state.scratch[name]`` (schedules, counters); it never runs the model.

Per step the loop hands the sampler aligned logits for a region of slots ``[r0, r1)`` (by default the current
block) and the sampler returns which slots to commit and with which tokens. The loop then enforces the contract
(only masked slots of the row's current block, never MASK, only unfinished rows) and checks the step bound.

Two generic extensions: a sampler may move ``state.block_end`` (per row) during the first ``select`` of a block
(variable blocks: the row's next block then starts at that end), and a row listed in ``Selection.stop_rows`` may
commit every masked generation slot of the region in that step (an all-in commit), after which it stops.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

import torch

from dlm_decode.core.config import DecodeConfig
from dlm_decode.core.proposals import gumbel_proposals
from dlm_decode.core.state import DecodeState
from dlm_decode.options import build, resolve

# name -> "module:Class"; resolved lazily so a bad name is reported with every valid one
SAMPLERS: dict[str, str] = {
    "low_confidence": "dlm_decode.samplers.low_confidence:LowConfidence",
    "random": "dlm_decode.samplers.random_remask:RandomRemask",
    "origin": "dlm_decode.samplers.dream_origin:DreamOrigin",
    "maskgit_plus": "dlm_decode.samplers.dream_maskgit_plus:DreamMaskGitPlus",
    "topk_margin": "dlm_decode.samplers.dream_topk_margin:DreamTopkMargin",
    "entropy": "dlm_decode.samplers.dream_entropy:DreamEntropy",
    "threshold": "dlm_decode.samplers.threshold:Threshold",
    "factor": "dlm_decode.samplers.factor:Factor",
    "local_leap": "dlm_decode.samplers.local_leap:LocalLeap",
    "early_commit": "dlm_decode.samplers.early_commit:EarlyCommit",
    "adaptive_block": "dlm_decode.samplers.adaptive_block:AdaptiveBlock",
    "learned_filter": "dlm_decode.samplers.learned_filter:LearnedFilter",
    "entropy_threshold": "dlm_decode.samplers.entropy_threshold:EntropyThreshold",
}


@dataclass(frozen=True)
class Selection:
    commit: torch.Tensor  # [B, R] bool: slots of the region to commit now
    tokens: torch.Tensor  # [B, R] long: the token for each committed slot
    stop_rows: torch.Tensor | None = None  # [B] bool: rows whose decoding ends after this step (all-in commit)
    cut_at: torch.Tensor | None = None  # [B] long: absolute slot from which the row's canvas is cut (EoTP), -1 none


@dataclass(frozen=True)
class Sampler:
    """Base class. Subclasses set ``name`` and implement ``select``."""

    name: ClassVar[str] = "base"
    blockwise: ClassVar[bool] = True  # default block 32 (False: one block over the whole generation)
    fixed_budget: ClassVar[bool] = False  # uses DecodeConfig.steps (fixed number of forwards per block)
    commits_every_step: ClassVar[bool] = True  # the reference guarantees >= 1 commit per step
    # True: the sampler re-states the model's own generate, so options the caller leaves unset take the defaults
    # that generate takes from the checkpoint (``model.sampling_defaults``); then ``option_defaults``
    follows_model_defaults: ClassVar[bool] = False
    option_defaults: ClassVar[dict[str, Any]] = {}  # the reference's own value of each unset (None) field

    def with_defaults(self, config: DecodeConfig, model_defaults: dict[str, Any]) -> tuple[Sampler, DecodeConfig]:
        """This sampler and ``config`` with every option the caller left unset (None) filled in: from the model's
        reference defaults when the sampler follows them (``DecodeConfig`` fields go to the config, the rest to the
        sampler), then from ``option_defaults``. A default of None leaves the option unset (the reference's off)."""
        given = {k: v for k, v in model_defaults.items() if v is not None} if self.follows_model_defaults else {}
        own = {f.name for f in fields(self)}
        to_config = {k: v for k, v in given.items() if hasattr(config, k) and getattr(config, k) is None}
        to_self = {k: v for k, v in (self.option_defaults | given).items() if k in own and getattr(self, k) is None}
        return (replace(self, **to_self) if to_self else self), (replace(config, **to_config) if to_config else config)

    def check(self, config: DecodeConfig, num_blocks: int) -> None:
        """Validate the sampler against the decoding config (before any work)."""
        if self.fixed_budget:
            steps = config.steps if config.steps is not None else config.gen_length
            if steps % num_blocks:
                raise ValueError(
                    f"{self.name}: steps ({steps}) must be a multiple of the number of blocks ({num_blocks} = "
                    f"gen_length {config.gen_length} / block_length)"
                )
            if steps > config.gen_length:
                raise ValueError(f"{self.name}: steps ({steps}) must be <= gen_length ({config.gen_length})")

    def steps_per_block(self, state: DecodeState) -> int:
        steps = state.config.steps if state.config.steps is not None else state.config.gen_length
        return max(1, steps // state.num_blocks)

    def max_block_steps(self, state: DecodeState) -> int:
        """Upper bound on forwards in one block; the loop force-finishes a block that reaches it."""
        if self.fixed_budget:
            return self.steps_per_block(state)
        return int((state.block_end - state.block_start).max())

    def begin_block(self, state: DecodeState) -> None:
        """Called once at each block start, before the block's first forward."""

    def region(self, state: DecodeState) -> tuple[int, int]:
        return state.region()

    def select(self, state: DecodeState, logits: torch.Tensor, r0: int) -> Selection:
        raise NotImplementedError

    # helpers shared by the LLaDA-family samplers
    def proposals(self, state: DecodeState, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c = state.config
        return gumbel_proposals(
            logits,
            mask_id=state.mask_id,
            temperature=c.temperature,
            top_p=c.top_p,
            top_k=c.top_k,
            generator=state.generator,
        )


def candidates(state: DecodeState, r0: int, r1: int) -> torch.Tensor:
    """[B, R] bool: masked slots of the current block of unfinished rows, restricted to the region."""
    return state.block_masked()[:, r0:r1]


def top_k_per_row(score: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """[B, R] scores, [B] counts -> [B, R] bool of each row's k highest scores (torch.topk order on ties)."""
    kmax = int(k.max()) if k.numel() else 0
    out = torch.zeros_like(score, dtype=torch.bool)
    if kmax == 0:
        return out
    idx = torch.topk(score, kmax, dim=-1).indices  # [B, kmax]
    keep = torch.arange(kmax, device=score.device)[None, :] < k[:, None]
    return out.scatter(1, idx, keep)  # rows keep only their first k picks


def get_sampler(name: str | Sampler, options: dict[str, Any] | None = None) -> Sampler:
    """A sampler by registered name with options (strings are converted), or an instance passed through."""
    if isinstance(name, Sampler):
        if options:
            raise ValueError("options given together with a sampler instance; use dataclasses.replace instead")
        return name
    return build(resolve(SAMPLERS, name, "sampler"), options, "sampler")


def register_sampler(name: str, target: str) -> None:
    """Register ``"module:Class"`` under ``name`` (for plugins)."""
    SAMPLERS[name] = target
