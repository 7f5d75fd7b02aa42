"""What Elastic-Cache's depth-aware forward is given and remembers (``DepthProgram``, ``DepthMemory``): the data of
the plan, built by the cache policy (``cache.elastic``) and run by the model (``models.depth.run_program``), so that
the policy never imports a model module (imports point down: models stand on cache, not the reverse).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch


@dataclass
class DepthMemory:
    """Per-call state of the depth-aware forward (kept by the policy in ``state.scratch``)."""

    hidden: torch.Tensor | None = None  # [L, B, T, d] each layer's input of every slot, as last computed
    picks: list[torch.Tensor] = field(default_factory=list)  # per layer, [B, track_num] most-attended decoded slots
    boundary: torch.Tensor | None = None  # [B] layer each row refreshed from in the last forward (L: none)
    sigma: torch.Tensor | None = None  # [L, B] drift test of the last forward (nan where not tested)
    slot_layers: int = 0  # (slot, layer) pairs computed so far in the call, padding included (the compute)

    def bind(self, n_layers: int, h: torch.Tensor, length: int) -> None:
        b, d = h.shape[0], h.shape[-1]
        if self.hidden is None or self.hidden.shape[1] != b:
            self.hidden = h.new_zeros(n_layers, b, length, d)
        self.picks = [h.new_zeros(0)] * n_layers
        self.boundary = torch.full((b,), n_layers, dtype=torch.long, device=h.device)
        self.sigma = torch.full((n_layers, b), math.nan, device=h.device)


@dataclass
class DepthProgram:
    """One forward's depth-aware plan (see the module docstring). Tensors are [B, ...] for the decoding batch; with
    classifier-free guidance the model's batch is twice that and they are repeated."""

    memory: DepthMemory
    positions: torch.Tensor  # [B, T] rope positions of every slot
    window: torch.Tensor  # [B, W] slots whose queries pick the most-attended tokens (padded by repeats)
    window_ok: torch.Tensor  # [B, W] bool: real window entries
    attendable: torch.Tensor  # [B, T] bool: slots that may be picked (decoded, real)
    track_num: int = 1
    gamma: float = 0.9
    full: bool = False  # a refresh step: every slot through every layer, no drift test
    track: torch.Tensor | None = None  # [B, K] sorted tracked slots (a subset of the step's compute)

    def for_batch(self, b: int) -> DepthProgram:
        """This program for a model batch of ``b`` rows (twice the decoding batch under classifier-free guidance)."""
        n = self.positions.shape[0]
        if b == n:
            return self
        if b != 2 * n:
            raise ValueError(f"depth-aware forward: model batch {b} is neither the decoding batch {n} nor twice it")

        def two(x: torch.Tensor | None) -> torch.Tensor | None:
            return None if x is None else torch.cat([x, x])

        return DepthProgram(
            self.memory,
            two(self.positions),
            two(self.window),
            two(self.window_ok),
            two(self.attendable),
            self.track_num,
            self.gamma,
            self.full,
            two(self.track),
        )
