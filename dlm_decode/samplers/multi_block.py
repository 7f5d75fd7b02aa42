"""What a sampler commits when several blocks of a row are in flight (D2F, d3LLM; ``ALGORITHMS.md`` §15).

The frontier (which blocks are open, which are fully activated) is ``core.frontier``; this module is the commit
side, shared by ``threshold``, ``entropy_threshold`` and ``low_confidence`` (their ``block_add_threshold`` /
``decoded_token_threshold`` options; unset: one block at a time, as before). Each of them scores the candidates
(confidence, negative entropy) and says which are *sure* (over its threshold); then:

* ``per_block`` (D2F, ``_generate_block_single``): every open block on its own: a fully activated block commits its
  sure slots plus its own rule's pick (``threshold``: its top-1; ``low_confidence``: its schedule's count), a
  semi-activated block only its sure slots. ``threshold`` and ``low_confidence`` decode this way.
* ``global`` (d3LLM, ``generate_multi_block``): one selection over every candidate of the open blocks, the single
  best slot anywhere (so it may land in a semi-activated block) plus every sure slot; then, if the first fully
  activated block that still has a MASK got nothing, its best slot is forced. ``entropy_threshold`` decodes this way.
  d3LLM's Dream decoder (``_sample_multi_block``) takes no best slot anywhere, only the sure ones and the forced one
  (``entropy_threshold``'s ``global_best=false``, set by the ``d3llm_dream`` preset), and its sure test is strict
  (``H < eta``, LLaDA's ``H <= eta``): ties only.

Differences, on purpose: D2F's threshold test is strict (``p > skip_threshold``) where ``threshold``'s is ``>=``, and
D2F computes confidences in the model dtype where we use float64: they differ only on exact ties. At temperature > 0
the references draw differently (D2F: ``Categorical`` per block, d3LLM: Gumbel noise over the whole canvas; d3LLM's
forced slot takes the argmax token): ours draws the sampler's usual Gumbel proposals over the region, and the forced
slot takes its proposal. The forced block is the first fully activated one with a real MASK (not a slot an early
stop just filled, ``DecodeState.phantom``), as the references count masks.
"""

from __future__ import annotations

import math

import torch

from dlm_decode.core.frontier import MultiBlock, layout
from dlm_decode.core.state import DecodeState
from dlm_decode.samplers.base import top_k_per_row

OPTIONS = ("block_add_threshold", "decoded_token_threshold")


def check_fields(name: str, smp: object) -> None:
    """The multi-block options of sampler ``name``: the thresholds unset (None) or a share in (0, 1]; ``early_stop``
    a bool, only with several blocks in flight."""
    early = getattr(smp, "early_stop", False)
    if not isinstance(early, bool):
        raise ValueError(f"{name}: early_stop must be true or false, got {early!r}")
    if early and all(getattr(smp, key) is None for key in OPTIONS):
        raise ValueError(
            f"{name}: early_stop is the EOS stop of multi-block decoding; set block_add_threshold and "
            "decoded_token_threshold too (for block-by-block decoding use stop_at_eos)"
        )
    for key in OPTIONS:
        x = getattr(smp, key)
        if x is None:
            continue
        if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x) or not 0 < x <= 1:
            raise ValueError(f"{name}: {key} must be a share in (0, 1] (1: one block at a time), got {x!r}")


def rule_of(smp: object, selection: str, early_stop: bool = False) -> MultiBlock | None:
    """The sampler's frontier rule, or None when neither option is set (ordinary block-by-block decoding)."""
    add, dec = (getattr(smp, key) for key in OPTIONS)
    if add is None and dec is None:
        return None
    return MultiBlock(1.0 if add is None else float(add), 1.0 if dec is None else float(dec), selection, early_stop)


