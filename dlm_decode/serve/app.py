"""The FastAPI app: OpenAI's chat completions, completions and models, plus ``/health`` and ``/metrics``.

``create_app(config, engine=None, load=None)``: give a started-or-not ``Engine``, or a ``load()`` that builds one (run
on a thread at start-up: ``/health`` answers 503 "loading" until it returns). Request bodies are read by
``engine.openai_format`` (the batch files' rules: same answers, same messages); a bad one is a 400 naming the field.
Errors follow OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``:

* 400 a bad or unsupported field, an engine option the engine refuses, a prompt over ``max_prompt_tokens``;
* 401 a missing or wrong ``Authorization: Bearer KEY`` when the server has an API key (``/health`` and ``/metrics``
  stay open: a load balancer and Prometheus probe them);
* 404 a ``model`` that is not the served name; 408 a request past its ``timeout`` (it is cancelled);
* 413 a body over ``max_body_bytes``; 429 (with ``Retry-After``) when ``max_batch + max_waiting`` requests are in
  flight; 503 while loading or draining (SIGTERM: running requests finish, new ones are refused);
* 500 anything unexpected: the client gets the request id, the traceback goes to the server log only.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import json
import logging
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from dlm_decode.engine.engine import Engine
from dlm_decode.engine.openai_format import Body, parse_body, response_body
from dlm_decode.engine.request import EngineResult
from dlm_decode.serve.answer import ClientGone, Pump, RequestTimeout, StreamRun, next_item, sse_chunks
from dlm_decode.serve.metrics import ServerMetrics

log = logging.getLogger("dlm_decode.serve")
CLIENT_GONE = 499  # nginx's code for a client that closed the connection (metrics only)


@dataclass(frozen=True)
class ServeConfig:
    """The server's limits and names (the engine's own limits are the engine's)."""

    model_name: str
    api_key: str | None = None
    max_waiting: int = 64  # requests in flight beyond the engine's max_batch before a 429
    max_body_bytes: int = 1 << 20
    max_prompt_tokens: int | None = None
    retry_after_s: int = 1


class ApiError(Exception):
    """An answer in OpenAI's error shape."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", **headers: str) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.headers = status, message, kind, headers

    def response(self) -> JSONResponse:
        err = {"message": self.message, "type": self.kind, "param": None, "code": self.status}
        return JSONResponse({"error": err}, status_code=self.status, headers=self.headers)


class ServerState:
    """The engine once loaded, the server's status, and the requests in flight."""

    def __init__(self, engine: Engine | None) -> None:
        self.engine = engine
        self.status = "loading" if engine is None else "ready"  # -> "ready" -> "draining"; or "failed"
        self.active = 0
        self._lock = threading.Lock()

    def enter(self) -> None:
        with self._lock:
            self.active += 1

    def leave(self) -> None:
        with self._lock:
            self.active -= 1

    def stats(self) -> dict[str, Any] | None:
        return None if self.engine is None else self.engine.stats()


