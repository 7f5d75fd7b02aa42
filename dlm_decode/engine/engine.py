"""``Engine``: continuous batching. Requests join and leave at any step; each decodes exactly as it would alone.

    eng = Engine(model, tokenizer=tok, max_batch=8)
    h = eng.submit("What is 2+2?", sampler="threshold", sampler_options={"threshold": 0.9}, gen_length=64, seed=1)
    for delta in h:                       # streams the answer as it becomes final (``stream.settled_ids``)
        print(delta.text, end="")
    print(h.result().nfe)
    results = eng.generate_many(["a", {"prompt": "b", "sampler": "low_confidence", "steps": 32}])

Each request is a unit of the step scheduler (``decode.scheduler``, the loop ``generate`` runs too) with its own
options, sampler, cache, seed (its own generator) and K/V row in a shared arena (``cache.arena``). Every step is one
forward over every running request where their calls agree (``decode.merged``); a request moves to its next block
as soon as its own block is done, leaves when it is finished or cancelled (its arena row is free for the next), and
a waiting request joins at the next step while fewer than ``max_batch`` run: the oldest (``admission="arrival"``,
first come first served, for serving) or the one with the most work (``"longest"``: the longest gen length, then the
longest prompt, then the oldest; for offline lists, so the short requests fill the rows around the long ones and a
list does not end with one long request decoding alone). ``max_tokens`` (optional) caps the sum
of the running requests' canvas lengths (prompt + generation slots), a bound on a forward's work; ``memory_budget``
(bytes, optional) caps the K/V arena: a request that would need more fails alone with a message, before any work.

Threads: ``submit`` and ``cancel`` are thread-safe and check a request on the caller's thread (a bad option raises
``ValueError`` there; nothing reaches the engine). Without ``start()`` the caller drives the engine (``step``,
``run_until_done``, or iterating a handle); with ``start()`` a background thread does, as a server needs.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from dlm_decode.cache.arena import Arena
from dlm_decode.core.inputs import ModelFacts, Prompt
from dlm_decode.core.special_ids import check_call_ids
from dlm_decode.decode.loop import Unit
from dlm_decode.decode.output import build_output
from dlm_decode.decode.prepare import prepare
from dlm_decode.decode.scheduler import Scheduler
from dlm_decode.engine.request import REQUEST_OPTIONS, EngineResult, Submission, check_submission
from dlm_decode.engine.stream import TextStream, settled_ids

_END = object()
#: the orders ``Engine(admission=...)`` takes waiting requests in
ADMISSIONS = ("arrival", "longest")


@dataclass(frozen=True)
class Delta:
    """A piece of a request's answer that has become final: its new token ids and their text."""

    token_ids: list[int]
    text: str = ""


class Handle:
    """A submitted request: iterate it for its ``Delta``s, ``result()`` for its ``EngineResult``."""

    def __init__(self, engine: Engine, submission: Submission) -> None:
        self.id = submission.id
        self.submission = submission
        self.submitted = time.perf_counter()
        self._engine = engine
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._done = threading.Event()
        self._result: EngineResult | None = None

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def __iter__(self):
        while True:
            try:
                item = self._queue.get(timeout=0.05) if self._engine.threaded else self._queue.get_nowait()
            except queue.Empty:
                if not self._engine.threaded:
                    self._engine.step()
                continue
            if item is _END:
                return
            yield item

    def result(self, timeout: float | None = None) -> EngineResult:
        """Wait for the request to end (driving the engine when no thread does) and return its result."""
        while not self._engine.threaded and not self.done:
            self._engine.step()
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.id} did not finish within {timeout} s")
        return self._result

    def _finish(self, result: EngineResult) -> None:
        self._result = result
        self._queue.put(_END)
        self._done.set()


@dataclass
class _Live:
    handle: Handle
    unit: Unit
    stream: TextStream
    started: float = field(default_factory=time.perf_counter)
    complete: bool = False  # the streamed answer has ended (an end id reached)


