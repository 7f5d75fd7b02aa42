"""The one decode loop: a step scheduler over units (``loop.Unit``), each moving block by block on its own.

    sched = Scheduler(model)
    sched.add("a", unit_a); sched.add("b", unit_b)
    while sched.units:
        done = sched.step()          # one step of every unit; the ids of the units that finished in it

Every ``step`` runs one step of each unit present: ``prepare_step`` for each, the forwards (``merged.run_forwards``:
one call for every group of units that can share one), ``finish_step`` for each, then ``advance`` for each, which
closes a unit's block when no row has a MASK left in it and opens its next one at once, so a unit never waits for
another. A unit added between steps joins at the next one; ``remove`` takes one out (cancelled) between steps.
``generate`` runs one unit (its whole batch) through it; the engine (``dlm_decode.engine``) runs one unit per
request, each with its own options, seed and K/V row in the shared arena.

With ``isolate`` True (the engine), an exception raised by one unit's step stops that unit alone with the message
(``failed``); the others go on. ``generate`` lets it propagate.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from dlm_decode.cache.arena import Arena
from dlm_decode.decode.loop import Pending, Unit, advance, finish_step, prepare_step
from dlm_decode.decode.merged import run_forwards


class Scheduler:
    """Units in flight and the step that moves them all (see the module docstring)."""

    def __init__(self, model: Any, arena: Arena | None = None, *, isolate: bool = False) -> None:
        self.model = model
        self.arena = arena
        self.isolate = isolate
        self.units: dict[Hashable, Unit] = {}
        self.failed: dict[Hashable, str] = {}  # units stopped by an exception of their own, with its message
        self.steps = 0  # steps run
        self.calls = 0  # model calls made (a step makes one per group of units that share a forward)

    def add(self, key: Hashable, unit: Unit) -> bool:
        """Take a unit in; False when it has nothing to decode (it is done already) or failed to start."""
        ok = self._guard(key, lambda: advance(unit))
        if ok:
            self.units[key] = unit
        return bool(ok)

    def remove(self, key: Hashable) -> Unit | None:
        """Take a unit out between steps (cancelled); None when it is not here."""
        return self.units.pop(key, None)

    def step(self) -> list[Hashable]:
        """One step of every unit; the keys of the units that are done after it (finished or failed), removed."""
        items: list[tuple[Hashable, Unit, Pending]] = []
        for key, unit in list(self.units.items()):
            pending = self._guard(key, lambda u=unit: prepare_step(self.model, u))
            if pending is not None:
                items.append((key, unit, pending))
        if items:
            logits, calls = run_forwards(self.model, [(u, p) for _, u, p in items], self.arena)
            self.calls += calls
            self.steps += 1
            for (key, unit, pending), lg in zip(items, logits, strict=True):
                self._guard(key, lambda u=unit, p=pending, x=lg: finish_step(u, p, x) or True)
        done = [key for key in list(self.units) if key in self.failed]
        for key, unit in list(self.units.items()):
            if key not in self.failed and not self._guard(key, lambda u=unit: advance(u)):
                done.append(key)
        for key in done:
            self.units.pop(key, None)
        return done

    def _guard(self, key: Hashable, fn: Any) -> Any:
        """``fn()``; with ``isolate``, an exception marks the unit failed (None) instead of propagating."""
        if not self.isolate:
            return fn()
        try:
            return fn()
        except Exception as err:  # the unit stops alone; the others go on
            self.failed[key] = f"{type(err).__name__}: {err}"
            return None
