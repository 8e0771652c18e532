"""Prometheus metrics of the API: requests by route, method and status, latency, chat
runs by state, chat runs ended by outcome and the garbage-collector pauses (both counted
per process: api/chat/runs.py ``ENDED``, api/garbage.py).

A registry per app (not the global one) so several apps in one process — tests — do not
collide. Routes are labelled by their template, never by raw path (ids would explode the
label set). Pure ASGI middleware, so streamed bodies pass through untouched.
"""

from __future__ import annotations

import time

from fastapi import FastAPI, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from . import garbage
from .chat.run import ENDED


class _MetricsMiddleware:
    def __init__(self, app, requests: Counter, latency: Histogram) -> None:
        self.app = app
        self.requests = requests
        self.latency = latency

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = "500"

        async def send_and_observe(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = str(message["status"])
                self.latency.labels(scope["method"], _route(scope)).observe(
                    time.perf_counter() - start
                )
            await send(message)

        try:
            await self.app(scope, receive, send_and_observe)
        finally:
            self.requests.labels(scope["method"], _route(scope), status).inc()


def _route(scope) -> str:
    route = scope.get("route")
    return getattr(route, "path", None) or "unmatched"


class _RunsCollector:
    """Chat runs by state, read from the run registry at scrape time."""

    def __init__(self, runs) -> None:
        self.runs = runs

    def collect(self):
        counts = {"running": 0, "awaiting_approval": 0, "finished": 0}
        for run in self.runs.all():
            state = (
                "finished"
                if run.finished
                else "awaiting_approval"
                if run.awaiting_approval
                else "running"
            )
            counts[state] += 1
        family = GaugeMetricFamily(
            "sandbox_chat_runs", "Chat runs held by this API, by state", labels=["state"]
        )
        for state, value in counts.items():
            family.add_metric([state], value)
        yield family
        ended = CounterMetricFamily(
            "sandbox_chat_runs_ended",
            "Chat runs this process ended, by outcome: completed, or the error's code",
            labels=["outcome"],
        )
        for outcome, value in sorted(ENDED.items()):
            ended.add_metric([outcome], value)
        yield ended
        yield from getattr(self.runs.store, "metric_families", list)()  # a replicated store


def install_metrics(app: FastAPI, runs=None, *, route: bool = True) -> CollectorRegistry:
    """Count every request into a new registry; ``route``: serve it at ``/metrics`` on
    the app's own port (off when it has a port of its own: api/metrics_port.py)."""
    registry = CollectorRegistry()
    garbage.watch()
    registry.register(garbage.PAUSES)
    if runs is not None:
        registry.register(_RunsCollector(runs))
    requests = Counter(
        "sandbox_api_requests_total",
        "HTTP requests handled",
        ["method", "route", "status"],
        registry=registry,
    )
    latency = Histogram(
        "sandbox_api_request_seconds",
        "Time to the response headers",
        ["method", "route"],
        registry=registry,
    )
    app.add_middleware(_MetricsMiddleware, requests=requests, latency=latency)
    if route:

        @app.get("/metrics", include_in_schema=False)
        async def metrics() -> Response:
            return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return registry
