"""A loopback TCP proxy in front of an HTTP/1.1 server that can hold chosen requests: a
request whose request line contains the marker given to ``hold`` waits, head and body,
until ``release`` — the way to stop one store write exactly where a race needs it (the
server behind stays real; nothing is answered by the proxy itself). ``drop`` ends the
requests held instead, none of their bytes sent on: what a client killed with its request
in flight leaves — a request that never arrived.

Requests are framed by ``Content-Length`` (what the S3 client sends); a connection whose
request is chunked is passed through unparsed from there on. Answers flow back as bytes.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class HoldProxy:
    def __init__(self, upstream: str) -> None:
        """``upstream``: ``http://host:port`` of the server behind."""
        host, port = upstream.removeprefix("http://").rstrip("/").rsplit(":", 1)
        self.upstream = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._marker: bytes | None = None
        self._dropped = False
        self._released = threading.Event()
        self._lock = threading.Lock()
        self.held: list[bytes] = []  # request lines held so far
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def hold(self, marker: str) -> None:
        self._released.clear()
        self._marker = marker.encode()

    def release(self) -> None:
        self._marker = None
        self._released.set()

    def drop(self) -> None:
        self._dropped = True
        self.release()

    def close(self) -> None:
        self.release()
        for s in [self._listener, *self._sockets]:
            with contextlib.suppress(OSError):
                s.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            self._sockets += [client, server]
            threading.Thread(target=self._requests, args=(client, server), daemon=True).start()
            threading.Thread(target=_pipe, args=(server, client), daemon=True).start()

    def _requests(self, client: socket.socket, server: socket.socket) -> None:
        buffer = b""
        try:
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = client.recv(65536)
                    if not data:
                        return
                    buffer += data
                head, buffer = buffer.split(b"\r\n\r\n", 1)
                line, *headers = head.split(b"\r\n")
                fields = {
                    k.strip().lower(): v.strip() for k, _, v in (h.partition(b":") for h in headers)
                }
                if self._marker is not None and self._marker in line:
                    with self._lock:
                        self.held.append(line)
                    self._released.wait()
                    if self._dropped:
                        return
                server.sendall(head + b"\r\n\r\n")
                if b"chunked" in fields.get(b"transfer-encoding", b""):
                    server.sendall(buffer)
                    _pipe(client, server)
                    return
                length = int(fields.get(b"content-length", b"0"))
                while length:
                    if not buffer:
                        buffer = client.recv(min(length, 1 << 20))
                        if not buffer:
                            return
                    piece, buffer = buffer[:length], buffer[length:]
                    server.sendall(piece)
                    length -= len(piece)
        except OSError:
            return
        finally:
            with contextlib.suppress(OSError):
                server.shutdown(socket.SHUT_WR)


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        return
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)
