"""The learning-rate schedule of a curriculum: warm-up, constant, linear decay; a ramp at every later stage.

Extending a run (more steps on resume) only moves the decay, so a curriculum can grow without restarting its
schedule; a stage's own peak rate scales the whole shape for its steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from recipes.train_demo.config import Stage


def stage_at(stages: Sequence[Stage], step: int) -> tuple[int, Stage]:
    """(index, stage) that step ``step`` (0-based) belongs to; past the end, the last stage."""
    end = 0
    for i, st in enumerate(stages):
        end += st.steps
        if step < end:
            return i, st
    return len(stages) - 1, stages[-1]


def wsd_lambda(
    warmup: int,
    total: int,
    decay: int,
    floor: float = 0.1,
    restarts: tuple[int, ...] = (),
    restart_warmup: int = 0,
    scale_at: Any = None,
):
    """Warm-up, then a constant rate, then a linear decay to ``floor`` over the last ``decay`` steps. Extending a run
    (more steps on resume) only moves the decay, so a curriculum can grow without restarting its schedule.

    ``restarts`` (the first steps of later stages) each ramp the rate again from ``1 / restart_warmup`` over
    ``restart_warmup`` steps: a new kind of row (the official prompts after short rows) starts at a loss near 16 and,
    at the full rate, its first updates wiped out the in-context copying the short stages had built (measured).
    ``scale_at(step)`` multiplies the whole schedule (a stage's own peak rate over ``optim.lr``)."""

    def f(step: int) -> float:
        base = scale_at(step) if scale_at is not None else 1.0
        return base * _shape(step)

    def _shape(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        scale = 1.0
        for start in restarts:
            if restart_warmup and start <= step < start + restart_warmup:
                scale = (step - start + 1) / restart_warmup
        if step < total - decay:
            return scale
        return scale * max(floor, floor + (1 - floor) * (total - step) / max(decay, 1))

    return f


def apply_peak_rate(sched: torch.optim.lr_scheduler.LambdaLR, lr: float, say: Any = print) -> None:
    """Make a resumed schedule follow this config's ``optim.lr``. A checkpoint restores the scheduler's base rates
    and the optimizer's current ones, so without this a resume with another rate silently kept the old peak (and a
    stage's ``lr``, scaled by ``optim.lr``, came out wrong too). With the same rate nothing changes."""
    old = sched.base_lrs[0]
    if old == lr:
        return
    say(f"optim.lr {lr:g} replaces the checkpoint's peak rate {old:g} from the next step on")
    sched.base_lrs = [lr] * len(sched.base_lrs)
    for group, fn in zip(sched.optimizer.param_groups, sched.lr_lambdas, strict=True):
        group["initial_lr"] = lr
        group["lr"] = lr * fn(sched.last_epoch)


def stage_starts(stages: Sequence[Stage]) -> tuple[int, ...]:
    """First step of every stage after the first."""
    starts, end = [], 0
    for st in stages[:-1]:
        end += st.steps
        starts.append(end)
    return tuple(starts)
