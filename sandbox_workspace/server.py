"""Serving an ASGI app with uvicorn on a socket we bind ourselves.

Binding first lets callers ask for port 0 and learn the real port from ``--port-file``
(written atomically once the socket listens), which is how the local backend starts
runtimes without racing for free ports; ``on_listening(port)`` is told it too (dev's
banner). uvicorn's own lines (start, stop, the access log when asked) go through the
process's logging setup (``logs.configure``: text or JSON), not a format of uvicorn's.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path

import uvicorn

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
    uvicorn.Server(config).run(sockets=[sock])
