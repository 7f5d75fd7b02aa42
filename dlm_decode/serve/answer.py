"""One request's run on the server: the engine's deltas brought to the event loop, stop strings, and the SSE chunks.

``Pump`` iterates a ``Handle`` on a thread of its own (the handle blocks) and hands each ``Delta``, then the
``EngineResult``, to the event loop. ``next_item`` waits for the next one under the request's deadline (``timeout``)
and, for a plain request, watches for a client that went away. ``sse_chunks`` turns the deltas into OpenAI stream
chunks: the text streams as the engine makes it final, a tail that could begin a stop string waits until it is
known not to, a stop string ends the stream (and cancels the request: its row leaves at the next step). The chunks
joined equal the non-streamed answer (``openai_format.response_body``), with the same usage.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from dlm_decode.engine.engine import Delta, Engine, Handle
from dlm_decode.engine.openai_format import Body, cut_at_stop, dlm_stats, stop_tokens, usage
from dlm_decode.engine.request import EngineResult

POLL_S = 0.25  # how often a waiting request checks its deadline and its client


class RequestTimeout(Exception):
    """The request ran past its ``timeout``."""


class ClientGone(Exception):
    """The client closed the connection."""


class Pump:
    """A handle's deltas and result, handed from a thread to the event loop's queue."""

    def __init__(self, handle: Handle, loop: asyncio.AbstractEventLoop) -> None:
        self.handle, self.loop = handle, loop
        self.queue: asyncio.Queue = asyncio.Queue()
        threading.Thread(target=self._run, name=f"pump-{handle.id}", daemon=True).start()

    def _run(self) -> None:
        for delta in self.handle:
            self._put(delta)
        self._put(self.handle.result())

    def _put(self, item: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the loop has closed (shutdown): nobody is listening
            pass


async def next_item(pump: Pump, deadline: float | None, request: Any = None) -> Delta | EngineResult:
    """The pump's next item; ``RequestTimeout`` past ``deadline`` (``time.monotonic``), ``ClientGone`` when
    ``request`` (given for plain requests: a stream learns of a disconnect from its own sends) has disconnected."""
    while True:
        wait = POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())
        if wait <= 0:
            raise RequestTimeout
        try:
            return await asyncio.wait_for(pump.queue.get(), wait)
        except TimeoutError:
            if request is not None and await request.is_disconnected():
                raise ClientGone from None


def held_back(text: str, stops: tuple[str, ...]) -> int:
    """How many trailing characters of ``text`` could be the start of a stop string (they wait)."""
    return max((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)


@dataclass
class StreamRun:
    """What a stream has seen and sent; ``finish``, ``completion`` and ``result`` are set at its end."""

    body: Body
    engine: Engine
    handle: Handle
    name: str
    text: str = ""  # the deltas' text joined
    ids: list[int] = field(default_factory=list)
    sent: int = 0  # characters of ``text`` sent
    finish: str | None = None
    completion: int = 0
    result: EngineResult | None = None
    status: int = 200  # the HTTP status the stream stands for (408 timed out, 500 failed), for the metrics
    ended: bool = False  # counted and cancelled (once)
    created: int = field(default_factory=lambda: int(time.time()))

    def chunk(self, text: str | None = None, finish: str | None = None, role: bool = False, **extra: Any) -> str:
        """One ``data:`` line: a ``chat.completion.chunk`` or a streamed ``text_completion``."""
        chat = self.body.kind == "chat"
        choices: list[dict[str, Any]] = []
        if text is not None or finish is not None or role:
            c: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
            if chat:
                c["delta"] = ({"role": "assistant"} if role else {}) | ({} if text is None else {"content": text})
            else:
                c["text"] = text or ""
            choices.append(c)
        obj = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{self.handle.id}",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": self.created,
            "model": self.name,
            "choices": choices,
            **extra,
        }
        return f"data: {json.dumps(obj)}\n\n"

    def take(self, delta: Delta) -> str | None:
        """Add a delta; the text that can be sent now (None: nothing yet). A stop string sets ``finish``."""
        if self.finish is not None:
            return None
        self.text += delta.text
        self.ids += delta.token_ids
        cut, stopped = cut_at_stop(self.text, self.body.stop)
        if stopped:
            self.finish = "stop"
            self.completion = stop_tokens(self.engine.tokenizer, self.ids, self.body.stop)
            upto = len(cut)
        else:
            upto = len(self.text) - held_back(self.text, self.body.stop)
        out, self.sent = self.text[self.sent : upto], max(self.sent, upto)
        return out or None


async def sse_chunks(run: StreamRun, pump: Pump, deadline: float | None) -> AsyncIterator[str]:
    """The stream's ``data:`` lines, ending with ``data: [DONE]`` (an error or a timeout: an error object first)."""
    if run.body.kind == "chat":
        yield run.chunk("", role=True)
    try:
        while run.result is None:
            item = await next_item(pump, deadline)
            if isinstance(item, EngineResult):
                run.result = item
            elif (text := run.take(item)) is not None:
                yield run.chunk(text)
            if run.finish == "stop" and run.result is None:
                run.engine.cancel(run.handle)  # the answer is complete: its row leaves at the next step
                deadline = None
    except RequestTimeout:
        run.engine.cancel(run.handle)
        run.status = 408
        yield error_line(f"request {run.handle.id} ran past its timeout of {run.body.timeout} s", "timeout", 408)
        yield "data: [DONE]\n\n"
        return
    r = run.result
    if r.finish_reason == "error":
        run.status = 500
        yield error_line(r.error or "the request failed", "server_error", 500)
        yield "data: [DONE]\n\n"
        return
    if run.finish is None:
        run.finish = "stop" if r.finish_reason == "stop" else "length"
        run.completion = len(r.completion_ids)
        rest = run.text[run.sent :]
        if rest:
            yield run.chunk(rest)
    stats = {"dlm": dlm_stats(r)}
    yield run.chunk(None, run.finish, **({} if run.body.include_usage else stats))
    if run.body.include_usage:
        yield run.chunk(None, None, usage=usage(r, run.completion), **stats)
    yield "data: [DONE]\n\n"


def error_line(message: str, kind: str, code: int) -> str:
    return f"data: {json.dumps({'error': {'message': message, 'type': kind, 'param': None, 'code': code}})}\n\n"
