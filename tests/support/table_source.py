"""A platform's table source on loopback (test support, not product code): a real HTTP
server (uvicorn in a thread) keeping tables in memory.

``GET /tables/{id}`` → ``{"id", "data"}``; ``PUT /tables/{id}`` with ``{"data"}`` stores it.
An id in ``forbidden`` answers 403, an unknown one 404. ``delay`` seconds are waited before
answering (a slow source); a PUT is stored only if its client is still connected after
the delay — a write the caller gave up on changes nothing. Requests are recorded with
their headers.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from sandbox_workspace.server import QuietServer


class TableSource:
    def __init__(self) -> None:
        self.tables: dict[str, object] = {}
        self.forbidden: set[str] = set()
        self.delay = 0.0
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.answered = 0  # requests answered (or given up on), for tests to wait on
        self.url = ""
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    async def _table(self, request: Request):
        try:
            return await self._answer(request)
        finally:
            self.answered += 1

    async def _answer(self, request: Request):
        table_id = request.path_params["table_id"]
        self.requests.append((request.method, table_id, dict(request.headers)))
        body = await request.json() if request.method == "PUT" else None
        if self.delay:
            await asyncio.sleep(self.delay)
        if table_id in self.forbidden:
            return JSONResponse({"detail": "forbidden"}, status_code=403)
        if table_id not in self.tables:
            return JSONResponse({"detail": "not found"}, status_code=404)
        if request.method == "PUT":
            if await request.is_disconnected():
                return JSONResponse({"detail": "client gone"}, status_code=499)
            self.tables[table_id] = body["data"]
        return JSONResponse({"id": table_id, "data": self.tables[table_id]})

    def start(self) -> TableSource:
        route = Route("/tables/{table_id}", self._table, methods=["GET", "PUT"])
        app = Starlette(routes=[route])
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        self._server = QuietServer(  # no 0.1 s tick; stop() wakes it from this thread
            uvicorn.Config(app, log_level="warning", lifespan="off")
        )
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            assert time.monotonic() < deadline, "table source did not start"
            time.sleep(0.01)
        self.url = f"http://127.0.0.1:{port}/tables"
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
            assert not self._thread.is_alive(), "table source did not stop"
