"""A TCP proxy on loopback that a test can cut: a network partition between one process
and a server (e.g. one API replica and Redis), made and healed on demand.

``TcpProxy(host, port).start()`` listens on a free loopback port and forwards every
connection to ``host:port`` (two threads a connection); ``TcpProxy.on(listener, target)``
serves a listening socket made elsewhere (e.g. inherited from another network namespace)
and asks ``target()`` where to connect, per connection (a pod's address changes).
``cut()`` closes every connection and refuses new ones (accepted, then closed at once)
until ``heal()``; ``stop()`` ends it.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable


class TcpProxy:
    def __init__(self, host: str, port: int, listener: socket.socket | None = None) -> None:
        self.target: Callable[[], tuple[str, int]] = lambda: (host, port)
        self._listener = listener or socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._cut = False
        self._stopped = False

    @classmethod
    def on(cls, listener: socket.socket, target: Callable[[], tuple[str, int]]) -> TcpProxy:
        proxy = cls("", 0, listener)
        proxy.target = target
        return proxy

    def start(self) -> TcpProxy:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._cut:
                client.close()
                continue
            try:
                server = socket.create_connection(self.target(), timeout=5)
                server.settimeout(None)  # the timeout was for connecting: idle is fine
            except Exception:
                client.close()
                continue
            with self._lock:
                self._open |= {client, server}
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                self._close(s)

    def _close(self, s: socket.socket) -> None:
        with self._lock:
            self._open.discard(s)
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
        s.close()

    def cut(self) -> None:
        self._cut = True
        with self._lock:
            sockets = list(self._open)
        for s in sockets:
            self._close(s)

    def heal(self) -> None:
        self._cut = False

    def stop(self) -> None:
        self._stopped = True
        self.cut()
        self._listener.close()
