"""The server's Prometheus series, in a registry of its own (one per app, so apps in one process do not mix).

Counted per request when it ends: ``dlm_requests_total{endpoint, status}`` (status: the HTTP code, ``499`` for a client
that went away), ``dlm_prompt_tokens_total``, ``dlm_completion_tokens_total``, and the histograms
``dlm_request_nfe`` (the request's forwards), ``dlm_request_latency_seconds`` (arrival to last byte) and
``dlm_request_queue_seconds`` (submit to first step). Read from the engine at each scrape: ``dlm_queue_length``
(waiting requests), ``dlm_running_rows`` (requests decoding), ``dlm_forwards_total`` (model calls; a call serves
every running row), ``dlm_steps_total``; and from the server: ``dlm_requests_in_flight``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

NFE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
SECONDS_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class EngineCollector:
    """The engine's counts at scrape time (``Engine.stats``); nothing before the model is loaded."""

    def __init__(self, stats: Callable[[], dict[str, Any] | None]) -> None:
        self.stats = stats

    def collect(self):
        s = self.stats()
        if s is None:
            return
        yield GaugeMetricFamily("dlm_queue_length", "requests waiting for a row", value=s["waiting"])
        yield GaugeMetricFamily("dlm_running_rows", "requests decoding now", value=s["running"])
        yield CounterMetricFamily("dlm_forwards", "model forwards (each serves every running row)", s["model_calls"])
        yield CounterMetricFamily("dlm_steps", "engine scheduling steps", value=s["steps"])


class ServerMetrics:
    """The series of one server (see the module docstring)."""

    def __init__(self, stats: Callable[[], dict[str, Any] | None]) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "dlm_requests", "requests by endpoint and HTTP status", ["endpoint", "status"], registry=r
        )
        self.prompt_tokens = Counter("dlm_prompt_tokens", "prompt tokens of answered requests", registry=r)
        self.completion_tokens = Counter("dlm_completion_tokens", "completion tokens of answered requests", registry=r)
        self.nfe = Histogram("dlm_request_nfe", "forwards per request", buckets=NFE_BUCKETS, registry=r)
        self.latency = Histogram(
            "dlm_request_latency_seconds", "arrival to the last byte", buckets=SECONDS_BUCKETS, registry=r
        )
        self.queued = Histogram(
            "dlm_request_queue_seconds", "submit to the first step", buckets=SECONDS_BUCKETS, registry=r
        )
        self.in_flight = Gauge("dlm_requests_in_flight", "requests submitted and not ended", registry=r)
        r.register(EngineCollector(stats))

    def record(self, endpoint: str, status: int, seconds: float, result: Any = None, completion: int = 0) -> None:
        """One ended request: its status and latency, and, when it ran, its tokens, forwards and queueing."""
        self.requests.labels(endpoint, str(status)).inc()
        self.latency.observe(seconds)
        if result is not None:
            self.prompt_tokens.inc(len(result.prompt_ids))
            self.completion_tokens.inc(completion)
            self.nfe.observe(result.nfe)
            self.queued.observe(result.queued_seconds)
