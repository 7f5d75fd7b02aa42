"""Lossless draft-and-verify decoding (Wu & Zhang 2025, "Free Draft-and-Verification: Toward Lossless Parallel
Decoding for Diffusion Large Language Models", FreeDave, arXiv 2510.00294).

Reproduces, token for token, the output of a static fixed-budget rule (``rule``: LLaDA's ``low_confidence`` or
Dream's ``maskgit_plus`` / ``topk_margin`` / ``entropy``; the paper's setting is one token per step, steps = gen
length, the default) in fewer sequential forwards. The reference behaviour is FreeDave's static-strategy generate
(cychomatica/FreeDave, ``generate_with_prefix_cache_FreeDave``): the predictions of the last forward rank the masked
slots; the rule's own schedule (how many slots each step commits) cuts that ranking into the next steps, giving
draft canvases (the canvas after 1, 2, ... further steps, each drafted slot with its predicted token); one batched
forward computes every draft's logits; the rule applied to a draft's own logits gives its *target* (the canvas the
static rule would move to from there), and draft j + 1 is accepted when it equals draft j's target, slots and
tokens. The longest accepted run is kept, and the forward of its last canvas provides the logits for the next
call. Every accepted canvas is one the static rule would have reached, so the output is the static output; each call
accepts at least one step, so the sequential forwards never exceed the static rule's (the paper proves this is the
fewest forwards for lossless decoding given enough drafts).

How it maps onto the loop (``Sampler.draft`` / ``Sampler.verify``): a block's first step is an ordinary forward and
static step; it keeps the logits' ranking as the *hint*. Each later step runs the current canvas c (the static
state, whose logits are not known yet) plus up to ``drafts - 1`` drafts from the hint (batch ``drafts``), applies
the rule to c's logits (exact: the static step from c), accepts drafts while each equals its predecessor's target,
and commits the target of the last accepted canvas, which keeps that canvas's logits as the next hint. One forward
of ``drafts`` canvases per call commits 1 to ``drafts`` static steps; ``drafts=1`` is the static rule itself. This is
the paper's loop shifted by one step (its drafts start from the last accepted canvas; ours start from its target),
with the same forwards and the same output.

Differences, deliberate: the hint's ranking is built one drafted step at a time, each a ``topk`` of the step's
count over the scores left, the way the rule itself picks at the next canvases; the reference ranks once
(``topk`` of all drafted slots), which breaks exact ties (a sure model's fp32 confidences of 1.0) in another order,
so its drafts leave the static path where ours stay on it (same output, same canvases per forward; demo-dream copy:
1.83x fewer forwards than the static rule ranked once, 2.66x ranked step by step). Drafts that would complete the
block are not run (their logits are never needed); rows
accept independently (the reference runs one row); any ``steps`` the rule accepts works (each step's count comes
from the rule's own schedule, so drafts of several tokens per step are verified as sets), not only steps = gen
length; with ``stop_at_eos`` a run of accepted drafts ends at the first canvas where the EOS rule would have stopped
the static decode. What cannot be lossless is refused before any work: temperature > 0 (tokens would be drawn
twice), Dream's ``alg_temp`` (random ordering), and every cache but ``none``, ``prefix`` and ``dual`` without
``refresh_interval``. With ``prefix`` / ``dual`` the output is that same cache's one-token-per-step output (the
drafts run against the K/V cached at the block's first step, as every static step after it does).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from dlm_decode.core.config import DecodeConfig
from dlm_decode.core.masks import eos_settled
from dlm_decode.core.proposals import categorical_proposals, gumbel_proposals
from dlm_decode.core.state import DecodeState
from dlm_decode.samplers.base import Drafts, Sampler, SamplerTraits, Selection, candidates, top_k_per_row
from dlm_decode.samplers.dream_base import DreamOrdering
from dlm_decode.samplers.dream_entropy import DreamEntropy
from dlm_decode.samplers.dream_maskgit_plus import DreamMaskGitPlus
from dlm_decode.samplers.dream_topk_margin import DreamTopkMargin
from dlm_decode.samplers.schedule import dream_counts, llada_schedule

DREAM_RULES: dict[str, type[DreamOrdering]] = {
    "maskgit_plus": DreamMaskGitPlus,
    "topk_margin": DreamTopkMargin,
    "entropy": DreamEntropy,
}
RULES = ("low_confidence", *DREAM_RULES)
# caches whose one-token-per-step output a draft reproduces: their plan does not change inside a block after its
# first step, so a draft's forward is the one the static step at that canvas would run
EXACT_CACHES = ("none", "prefix", "dual")


@dataclass
class _Hint:
    """The last verified canvas x's predictions, which draft the next steps (region slots ``[r0, r0 + R)``)."""

    tokens: torch.Tensor  # [B, R] long: x's proposal per slot
    score: torch.Tensor  # [B, R]: the rule's score, -inf off x's candidates
    step: torch.Tensor  # [B] long: x's static step index in the block
    masked: torch.Tensor  # [B] long: x's candidates (masks left in its block)
    r0: int


