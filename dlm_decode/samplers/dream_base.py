"""Shared machinery of Dream's ``diffusion_generate`` orderings (Ye et al. 2025, "Dream 7B").

Reference: ``DreamGenerationMixin._sample``. ``steps`` forwards over the generation (one block by default, as
the reference has no blocks; with ``block_length`` < ``gen_length`` the same schedule runs per block with
``steps / num_blocks`` forwards each). Tokens come from Dream's ``sample_tokens`` (temperature, top-p, top-k,
softmax in the logits dtype); the ordering score is the subclass's; the count per step follows Dream's linear
schedule (``schedule.dream_count``). ``alg_temp`` > 0 draws the committed slots from ``softmax(score / alg_temp)``
without replacement instead of taking the top ones. Like the reference, a step may commit nothing (early steps of
long generations), so these samplers do not promise one commit per step; the last step of a block commits every
remaining mask. Differences: MASK is never proposed; per-row mask counts (see ``schedule``); the call's
``torch.Generator`` replaces the global RNG.

Effective defaults, as ``diffusion_generate`` has them: options left unset (``top_k`` / ``top_p`` None in the
``DecodeConfig``, ``alg_temp`` / ``eps`` None here) take what the reference would sample with for the checkpoint,
``model.sampling_defaults`` (see ``dlm_decode.models.dream``): its config.json over the transformers 4.x defaults,
so an official Dream checkpoint decodes with top-k 50 (top-p 1.0, a no-op), ``eps`` 1e-3 and no ``alg_temp``. The
top-k filter renormalises the probabilities the orderings score, so it changes which slots maskgit_plus and entropy
commit even at temperature 0; ``--top-k 0`` turns it off. A model without such defaults (LLaDA) gets no filter.
Deliberate difference: the temperature is always the caller's (dlm_decode's default 0, greedy), where the
reference's unset temperature would be 1.0 from the same merge; pass ``temperature=1.0`` to sample as it does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from dlm_decode.core.proposals import categorical_proposals
from dlm_decode.core.state import DecodeState
from dlm_decode.samplers.base import Sampler, SamplerTraits, Selection, candidates, top_k_per_row
from dlm_decode.samplers.schedule import dream_count


@dataclass(frozen=True)
class DreamOrdering(Sampler):
    alg_temp: float | None = None  # None: the checkpoint's (config.json), else off; 0: off
    eps: float | None = None  # None: the checkpoint's (config.json), else Dream's 1e-3

    traits: ClassVar[SamplerTraits] = SamplerTraits(
        blockwise=False,
        fixed_budget=True,
        follows_model_defaults=True,
        option_defaults={"eps": 1e-3},  # DreamGenerationConfig's
        reads_candidates_only=True,
    )

    def __post_init__(self) -> None:
        if self.alg_temp is not None and (not math.isfinite(self.alg_temp) or self.alg_temp < 0):
            raise ValueError(f"{self.name}: alg_temp must be >= 0 or None, got {self.alg_temp!r}")
        if self.eps is not None and not 0.0 < self.eps < 1.0:
            raise ValueError(f"{self.name}: eps must be in (0, 1), got {self.eps!r}")

    @property
    def schedule_eps(self) -> float:
        """``eps`` as set, else Dream's default (``generate`` fills it in; this covers a sampler used directly)."""
        return self.eps if self.eps is not None else self.traits.option_defaults["eps"]

    def score(self, probs: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:  # [B, R]
        raise NotImplementedError

    def select(self, state: DecodeState, logits: torch.Tensor, r0: int) -> Selection:
        c = state.config
        x0, probs = categorical_proposals(
            logits,
            mask_id=state.mask_id,
            temperature=c.temperature,
            top_p=c.top_p,
            top_k=c.top_k,
            generator=state.generator,
        )
        cand = candidates(state, r0, r0 + logits.shape[1])
        k = dream_count(cand.sum(1), state.block_step, self.steps_per_block(state), self.schedule_eps)
        score = torch.where(cand, self.score(probs, x0).to(logits.dtype), float("-inf"))
        if not self.alg_temp:
            return Selection(commit=top_k_per_row(score, k) & cand, tokens=x0)
        # sample k slots per row without replacement from softmax(score / alg_temp)
        w = torch.softmax(score.float() / self.alg_temp, dim=-1).nan_to_num(0.0)
        kmax = int(k.max())
        commit = torch.zeros_like(cand)
        if kmax > 0:
            idx = torch.multinomial(w.clamp(min=1e-30) * cand, kmax, generator=state.generator)
            keep = torch.arange(kmax, device=w.device)[None, :] < k[:, None]
            commit = commit.scatter(1, idx, keep)
        return Selection(commit=commit & cand, tokens=x0)