def block_top(score: torch.Tensor, cand: torch.Tensor, blk: torch.Tensor, k: torch.Tensor, kmax: int) -> torch.Tensor:
    """[B, R] bool: in each block, the ``k`` [B, N'] highest-scoring candidates (``torch.topk`` order on ties).
    ``blk`` [B, R]: the block of each slot; column j of ``k`` is the row's j-th block from its first in the region."""
    b, r = score.shape
    n = k.shape[1]
    _, rel = _relative(blk, n)  # [B, R]
    inside = cand[:, None, :] & (rel[:, None, :] == torch.arange(n, device=score.device)[None, :, None])
    scores = torch.where(inside, score[:, None, :].to(torch.float64), float("-inf"))  # [B, N', R]
    kmax = max(min(kmax, r), 1)
    top = torch.topk(scores, kmax, dim=-1)
    keep = (torch.arange(kmax, device=score.device) < k[..., None]) & torch.isfinite(top.values)
    picked = torch.zeros(b, n, r, dtype=torch.bool, device=score.device).scatter(2, top.indices, keep)
    return picked.any(1)


def _relative(blk: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``blk`` [B, R] -> ([B, 1] each row's first block in the region, [B, R] each slot's block counted from it,
    within the region's ``n`` blocks)."""
    base = blk[:, :1].clamp(min=0)
    return base, (blk - base).clamp(0, n - 1)


def region_blocks(state: DecodeState, r: int) -> int:
    """How many blocks a region of ``r`` slots can touch."""
    return -(-r // state.block_length) + 1


def per_block(state: DecodeState, score: torch.Tensor, sure: torch.Tensor, cand: torch.Tensor, r0: int) -> torch.Tensor:
    """D2F: sure slots everywhere, plus the top-1 of every fully activated block."""
    blk, full = layout(state, r0, r0 + score.shape[1])
    ones = torch.ones(score.shape[0], region_blocks(state, score.shape[1]), dtype=torch.long, device=score.device)
    return sure | block_top(score, cand & full, blk, ones, 1)


def global_pick(
    state: DecodeState, score: torch.Tensor, sure: torch.Tensor, cand: torch.Tensor, r0: int, best: bool = True
) -> torch.Tensor:
    """d3LLM: the sure candidates plus (``best``, its LLaDA decoder) the best candidate anywhere; the first fully
    activated block with a candidate that got none gets its best one."""
    blk, full = layout(state, r0, r0 + score.shape[1])
    commit = sure
    if best:
        commit = commit | top_k_per_row(torch.where(cand, score, float("-inf")), cand.any(1).long(), kmax=1) & cand
    big = torch.iinfo(torch.long).max
    real = cand & state.is_masked()[:, r0 : r0 + score.shape[1]]  # not the slots an early stop just filled
    first = torch.where(real & full, blk, big).min(1).values  # [B] the first fully activated block with a MASK
    in_first = cand & (blk == first[:, None])
    starved = in_first.any(1) & ~(commit & in_first).any(1)  # [B]
    forced = top_k_per_row(torch.where(in_first, score, float("-inf")), starved.long(), kmax=1) & in_first
    return commit | forced


def scheduled(
    state: DecodeState, key: str, score: torch.Tensor, cand: torch.Tensor, r0: int, steps: int
) -> torch.Tensor:
    """``low_confidence`` over several blocks: each fully activated block commits ``ceil(left / steps left)`` of its
    masks (LLaDA's even schedule over the sampler's ``steps`` per block, counted from the block's full activation;
    its last step takes them all); semi-activated blocks commit nothing (the rule has no threshold). ``key``: the
    ``state.scratch`` entry counting each block's steps."""
    blk, full = layout(state, r0, r0 + score.shape[1])
    frontier = state.cursor.frontier
    taken = state.scratch.setdefault(key, torch.zeros_like(frontier.full, dtype=torch.long))  # [B, N]
    n = region_blocks(state, score.shape[1])
    base, rel = _relative(blk, n)  # [B, 1] the region's first block, [B, R]
    cols = (base + torch.arange(n, device=score.device)[None, :]).clamp(max=taken.shape[1] - 1)  # [B, N']
    left = torch.zeros(score.shape[0], n, dtype=torch.long, device=score.device)
    left.scatter_add_(1, rel, (cand & full).long())  # [B, N'] masks of each fully activated block
    done = taken.gather(1, cols)
    k = torch.where(done >= steps - 1, left, -(-left // (steps - done).clamp(min=1)))
    pick = block_top(score, cand & full, blk, k, state.block_length)
    taken.scatter_add_(1, cols, (left > 0).long())
    return pick