@dataclass
class _Memory:
    """Per block: each row's static step (rows accept different numbers of steps) and the hint."""

    step: torch.Tensor  # [B] long: static step index of the current canvas
    schedule: torch.Tensor | None  # [B, S] LLaDA's per-step counts (None for the Dream rules)
    hint: _Hint | None = None


@dataclass(frozen=True)
class Lossless(Sampler):
    drafts: int = 4  # canvases per verification forward = most static steps one forward can accept
    rule: str = "low_confidence"  # the static rule reproduced
    eps: float | None = None  # Dream rules: the schedule's eps (None: the checkpoint's, else 1e-3)
    alg_temp: float | None = None  # Dream rules: must stay unset or 0 (a random ordering cannot be verified)

    name: ClassVar[str] = "lossless"

    def __post_init__(self) -> None:
        if isinstance(self.drafts, bool) or not isinstance(self.drafts, int) or self.drafts < 1:
            raise ValueError(f"{self.name}: drafts must be an integer >= 1, got {self.drafts!r}")
        if self.rule not in RULES:
            raise ValueError(f"{self.name}: rule must be one of {', '.join(RULES)}, got {self.rule!r}")
        if self.eps is not None and not 0.0 < self.eps < 1.0:
            raise ValueError(f"{self.name}: eps must be in (0, 1), got {self.eps!r}")
        if self.alg_temp is not None and (not math.isfinite(self.alg_temp) or self.alg_temp != 0):
            raise ValueError(
                f"{self.name}: alg_temp must be unset or 0, got {self.alg_temp!r} (a random ordering has no static "
                "output to reproduce; set alg_temp=0, also when the checkpoint's config.json sets it)"
            )

    # the rule decides the block layout and the defaults; rows accept different numbers of steps per forward, so a
    # row that finished its block waits for the others (no commit in some steps), and temperature must be 0 (``check``)
    @property
    def traits(self) -> SamplerTraits:  # type: ignore[override]
        if self.rule in DREAM_RULES:
            return dataclasses.replace(DreamOrdering.traits, reads_candidates_only=False)
        return SamplerTraits(fixed_budget=True)

    def check(self, config: DecodeConfig, num_blocks: int) -> None:
        super().check(config, num_blocks)  # the rule's step budget checks
        if config.temperature > 0:
            raise ValueError(
                f"{self.name}: temperature must be 0, got {config.temperature!r} (lossless decoding reproduces the "
                f"greedy {self.rule} output; sampled tokens would differ between a draft and its verification)"
            )

    def count_bounds(self, block: int, block_steps: int, gen_length: int) -> dict[str, tuple[int, str]]:
        return {"drafts": (block_steps, "the steps of one block")}  # static steps one forward can accept, of one block

    def check_cache(self, cache: Any) -> None:
        name = getattr(cache, "name", type(cache).__name__)
        if name == "none" or (name in EXACT_CACHES and getattr(cache, "refresh_interval", None) is None):
            return
        raise ValueError(
            f"{self.name}: cache {name!r}"
            + (" with refresh_interval" if name in EXACT_CACHES else "")
            + " cannot be lossless (its plan changes with the step, so a draft's forward is not the one the static "
            "step would run); use cache none, prefix or dual (without refresh_interval)"
        )

    # ---------------------------------------------------------------------------------------------- the static rule

    def _schedule_eps(self) -> float:
        return self.eps if self.eps is not None else DreamOrdering.traits.option_defaults["eps"]

    def _counts(self, state: DecodeState, masked: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
        """masked, step [B, J] (masks left, static step index) -> [B, J] tokens the rule commits at that step."""
        mem: _Memory = state.scratch[self.name]
        steps = self.steps_per_block(state)
        if mem.schedule is not None:  # LLaDA: the block's schedule, last entry past its end (as low_confidence)
            return mem.schedule.gather(1, step.clamp(max=steps - 1))
        return dream_counts(masked, step, steps, self._schedule_eps())

    def _static(
        self, state: DecodeState, logits: torch.Tensor, cand: torch.Tensor, step: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The rule's step from each canvas: logits [B, J, R, V], cand [B, J, R] (its masked block slots), step
        [B, J] (its static step index) -> (commit [B, J, R] bool, tokens [B, J, R], score [B, J, R], -inf off cand).
        The same computation as the rule's ``select`` (``low_confidence`` / ``DreamOrdering``) at temperature 0."""
        b, j, r, v = logits.shape
        flat = logits.reshape(b * j, r, v)
        c = state.config
        opts = dict(mask_id=state.mask_id, temperature=0.0, top_p=c.top_p, top_k=c.top_k, generator=state.generator)
        if self.rule == "low_confidence":
            x0, score = gumbel_proposals(flat, **opts)  # confidence, float64
        else:
            x0, probs = categorical_proposals(flat, **opts)
            score = DREAM_RULES[self.rule]().score(probs, x0).to(flat.dtype)
        x0, score = x0.view(b, j, r), score.view(b, j, r)
        score = torch.where(cand, score, float("-inf"))
        k = self._counts(state, cand.sum(-1), step)  # [B, J]
        commit = top_k_per_row(score.view(b * j, r), k.view(-1)).view(b, j, r) & cand
        return commit, x0, score

    # ---------------------------------------------------------------------------------------------- the loop hooks

    def begin_block(self, state: DecodeState) -> None:
        masked = state.block_masked().sum(1)  # [B]
        sched = llada_schedule(masked, self.steps_per_block(state)) if self.rule == "low_confidence" else None
        state.scratch[self.name] = _Memory(step=torch.zeros_like(masked), schedule=sched)

    def select(self, state: DecodeState, logits: torch.Tensor, r0: int) -> Selection:
        """An ordinary step (a block's first, or no draft needed): the static step, keeping its ranking as hint."""
        mem: _Memory = state.scratch[self.name]
        cand = candidates(state, r0, r0 + logits.shape[1])  # [B, R]
        commit, x0, score = self._static(state, logits[:, None], cand[:, None], mem.step[:, None])
        mem.hint = _Hint(x0[:, 0], score[:, 0], mem.step, cand.sum(-1), r0)
        mem.step = mem.step + 1
        return Selection(commit=commit[:, 0], tokens=x0[:, 0])

    def draft(self, state: DecodeState, r0: int, r1: int) -> Drafts | None:
        """Drafts 1 .. D of the steps after the current canvas c, from the hint (the canvas x whose static step
        made c): draft j adds the hint's next j steps of ranked slots (step sizes from the rule's schedule)."""
        mem: _Memory = state.scratch[self.name]
        h = mem.hint
        if h is None or h.r0 != r0 or self.drafts == 1:
            return None
        # cumulative counts along the static path from x: bound[j] = slots committed by x's steps 0 .. j
        left, bounds = h.masked, []
        for j in range(self.drafts):
            k = self._counts(state, left[:, None], (h.step + j)[:, None])[:, 0]
            left = left - k
            bounds.append(h.masked - left)
        bound = torch.stack(bounds, 1)  # [B, drafts]; bound[:, 0] = what c already holds from x
        cand = candidates(state, r0, r1)  # [B, R]
        # draft j (1 .. drafts - 1) needs a forward only if it leaves a mask in some row
        need = ((h.masked[:, None] - bound[:, 1:]) > 0) & cand.any(1, keepdim=True)  # [B, drafts - 1]
        d = int(need.any(0).sum())
        if d == 0:
            return None
        rank = self._ranking(h.score, cand, bound[:, : d + 1])  # [B, R]
        commit = (rank[:, None] >= bound[:, :1, None]) & (rank[:, None] < bound[:, 1 : d + 1, None])  # [B, d, R]
        return Drafts(commit=commit & cand[:, None], tokens=h.tokens)

    @staticmethod
    def _ranking(score: torch.Tensor, cand: torch.Tensor, bound: torch.Tensor) -> torch.Tensor:
        """The hint's slots in the order the rule would pick them: score [B, R], cand [B, R] (c's masks), bound
        [B, J] (cumulative counts, bound[:, 0] what c holds) -> rank [B, R] (R where unranked).

        One ``topk(count)`` per drafted step on the scores left, as the rule's own ``top_k_per_row`` picks one step
        at a time: a sure model has many exactly tied scores (fp32 confidences of 1.0), and a single
        ``topk(kmax)`` breaks those ties in another order than the successive one-step picks do, so its drafts
        miss the static path (demo-dream copy: 1.83x fewer forwards with one topk, 2.66x picked step by step)."""
        rank = torch.full_like(score, score.shape[1], dtype=torch.long)
        left = torch.where(cand, score, float("-inf"))  # x's own step is on c already
        for j in range(1, bound.shape[1]):
            picked = top_k_per_row(left, bound[:, j] - bound[:, j - 1])  # [B, R] the rule's pick of step j
            rank = torch.where(picked, bound[:, j - 1, None], rank)  # a rank inside step j
            left = left.masked_fill(picked, float("-inf"))
        return rank

    def verify(self, state: DecodeState, logits: torch.Tensor, drafts: Drafts, r0: int) -> Selection:
        """Accept the longest run of drafts that the rule confirms; commit the target of its last canvas."""
        mem: _Memory = state.scratch[self.name]
        b, n, r, _ = logits.shape
        dc = drafts.commit  # [B, D, R]
        cand0 = candidates(state, r0, r0 + r)  # [B, R] the current canvas c
        cand = torch.cat([cand0[:, None], cand0[:, None] & ~dc], 1)  # [B, 1 + D, R] canvases c, d_1 .. d_D
        steps = mem.step[:, None] + torch.arange(n, device=logits.device)  # [B, 1 + D]
        target, x0, score = self._static(state, logits, cand, steps)
        before = torch.cat([torch.zeros_like(dc[:, :1]), dc[:, :-1]], 1)  # what each draft's predecessor holds
        added = dc & ~before  # [B, D] slots draft j adds to draft j - 1
        same = (target[:, :-1] == added).all(-1)  # [B, D]: the predecessor's target fills exactly these slots
        same &= (~added | (x0[:, :-1] == drafts.tokens[:, None])).all(-1)  # ... with these tokens
        same &= (torch.isfinite(logits[:, 1:]).all(-1) | ~cand[:, 1:]).all(-1)  # a draft with bad logits stops
        if state.config.stop_at_eos:  # the static decode stops at a settled canvas: go no further than that
            full = state.canvas[:, None].repeat(1, n - 1, 1)  # [B, D, T]
            full[:, :, r0 : r0 + r] = torch.where(dc, drafts.tokens[:, None], full[:, :, r0 : r0 + r])
            settled, _ = eos_settled(full[:, :, state.prompt_len :].flatten(0, 1), state.mask_id, state.eos_ids)
            same &= ~settled.view(b, n - 1)
        m = same.long().cumprod(1).sum(1)  # [B] accepted drafts
        rows = torch.arange(b, device=logits.device)
        held = torch.where((m > 0)[:, None], dc[rows, (m - 1).clamp(min=0)], False)  # [B, R] accepted canvas
        commit = held | target[rows, m]
        tokens = torch.where(held, drafts.tokens, x0[rows, m])
        mem.hint = _Hint(x0[rows, m], score[rows, m], mem.step + m, cand[rows, m].sum(-1), r0)
        mem.step = mem.step + m + 1
        # static steps taken: one from each accepted canvas that still has a mask (a row may finish inside the run)
        taken = (cand.any(-1) & (torch.arange(n, device=m.device)[None, :] <= m[:, None])).sum(1)
        return Selection(commit=commit & cand0, tokens=tokens, steps=taken)
