"""Fixed-budget commit schedules of the baselines.

* LLaDA (``get_num_transfer_tokens`` of LLaDA's ``generate``): a block with m masks and S steps commits
  ``m // S`` tokens per step plus one more in each of the first ``m % S`` steps.
* Dream (``diffusion_generate``): timesteps ``linspace(1, eps, S + 1)`` in float32; step i commits
  ``int(n * (1 - t[i+1] / t[i]))`` of the n masks left, and all of them at the last step. The reference uses the
  batch-mean mask count; we use each row's own count, which is the same number for equal-length batches (every row
  then commits the same count each step) and keeps rows independent otherwise.
"""

from __future__ import annotations

import torch


def llada_schedule(masked: torch.Tensor, steps: int) -> torch.Tensor:
    """masked [B] mask counts -> [B, steps] tokens to commit per step."""
    base = masked // steps
    extra = (torch.arange(steps, device=masked.device)[None, :] < (masked % steps)[:, None]).long()
    return base[:, None] + extra


def dream_count(masked: torch.Tensor, step: int, steps: int, eps: float) -> torch.Tensor:
    """masked [B] masks left before ``step`` -> [B] tokens to commit at that step."""
    if step >= steps - 1:
        return masked.clone()
    t = torch.linspace(1, eps, steps + 1, device=masked.device)  # float32, as in the reference
    ratio = 1 - t[step + 1] / t[step]
    n = masked.to(torch.float32) * ratio  # float32 product, truncated like Python's int()
    return n.long()


def dream_counts(masked: torch.Tensor, step: torch.Tensor, steps: int, eps: float) -> torch.Tensor:
    """``dream_count`` with a step per entry: masked, step [...] (same shape) -> tokens to commit at each, with the
    same float32 arithmetic (so each entry equals ``dream_count(masked, step, steps, eps)``)."""
    t = torch.linspace(1, eps, steps + 1, device=masked.device)  # float32, as in the reference
    s = step.clamp(max=steps - 1)
    ratio = 1 - t[s + 1] / t[s]
    n = (masked.to(torch.float32) * ratio).long()
    return torch.where(step >= steps - 1, masked, n)
