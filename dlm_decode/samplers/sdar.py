"""SDAR's decoding rule (JetAstra/SDAR, "SDAR: a synergistic diffusion-autoregression paradigm", 2025; TraDo uses
the same; ``ALGORITHMS.md`` §13): draw every slot of the block, then commit by a static per-step schedule.

Reference: ``block_diffusion_generate`` of JetAstra/SDAR ``generate.py`` (@ c2041a8). Per block, ``denoising_steps``
(``DecodeConfig.steps``, *per block* as for LLaDA2) forwards at most; step s has the scheduled count n_s, the block
length B split evenly over the steps (``B // steps``, the first ``B % steps`` get one more; over the whole B even for
the prompt's partial block). Every slot of the block is drawn with ``torch.multinomial`` from softmax(logits /
temperature) after top-k, then top-p filtering (``sample_with_temperature_topk_topp``); a token's confidence is its
probability under that filtered distribution (so ``top_k=1`` is the argmax at confidence 1). ``remasking``:

* ``low_confidence_dynamic`` (default): every masked slot with confidence > ``threshold`` (strict; the reference's
  ``confidence_threshold``) when there are at least n_s of them, else the n_s most confident (``torch.topk``);
* ``low_confidence_static``: the n_s most confident masked slots;
* ``sequential``: the leftmost n_s masked slots;
* ``entropy_bounded``: refused (``ValueError``): it cannot run as published. Its branch writes into
  ``transfer_index``, which it never creates (a ``NameError`` at its first step), and the "entropy" it bounds is one
  number per row (``-(p log p)`` of the sampled tokens' probabilities summed over the block), not one per token.

Draw for draw: each step makes one ``torch.multinomial`` call on the block's ``[B, V]`` probabilities in the logits'
dtype, the reference's shape, so with ``seed`` S the draws are those of the reference after ``torch.manual_seed(S)``
(the loop's generator is seeded the same way). The draws for slots whose tokens cannot be committed (decoded slots,
the prompt slots of a partial first block) depend only on their position in that call, not on those slots'
probabilities, so the loop computes logits at the masked slots alone and the others are drawn from placeholder rows.
In a batch each row draws with its own generator, seeded alike, and only in the steps where it has a masked slot in
its block, so every row gets the draws, hence the tokens, it gets alone (the cost: one multinomial call per drawing
row and, at batch > 1, one host read per step of which rows draw).
The block grid, the stop after the block holding EOS (config.json's ``eos_token_id``; the reference's
``stopping_criteria_idx``) and the exact cache belong to the loop (``decode.blocks``, ``cache.plans``).

Differences from the reference, on purpose:

* only masked slots are committed: where the schedule asks for more slots than are masked (a dynamic step committed
  more than its count earlier, or the prompt fills part of the first block), the reference's ``topk`` also picks
  ``-inf`` slots and overwrites decoded (or prompt) slots with fresh draws; here those slots keep their tokens. The
  tokens are the reference's whenever it overwrites nothing (always when ``steps == block_length``).
* MASK is never committed: its probability is set to 0 after the softmax (same draws, same confidences, so the same
  tokens wherever the reference did not draw MASK itself); a slot whose whole mass is on MASK takes its best other
  token.
* temperature 0 (dlm_decode's default; the reference divides by it) is its limit: the argmax at confidence 1 without
  draws, the tokens of the reference's ``top_k=1``.
* the reference is batch 1 in practice (no padding; one draw over ``[rows * B, V]``; any row's EOS stops every row;
  a row whose block is done while another's is not gets overwritten, or with ``sequential`` fails). Here rows are
  left-padded onto their own grids, draw with their own generators and stop after their own EOS block: each row of a
  batch decodes what it decodes alone.
* the cache: the reference spends one extra forward per finished block to store its K/V (``store_kv=True``); the
  exact ``prefix`` cache writes it in the next block's first forward (same tokens, fewer forwards).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from dlm_decode.core.proposals import top_k_filter, top_p_filter
from dlm_decode.core.state import DecodeState
from dlm_decode.samplers.base import Sampler, SamplerTraits, Selection, block_slots, candidates, top_k_per_row
from dlm_decode.samplers.llada2 import check_unit

REMASKING = ("low_confidence_dynamic", "low_confidence_static", "sequential")
UNRUNNABLE = {
    "entropy_bounded": "the reference cannot run it: its branch writes into transfer_index, which it never creates "
    "(NameError at the first step), and the entropy it bounds is one sum per row, not one value per token"
}


def schedule(block_length: int, steps: int) -> list[int]:
    """``get_num_transfer_tokens``: [steps] counts on the host, B split evenly, the first ``B % steps`` one more."""
    base, rem = divmod(block_length, steps)
    return [base + (1 if i < rem else 0) for i in range(steps)]


def draw(
    logits: torch.Tensor,  # [B, blk, V] each row's block, in order
    rows: list[torch.Generator] | None,
    *,
    mask_id: int,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:  # tokens [B, blk], confidences [B, blk]
    """``sample_with_temperature_topk_topp``, one ``torch.multinomial`` per row on its ``[blk, V]`` probabilities with
    the row's own generator (``rows[b]``; None for a row that draws nothing this step: its tokens are the argmax and
    are never committed). MASK is excluded after the softmax (see the module docstring); temperature 0: the argmax
    at confidence 1, no draws. ``logits`` is left as it came; the [B, blk, V] passes are in place where they can be
    (at a real vocabulary they are most of a step's host time)."""
    held = logits[..., mask_id].clone()  # [B, blk] MASK's logits, put back after the argmax (no [B, blk, V] copy)
    logits[..., mask_id] = float("-inf")
    best = logits.argmax(-1)  # [B, blk]
    logits[..., mask_id] = held
    if temperature == 0 or rows is None:
        return best, torch.ones(best.shape, dtype=logits.dtype, device=logits.device)
    scaled = logits / temperature if temperature != 1.0 else logits
    probs = torch.softmax(top_p_filter(top_k_filter(scaled, top_k), top_p), dim=-1)  # [B, blk, V]
    # in place: the drawn tokens are never MASK, so their confidences survive zeroing MASK's entry
    weights = probs.index_fill_(-1, torch.tensor([mask_id], device=logits.device), 0.0)
    dead = (weights.sum(-1, keepdim=True) <= 0).to(weights.dtype)  # [B, blk, 1] all mass on MASK
    weights.scatter_add_(-1, best[..., None], dead)  # adds 0 to every live row
    tok = torch.stack(
        [best[b] if g is None else torch.multinomial(weights[b], 1, generator=g)[:, 0] for b, g in enumerate(rows)]
    )
    return tok, weights.gather(-1, tok[..., None])[..., 0] - dead[..., 0]  # a dead row's token: probability 0


def choose(remasking: str, conf: torch.Tensor, cand: torch.Tensor, n: int, threshold: float) -> torch.Tensor:
    """conf, cand [B, blk] (the block's slots in order) -> [B, blk] bool: what the strategy commits with count n."""
    count = torch.minimum(cand.sum(1), torch.tensor(n, device=cand.device))  # [B] never more than the masks
    if remasking == "sequential":
        return cand & (cand.cumsum(1) <= n)
    top = top_k_per_row(torch.where(cand, conf, float("-inf")), count, kmax=min(n, cand.shape[1])) & cand
    if remasking == "low_confidence_static":
        return top
    high = cand & (conf > threshold)
    return torch.where((high.sum(1) >= n)[:, None], high, top)


@dataclass(frozen=True)
class SDAR(Sampler):
    remasking: str = "low_confidence_dynamic"
    threshold: float = 0.85  # ``confidence_threshold`` (generate.py's default; the published settings use 0.9)

    name: ClassVar[str] = "sdar"
    traits: ClassVar[SamplerTraits] = SamplerTraits(reads_candidates_only=True)

    def __post_init__(self) -> None:
        if self.remasking in UNRUNNABLE:
            raise ValueError(
                f"{self.name}: remasking={self.remasking!r} is not supported ({UNRUNNABLE[self.remasking]}); "
                f"choose one of {', '.join(REMASKING)}"
            )
        if self.remasking not in REMASKING:
            raise ValueError(f"{self.name}: unknown remasking {self.remasking!r}; choose one of {', '.join(REMASKING)}")
        check_unit(self.name, "threshold", self.threshold)

    def steps_per_block(self, state: DecodeState) -> int:
        return max(1, state.steps)

    def max_block_steps(self, state: DecodeState) -> int:
        return self.steps_per_block(state)

    def begin_block(self, state: DecodeState) -> None:
        state.scratch[self.name] = schedule(state.block_length, self.steps_per_block(state))

    def generators(self, state: DecodeState, cand: torch.Tensor) -> list[torch.Generator | None]:
        """The generator of each row that draws this step (one with a masked slot in its block), None for the
        others. Row 0 uses the call's generator; every other row its own, seeded alike on first use, so each row
        draws what it draws alone. Batch 1 needs no host read; a larger batch reads which rows draw (one sync)."""
        key = f"{self.name}.generators"
        gens = state.scratch.get(key)
        if gens is None:
            seed = state.config.seed if state.config.seed is not None else 0
            more = [torch.Generator(device=state.device).manual_seed(seed) for _ in range(state.batch - 1)]
            gens = state.scratch[key] = [state.generator, *more]
        if state.batch == 1:
            return gens
        return [g if busy else None for g, busy in zip(gens, cand.any(1).tolist(), strict=True)]

    def select(self, state: DecodeState, logits: torch.Tensor, r0: int) -> Selection:
        b, r, v = logits.shape
        idx, inside = block_slots(state, r0, r0 + r)  # [B, blk] region column of each block slot
        blk = idx.shape[1]
        block_logits = logits.gather(1, idx[..., None].expand(b, blk, v)).masked_fill_(~inside[..., None], 0.0)
        cand = candidates(state, r0, r0 + r).gather(1, idx) & inside  # [B, blk]
        c = state.config
        gens = None if c.temperature == 0 else self.generators(state, cand)
        tok, conf = draw(
            block_logits, gens, mask_id=state.mask_id, temperature=c.temperature, top_k=c.top_k, top_p=c.top_p
        )
        sched = state.scratch[self.name]
        n = sched[state.block_step] if state.block_step < len(sched) else 0
        commit = choose(self.remasking, conf, cand, n, self.threshold)
        where = torch.where(inside, idx, r)  # slots outside the region go to a dropped column
        out_commit = commit.new_zeros(b, r + 1).scatter_(1, where, commit)[:, :r]
        out_tok = tok.new_zeros(b, r + 1).scatter_(1, where, tok)[:, :r]
        return Selection(commit=out_commit, tokens=out_tok)
