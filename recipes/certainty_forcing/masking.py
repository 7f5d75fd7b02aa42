"""Complementary masking views for certainty-forcing distillation (dParallel, ``forward_process_semi_ar``).

Rows are laid out as ``dlm_decode.generate`` decodes them: left padding, then the prompt, then a response of fixed
length (the decoded final canvas). The prompt and the padding are never masked.

* LLaDA (semi-autoregressive): the response is cut into blocks of ``block`` tokens (the last may be shorter); one block
  index ``n`` is drawn per row; blocks before ``n`` stay clean, every token after block ``n`` is MASK in both views,
  and block ``n`` (the active block) is masked i.i.d. with probability ``ratio`` in view A and with the complement in
  view B, so every active token is masked in exactly one of the two views.
* Dream: the whole response is the active region (no later blocks).

Differences from the reference code, on purpose: the reference draws ``n`` in ``randint(0, len // block)``, which for
a response that is a whole number of blocks (ours always are: 32 / 64 tokens) includes an empty block worth a zero
loss; we draw among the non-empty blocks. Its masking loop over rows rewrites the masks of every row with the last
row's block, so it is only right at batch 1; here each row gets its own block. Its ratio is ``(1 - eps) 0.5 + eps``
(0.5005); ours is ``ratio`` (default 0.5). Draws come from an explicit ``torch.Generator``, or in training from one
generator per example and step (``example_uniforms``), so the masks do not depend on padding or batch composition.

An option the reference does not have: ``ratio`` may be a tensor [B] of per-row ratios (``example_ratios``: drawn
uniformly in a range per example and step, ``train.py --ratio-range``), so that view A also shows the model nearly
fully masked blocks, the state a parallel decoder's first step is in; at the fixed 0.5 it never sees one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Views:
    """Two complementary noisy copies of a batch and the positions each one is trained on."""

    noisy_a: torch.Tensor  # [B, T] ids with MASK at view A's masked active tokens and after the active block
    noisy_b: torch.Tensor  # [B, T] same with the complementary mask of the active block
    loss_a: torch.Tensor  # [B, T] bool: masked active-block tokens of view A (the loss positions)
    loss_b: torch.Tensor  # [B, T] bool: masked active-block tokens of view B
    active: torch.Tensor  # [B, T] bool: the active block (loss_a | loss_b == active, loss_a & loss_b empty)
    later: torch.Tensor  # [B, T] bool: response tokens after the active block (MASK in both views)


def example_uniforms(
    seed: int,
    step: int,
    example_ids: list[int],
    response_start: torch.Tensor,  # [B]
    response_length: torch.Tensor,  # [B]
    width: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The random draws of one training step: ``u_block`` [B] and ``u_tok`` [B, T] (response columns only; 1 elsewhere).

    Each example's draws come from its own generator seeded by (seed, step, example id) and are laid over its
    response, so the masks an example gets depend neither on padding nor on which device or micro-batch it lands in:
    a run is the same computation for any per-device batch size (up to float summation order).
    """
    b = len(example_ids)
    u_block = torch.empty(b)
    u_tok = torch.ones(b, width)
    for i, ex in enumerate(example_ids):
        g = torch.Generator().manual_seed(((seed * 1_000_003 + step) * 1_000_033 + int(ex)) % (2**63))
        s, n = int(response_start[i]), int(response_length[i])
        u_block[i] = torch.rand(1, generator=g)[0]
        u_tok[i, s : s + n] = torch.rand(n, generator=g)
    return u_block, u_tok


def check_ratio_range(low: float, high: float) -> None:
    """Raise unless 0 < low <= high < 1 (both views of every example keep a masked token in expectation)."""
    if not 0.0 < low <= high < 1.0:
        raise ValueError(f"mask ratio range must satisfy 0 < low <= high < 1, got ({low}, {high})")


def example_ratios(seed: int, step: int, example_ids: list[int], low: float, high: float) -> torch.Tensor:
    """Per-example mask ratios [B] of one training step, uniform in [low, high], each from its own generator seeded by
    (seed, step, example id) apart from ``example_uniforms``'s, so the block and token draws stay those of the fixed
    ratio run."""
    check_ratio_range(low, high)
    out = torch.empty(len(example_ids), dtype=torch.float64)
    for i, ex in enumerate(example_ids):
        g = torch.Generator().manual_seed((((seed * 1_000_003 + step) * 1_000_033 + int(ex)) * 31 + 17) % (2**63))
        out[i] = low + (high - low) * torch.rand(1, generator=g, dtype=torch.float64)[0]
    return out


def complementary_views(
    input_ids: torch.Tensor,  # [B, T] clean rows (left padding, prompt, response)
    response_start: torch.Tensor,  # [B] column of each row's first response token
    response_length: torch.Tensor,  # [B] response tokens per row (the row ends at response_start + length)
    *,
    mask_id: int,
    generator: torch.Generator | None = None,
    uniforms: tuple[torch.Tensor, torch.Tensor] | None = None,
    semi_ar: bool = True,
    block: int = 32,
    ratio: float | torch.Tensor = 0.5,
) -> Views:
    """Draw the active region per row (a random response block, or the whole response when ``semi_ar`` is False) and
    its two complementary masks. The draws are ``uniforms`` = (u_block [B], u_tok [B, T]) (see ``example_uniforms``)
    or, from ``generator``, one block draw per row then one uniform per position. ``ratio``: one for every row, or a
    tensor [B] of per-row ratios (``example_ratios``)."""
    r = torch.as_tensor(ratio, dtype=torch.float64)
    if r.dim() > 1 or (r.dim() == 1 and r.shape[0] != input_ids.shape[0]) or not bool(((r > 0) & (r < 1)).all()):
        raise ValueError(f"mask ratio must lie in (0, 1), one number or one per row, got {ratio}")
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    if (generator is None) == (uniforms is None):
        raise ValueError("give exactly one of generator= and uniforms=")
    b, t = input_ids.shape
    dev = input_ids.device
    start = response_start.to(dev).long()
    length = response_length.to(dev).long()
    if bool((length < 1).any()):
        raise ValueError("every row needs a response of at least one token")
    if bool((start < 1).any()) or bool((start + length > t).any()):
        raise ValueError("every row needs a prompt token before its response and must end inside the row")
    if uniforms is None:
        gdev = generator.device
        uniforms = (torch.rand(b, generator=generator, device=gdev), torch.rand(b, t, generator=generator, device=gdev))
    u_block, u_tok = (u.to(dev) for u in uniforms)  # [B], [B, T]
    col = torch.arange(t, device=dev)[None, :]  # [1, T]
    end = start + length
    if semi_ar:
        n_blocks = (length + block - 1) // block  # [B] non-empty blocks
        n = (u_block * n_blocks).long().clamp(max=n_blocks - 1)  # [B] uniform over 0..n_blocks-1
        a0 = start + n * block
        a1 = torch.minimum(a0 + block, end)
    else:
        a0, a1 = start, end
    active = (col >= a0[:, None]) & (col < a1[:, None])  # [B, T]
    later = (col >= a1[:, None]) & (col < end[:, None])
    pick = u_tok < (r.to(dev)[:, None] if r.dim() == 1 else r.item())  # [B, T] view A's masked tokens
    loss_a = active & pick
    loss_b = active & ~pick
    mask = torch.full_like(input_ids, mask_id)
    noisy_a = torch.where(loss_a | later, mask, input_ids)
    noisy_b = torch.where(loss_b | later, mask, input_ids)
    return Views(noisy_a, noisy_b, loss_a, loss_b, active, later)
