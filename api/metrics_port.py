"""``/metrics`` on a listener of its own (``SANDBOX_WORKSPACE_METRICS_PORT``).

Contract: with a metrics port set, ``serving(registry, host, port)`` serves the app's
registry at ``GET /metrics`` on ``host:port`` for as long as the context is open (the
API's lifespan), and the API's own port no longer answers ``/metrics`` (404): a platform
exposes the API through an Ingress and keeps the metrics port inside the cluster for
Prometheus alone. The process's signals stay the main server's (this listener takes
none); it ends when the API shuts down. Like the API's own server it makes no wakeup
while idle (``sandbox_workspace.server.QuietServer``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sandbox_workspace.http_guard import HttpGuard
from sandbox_workspace.server import QuietServer, bind


class _Listener(QuietServer):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # SIGTERM/SIGINT are the API server's: it ends this listener in its lifespan


def metrics_app(registry: CollectorRegistry) -> Starlette:
    async def metrics(_: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return Starlette(routes=[Route("/metrics", metrics, methods=["GET"])])


@contextlib.asynccontextmanager
async def serving(registry: CollectorRegistry, host: str, port: int) -> AsyncIterator[None]:
    sock = bind(host, port)
    config = uvicorn.Config(
        metrics_app(registry),
        log_config=None,
        log_level="warning",
        lifespan="off",
        http=HttpGuard().protocol(),
    )
    server = _Listener(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        yield
    finally:
        server.should_exit = True
        await task
        sock.close()
