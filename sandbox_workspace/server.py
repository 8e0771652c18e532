"""Serving an ASGI app with uvicorn on a socket we bind ourselves.

Binding first lets callers ask for port 0 and learn the real port from ``--port-file``
(written atomically once the socket listens), which is how the local backend starts
runtimes without racing for free ports; ``on_listening(port)`` is told it too (dev's
banner). uvicorn's own lines (start, stop, the access log when asked) go through the
process's logging setup (``logs.configure``: text or JSON), not a format of uvicorn's.

``QuietServer`` is uvicorn's server without its 0.1 s tick: an idle server makes no
wakeup at all (10,000 idle runtimes on a cluster, hundreds on a node or in a test run,
each woke ten times a second for nothing). The tick did three things: (1) notice
``should_exit`` — here setting it (a signal, another thread) wakes the loop at once;
(2) refresh the ``Date`` header once a second — here its protocol (httptools', uvicorn's
default) refreshes it when a request begins, at most once a second, as exact as uvicorn's
(a second): ``QuietServer`` wraps it at startup, so no caller can forget it; (3)
``limit_max_requests`` and ``callback_notify`` — set either and the stock tick runs.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable
from email.utils import formatdate
from pathlib import Path

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .http_guard import HttpGuard


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def bind_unix(path: Path) -> socket.socket:
    """A listening Unix socket at ``path`` (a stale one is replaced), owner-only."""
    path.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def write_port_file(path: Path, port: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(f"{port}\n")
    os.replace(tmp, path)


class QuietServer(uvicorn.Server):
    """uvicorn's server whose main loop sleeps until told to exit (see the module)."""

    _loop: asyncio.AbstractEventLoop | None = None
    _woken: asyncio.Event | None = None
    _exit = False

    @property  # type: ignore[override]
    def should_exit(self) -> bool:
        return self._exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        # Set by uvicorn's signal handler (main thread, between bytecodes) or by another
        # thread: call_soon_threadsafe wakes the loop from either.
        self._exit = value
        loop, woken = self._loop, self._woken
        if value and loop is not None and woken is not None and not loop.is_closed():
            loop.call_soon_threadsafe(woken.set)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self.config.http_protocol_class = _dated(self.config.http_protocol_class)
        await super().startup(sockets)

    async def main_loop(self) -> None:
        if self.config.limit_max_requests is not None or self.config.callback_notify:
            await super().main_loop()  # they need the tick: keep it
            return
        self._woken = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        await self.on_tick(0)  # the first Date header
        # The loop is known before the flag is read: a setter on another thread either set
        # the flag before this read or sees the loop and wakes it.
        while not self.should_exit:
            await self._woken.wait()
            self._woken.clear()


def _dated(protocol: type[asyncio.Protocol]) -> type[HttpToolsProtocol]:
    """``protocol`` refreshing the server's Date header as a request begins (at most once
    a second): what uvicorn's tick did, with no timer (``QuietServer``)."""
    if not issubclass(protocol, HttpToolsProtocol):
        # Its callbacks are httptools': another protocol's Date would stay as it started.
        raise TypeError(f"QuietServer serves httptools' protocol, not {protocol.__name__}")

    class DatedProtocol(protocol):  # type: ignore[misc, valid-type]
        _second = -1  # per server: this class is made per ``serve``

        def on_message_begin(self) -> None:
            self._refresh_date()
            super().on_message_begin()

        def send_400_response(self, msg: str) -> None:  # a request that never began
            self._refresh_date()
            super().send_400_response(msg)

        def _refresh_date(self) -> None:
            now = time.time()
            if int(now) == DatedProtocol._second:
                return
            DatedProtocol._second = int(now)
            date = [(b"date", formatdate(now, usegmt=True).encode())]
            headers = self.config.encoded_headers
            self.server_state.default_headers = (
                date + headers if self.config.date_header else list(headers)
            )

    return DatedProtocol


def serve(
    app,
    host: str,
    port: int,
    *,
    port_file: Path | None = None,
    log_level: str = "info",
    access_log: bool = False,
    on_listening: Callable[[int], None] | None = None,
    uds: Path | None = None,
) -> None:
    """``uds``: listen on that Unix socket instead of ``host:port`` (a runtime in its own
    network namespace, reached by the API through the socket)."""
    if uds is not None:
        sock = bind_unix(uds)
    else:
        sock = bind(host, port)
        if port_file is not None:
            write_port_file(port_file, sock.getsockname()[1])
        if on_listening is not None:
            on_listening(sock.getsockname()[1])
    config = uvicorn.Config(
        app,
        log_level=log_level,
        log_config=None,
        access_log=access_log,
        lifespan="on",
        timeout_graceful_shutdown=5,
        # Long streams (uploads, SSE) must not be cut by uvicorn's keep-alive timer.
        timeout_keep_alive=30,
        # Header size and time bounds; an app may carry its own (api.app: from settings).
        http=getattr(getattr(app, "state", None), "http_guard", HttpGuard()).protocol(),
    )
    QuietServer(config).run(sockets=[sock])