class Engine:
    """Continuous batching over one model (see the module docstring)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any | None = None,
        *,
        max_batch: int = 8,
        max_tokens: int | None = None,
        memory_budget: int | None = None,
        defaults: dict[str, Any] | None = None,
        admission: str = "arrival",
    ) -> None:
        for name, value in (("max_batch", max_batch), ("max_tokens", max_tokens), ("memory_budget", memory_budget)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if admission not in ADMISSIONS:
            raise ValueError(f"admission must be one of {', '.join(ADMISSIONS)}, got {admission!r}")
        unknown = sorted(set(defaults or {}) - set(REQUEST_OPTIONS))
        if unknown:
            raise ValueError(f"unknown default option(s) {', '.join(unknown)}; valid: {', '.join(REQUEST_OPTIONS)}")
        self.model, self.tokenizer = model, tokenizer
        self.max_batch, self.max_tokens, self.memory_budget = max_batch, max_tokens, memory_budget
        self.defaults, self.admission = dict(defaults or {}), admission
        self.facts = ModelFacts.of_model(model)
        check_call_ids(model, tokenizer)
        n_layers, n_kv, hd = model.kv_shape()
        param = next(model.parameters())
        self.arena = Arena(n_layers, max_batch, n_kv, hd, dtype=param.dtype, device=param.device)
        self.scheduler = Scheduler(model, self.arena, isolate=True)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._waiting: deque[Handle] = deque()
        self._live: dict[str, _Live] = {}
        self._handles: dict[str, Handle] = {}
        self._lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()  # set by submit and cancel: an idle background thread looks again

    # -- the caller's side (thread-safe) ------------------------------------------------------------------
    @property
    def threaded(self) -> bool:
        return self._thread is not None

    def submit(self, prompt: Prompt, **options: Any) -> Handle:
        """Check a request and queue it; ``ValueError`` (naming the option) when it is bad."""
        handle = Handle(self, check_submission(self.facts, self.tokenizer, prompt, self.defaults, options))
        with self._lock:
            self._handles[handle.id] = handle
        self._inbox.put(("submit", handle))
        self._wake.set()
        return handle

    def cancel(self, handle: Handle | str) -> str:
        """Stop a request: "cancelled" (it leaves before the next forward), or, a no-op, "finished" (it had
        ended) or "unknown" (no such request here)."""
        hid = handle if isinstance(handle, str) else handle.id
        with self._lock:
            h = self._handles.get(hid)
            if h is None:
                return "unknown"
            if h.done:
                return "finished"
        self._inbox.put(("cancel", hid))
        self._wake.set()
        return "cancelled"

    def run_until_done(self) -> None:
        """Run until no request is waiting or running."""
        if self.threaded:
            for h in list(self._handles.values()):
                h.result()
            return
        while self.step():
            pass

    def generate_many(self, requests: list[Prompt | dict[str, Any]]) -> list[EngineResult]:
        """Decode a list offline: each entry a prompt, or a dict with ``prompt`` and options. A bad entry gets a
        result with ``finish_reason`` "error" and the message; the others run. Results in input order, whatever
        order ``admission`` decodes them in (``Engine(admission="longest")`` is the faster one for a list whose gen
        lengths differ)."""
        handles: list[Handle | EngineResult] = []
        for i, r in enumerate(requests):
            opts = dict(r) if isinstance(r, dict) else {"prompt": r}
            try:
                handles.append(self.submit(opts.pop("prompt"), **opts))
            except (ValueError, KeyError) as err:
                msg = "request has no 'prompt'" if isinstance(err, KeyError) else str(err)
                handles.append(EngineResult(f"bad-{i}", [], [], None, 0, 0, "error", error=msg))
        self.run_until_done()
        return [h if isinstance(h, EngineResult) else h.result() for h in handles]

    def start(self) -> Engine:
        """Drive the engine from a background thread (idempotent)."""
        with self._lock:
            if self._thread is None:
                self._stop.clear()
                self._thread = threading.Thread(target=self._serve, name="dlm-engine", daemon=True)
                self._thread.start()
        return self

    def stop(self, drain: bool = True) -> None:
        """Stop the background thread, after the requests in flight end when ``drain``."""
        if self._thread is None:
            return
        if drain:
            self.run_until_done()
        self._stop.set()
        self._wake.set()
        self._thread.join()
        self._thread = None

    def stats(self) -> dict[str, Any]:
        """Counts for monitoring: waiting and running requests, steps, model calls, arena bytes."""
        with self._lock:
            return {
                "waiting": len(self._waiting) + self._inbox.qsize(),
                "running": len(self._live),
                "steps": self.scheduler.steps,
                "model_calls": self.scheduler.calls,
                "arena_bytes": self.arena.nbytes,
            }

    # -- the engine's side ----------------------------------------------------------------------------------
    @torch.no_grad()  # grad mode is per thread: generate's no_grad does not reach the engine's thread
    def step(self) -> bool:
        """One scheduling round: take in submissions and cancels, admit, one step of every running request,
        stream and finish. False when nothing is waiting or running."""
        with self._lock:
            self._drain_inbox()
            self._admit()
            if not self._live:
                return bool(self._waiting)
            done = self.scheduler.step()
            for hid in done:
                self._finish(hid)
            for live in self._live.values():
                self._push(live, done=False)
            return bool(self._live or self._waiting)

    def _serve(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            if not self.step():
                self._wake.wait(timeout=0.05)  # idle until a submit or cancel (or the stop flag is checked)

    def _drain_inbox(self) -> None:
        while True:
            try:
                kind, item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "submit":
                self._waiting.append(item)
            else:
                self._cancel(item)

    def _cancel(self, hid: str) -> None:
        for h in self._waiting:
            if h.id == hid:
                self._waiting.remove(h)
                h._finish(EngineResult(hid, h.submission.prompt_ids, [], None, 0, 0, "cancelled"))
                return
        if hid in self._live:
            self.scheduler.remove(hid)
            self._finish(hid, reason="cancelled")

    def _admit(self) -> None:
        while self._waiting and len(self._live) < self.max_batch:
            h = self._next_waiting()
            cost = len(h.submission.prompt_ids) + h.submission.request.config.gen_length
            running = sum(len(lv.handle.submission.prompt_ids) + lv.unit.state.gen_length for lv in self._live.values())
            if self.max_tokens is not None and self._live and running + cost > self.max_tokens:
                return  # waits for room in the forward
            self._waiting.remove(h)
            self._start(h)

    def _next_waiting(self) -> Handle:
        """The waiting request ``admission`` takes next: the oldest, or the most work (the oldest among equals)."""
        if self.admission == "arrival":
            return self._waiting[0]

        def work(h: Handle) -> tuple[int, int]:
            return h.submission.request.config.gen_length, len(h.submission.prompt_ids)

        return max(self._waiting, key=work)  # ``max`` keeps the first of equal keys: the oldest

    def _start(self, h: Handle) -> None:
        sub = h.submission
        try:
            state, store = prepare(self.model, [sub.prompt_ids], sub.request, self.tokenizer, self._store_for(h))
        except (ValueError, MemoryError, RuntimeError) as err:  # over the budget, or no memory: this request alone
            h._finish(EngineResult(h.id, sub.prompt_ids, [], None, 0, 0, "error", error=str(err)))
            return
        row = next((r for r, (v, _) in self.arena.lent.items() if v is store), None)
        unit = Unit(state, sub.request.sampler, sub.request.cache, store, store_row=row)
        live = _Live(h, unit, TextStream(self.tokenizer))
        self._live[h.id] = live
        if not self.scheduler.add(h.id, unit):
            self._finish(h.id)

    def _store_for(self, h: Handle):
        def make(length: int):
            need = self.arena.bytes_for(length)
            if self.memory_budget is not None and need > self.memory_budget:
                raise ValueError(
                    f"request {h.id} needs a K/V arena of {need} bytes ({self.max_batch} rows of {length} slots); "
                    f"memory_budget is {self.memory_budget}: lower max_batch or the request's length"
                )
            return self.arena.take(length)[1]

        return make

    def _push(self, live: _Live, done: bool) -> None:
        if live.complete:
            return
        ids, complete = settled_ids(live.unit, done)
        new_ids, text = live.stream.update(ids, complete)
        live.complete = complete
        if new_ids or text:
            live.handle._queue.put(Delta(new_ids, text))

    def _finish(self, hid: str, reason: str | None = None) -> None:
        live = self._live.pop(hid)
        unit, sub = live.unit, live.handle.submission
        if reason is None:
            self._push(live, done=True)
        seconds = time.perf_counter() - live.started
        out = build_output(
            unit.state, [sub.prompt_ids], sub.request, unit.store, seconds, tokenizer=self.tokenizer, trace=True
        )
        row = out.rows[0]
        error = self.scheduler.failed.pop(hid, None) or row.error
        answer = settled_ids(live.unit, True)[0]
        if reason is None:
            reason = "error" if error else ("stop" if len(answer) < len(row.generated_ids) else "length")
        if unit.store_row is not None:
            self.arena.give_back(unit.store_row)
        stats = {"sampler": out.sampler, "cache": out.cache, "config": out.config, "answer_length": len(answer)}
        result = EngineResult(
            hid, sub.prompt_ids, row.generated_ids, row.text, row.nfe, out.token_forwards, reason, error,
            row.accepted_steps, live.started - live.handle.submitted, seconds, stats,
            [c[0] for c in out.tokens_per_step], out.trace[0].tolist(),
        )  # fmt: skip
        live.handle._finish(result)