def request_options(defaults: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """A request's engine options over the server's defaults: a request that names another sampler (cache) than the
    default does not inherit the default's sampler (cache) options."""
    out = dict(options)
    for name in ("sampler", "cache"):
        if name in out and out[name] != defaults.get(name) and f"{name}_options" not in out:
            out[f"{name}_options"] = {}
    return out


def create_app(config: ServeConfig, engine: Engine | None = None, load: Callable[[], Engine] | None = None) -> FastAPI:
    """The app (see the module docstring); exactly one of ``engine`` and ``load``."""
    if (engine is None) == (load is None):
        raise ValueError("create_app needs an engine or a load() that builds one, not both")
    state = ServerState(engine)
    metrics = ServerMetrics(state.stats)
    metrics.in_flight.set_function(lambda: state.active)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if state.engine is not None:
            state.engine.start()
        else:
            threading.Thread(target=_load, args=(state, load), name="dlm-load", daemon=True).start()
        yield
        if state.engine is not None:
            state.engine.stop(drain=False)

    app = FastAPI(title="dlm-decode", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.serve = state
    app.state.metrics = metrics
    app.state.config = config
    _routes(app, config, state, metrics)
    return app


def _load(state: ServerState, load: Callable[[], Engine]) -> None:
    try:
        engine = load()
        engine.start()
    except Exception:
        log.exception("loading the model failed")
        state.status = "failed"
        return
    state.engine, state.status = engine, "ready"
    log.info("model loaded: ready")


def _routes(app: FastAPI, config: ServeConfig, state: ServerState, metrics: ServerMetrics) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(Exception)
    async def server_error(request: Request, exc: Exception) -> JSONResponse:
        rid = f"err-{uuid.uuid4().hex[:12]}"
        log.error("request %s %s failed (request id %s)", request.method, request.url.path, rid, exc_info=exc)
        msg = f"internal server error; request id {rid} (the details are in the server log)"
        return ApiError(500, msg, "server_error", **{"x-request-id": rid}).response()

    @app.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse({"status": state.status}, status_code=200 if state.status == "ready" else 503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        text = await asyncio.to_thread(generate_latest, metrics.registry)  # the engine's lock waits out a step
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        _check_key(request, config)
        card = {"id": config.model_name, "object": "model", "created": 0, "owned_by": "dlm-decode"}
        return JSONResponse({"object": "list", "data": [card]})

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await _complete(request, "chat", config, state, metrics)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _complete(request, "completion", config, state, metrics)


def _check_key(request: Request, config: ServeConfig) -> None:
    if config.api_key is None:
        return
    given = request.headers.get("authorization", "")
    if not hmac.compare_digest(given.encode(), f"Bearer {config.api_key}".encode()):
        raise ApiError(401, "missing or wrong API key: send 'Authorization: Bearer KEY'", "authentication_error")


async def _read_body(request: Request, limit: int) -> Any:
    if int(request.headers.get("content-length") or 0) > limit:
        raise ApiError(413, f"request body over the server's limit of {limit} bytes")
    raw = bytearray()
    async for part in request.stream():
        raw += part
        if len(raw) > limit:
            raise ApiError(413, f"request body over the server's limit of {limit} bytes")
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ApiError(400, f"the request body is not JSON ({err})") from None


async def _complete(request: Request, kind: str, config: ServeConfig, state: ServerState, metrics: ServerMetrics):
    t0 = time.perf_counter()
    try:
        body, engine, handle = await _admit(request, kind, config, state)
    except ApiError as err:
        metrics.record(kind, err.status, time.perf_counter() - t0)
        return err.response()
    pump = Pump(handle, asyncio.get_running_loop())
    deadline = None if body.timeout is None else time.monotonic() + body.timeout
    if body.stream:
        run = StreamRun(body, engine, handle, config.model_name)
        end = functools.partial(_end_stream, run, state, metrics, t0)
        events = _stream(run, pump, deadline, end)
        weakref.finalize(events, end, CLIENT_GONE)  # a client gone before the first event: the body never starts
        return StreamingResponse(events, media_type="text/event-stream")
    status, result = 200, None
    try:
        while not isinstance(result, EngineResult):
            result = await next_item(pump, deadline, request)
    except RequestTimeout:
        status = 408
    except ClientGone:
        status = CLIENT_GONE
    finally:
        if status != 200:
            engine.cancel(handle)
        state.leave()
    if status != 200 or result.finish_reason == "error":
        status = 500 if status == 200 else status
        metrics.record(kind, status, time.perf_counter() - t0)
        msg = result.error if status == 500 else f"request {handle.id} ran past its timeout of {body.timeout} s"
        return ApiError(status, msg or "the request failed", "server_error" if status == 500 else "timeout").response()
    out = response_body(result, kind, config.model_name, body.stop, engine.tokenizer)
    metrics.record(kind, 200, time.perf_counter() - t0, result, out["usage"]["completion_tokens"])
    return JSONResponse(out)


async def _admit(request: Request, kind: str, config: ServeConfig, state: ServerState) -> tuple[Body, Engine, Any]:
    """Check a request and submit it: (body, engine, handle), or an ``ApiError``."""
    _check_key(request, config)
    engine = state.engine
    if state.status != "ready" or engine is None:
        raise ApiError(503, f"the server is {state.status}; retry later", "unavailable", **_retry(config))
    body = _parse(await _read_body(request, config.max_body_bytes), kind)
    if body.model is not None and body.model != config.model_name:
        raise ApiError(404, f"model {body.model!r} is not served here; this server serves {config.model_name!r}")
    if state.active >= engine.max_batch + config.max_waiting:
        msg = f"the queue is full ({state.active} requests in flight); retry later"
        raise ApiError(429, msg, "rate_limit_error", **_retry(config))
    state.enter()  # counted from here, so requests submitting at once cannot pass the queue's limit together
    try:  # on a worker thread: submit waits for the engine's lock, which a step holds for its forward
        opts = request_options(engine.defaults, body.options)
        handle = await asyncio.to_thread(engine.submit, body.prompt, **opts)
    except ValueError as err:
        state.leave()
        raise ApiError(400, str(err)) from None
    except BaseException:
        state.leave()
        raise
    n = len(handle.submission.prompt_ids)
    if config.max_prompt_tokens is not None and n > config.max_prompt_tokens:
        engine.cancel(handle)
        state.leave()
        raise ApiError(400, f"the prompt has {n} tokens; this server takes at most {config.max_prompt_tokens}")
    return body, engine, handle


def _parse(raw: Any, kind: str) -> Body:
    try:
        return parse_body(raw, kind, server=True)
    except ValueError as err:
        raise ApiError(400, str(err)) from None


def _retry(config: ServeConfig) -> dict[str, str]:
    return {"retry-after": str(config.retry_after_s)}


async def _stream(run: StreamRun, pump: Pump, deadline: float | None, end: Callable[[int], None]):
    """The SSE body; its end (finished, timed out, or the client gone) cancels the request and counts it."""
    status = CLIENT_GONE
    try:
        async for line in sse_chunks(run, pump, deadline):
            yield line
        status = run.status
    finally:
        end(status)


def _end_stream(run: StreamRun, state: ServerState, metrics: ServerMetrics, t0: float, status: int) -> None:
    """Once per stream, however it ends: cancel the request (a no-op when it had finished), count it."""
    if run.ended:
        return
    run.ended = True
    run.engine.cancel(run.handle)
    state.leave()
    done = status == 200
    metrics.record(run.body.kind, status, time.perf_counter() - t0, run.result if done else None, run.completion)
