"""A GET of one object over plain HTTP/1.1 on a raw socket: the download path of ``S3Store``
when its endpoint is ``http://`` (an in-cluster store such as SeaweedFS).

Why not obstore for this one call: a download through the API is CPU-bound on small
machines (store, API and client share the cores), and obstore's read path costs the API
~0.06 s of CPU per 256 MB more than reading the socket itself
(``python -m bench.download_relay``: the API's store read through obstore 0.15–0.19 s
against 0.11 s with ``loop.sock_recv``; docs/performance.md, the object store's section).
The request is still signed by obstore (a presigned URL, valid for ``SIGNED_FOR``), so no
SigV4 code lives here; TLS endpoints (AWS and the like) keep obstore's path.

Contract of ``open_get(url, key)``:
- 200 with a ``Content-Length`` → a ``Download`` whose ``info`` comes from the answer's
  headers (size, ETag, Last-Modified) and whose iteration yields exactly ``size`` bytes,
  or raises ``StoreUnavailable`` (the store closed early, went silent for
  ``READ_TIMEOUT``): a short object is never passed off as whole;
- 404 → ``ObjectNotFound``; any other status, a head over ``MAX_HEAD`` bytes, no
  ``Content-Length`` or a ``Transfer-Encoding`` → ``StoreUnavailable`` naming it;
- the socket is closed when the iteration ends, fails or is abandoned (``aclose``), so a
  client that goes away mid-download leaves no descriptor behind.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from urllib.parse import urlsplit

from .base import ObjectInfo, ObjectNotFound, StoreUnavailable

SIGNED_FOR = timedelta(minutes=5)  # only the request's start must fall inside it
CHUNK = 1024 * 1024
MAX_HEAD = 64 * 1024
CONNECT_TIMEOUT = 5.0
READ_TIMEOUT = 60.0  # s of silence mid-body before the download counts as failed


def _head_fields(head: bytes) -> tuple[int, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise StoreUnavailable(f"object store answered no HTTP/1 status: {lines[0][:100]!r}")
    fields = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            fields[name.strip().lower()] = value.strip()
    return int(parts[1]), fields


def _modified(fields: dict[str, str]) -> datetime:
    try:
        return parsedate_to_datetime(fields["last-modified"])
    except (KeyError, TypeError, ValueError):
        return datetime.now(UTC)


class PlainGet:
    """One open object on its own connection (``Download``; iterate once)."""

    def __init__(self, sock: socket.socket, info: ObjectInfo, first: bytes) -> None:
        self.info = info
        self._sock: socket.socket | None = sock
        self._first = first

    async def __aiter__(self) -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        sock, left = self._sock, self.info.size
        if sock is None:
            raise StoreUnavailable("the object's download was already read or closed")
        try:
            if self._first:
                left -= len(self._first)
                yield self._first
            while left > 0:
                try:
                    async with asyncio.timeout(READ_TIMEOUT):
                        chunk = await loop.sock_recv(sock, min(left, CHUNK))
                except (TimeoutError, OSError) as e:
                    raise self._short(left, e.__class__.__name__) from e
                if not chunk:
                    raise self._short(left, "connection closed")
                left -= len(chunk)
                yield chunk
        finally:
            await self.aclose()

    def _short(self, left: int, why: str) -> StoreUnavailable:
        got = self.info.size - left
        return StoreUnavailable(
            f"object store stopped sending {self.info.key!r} after {got} of "
            f"{self.info.size} bytes ({why})"
        )

    async def aclose(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()


async def _connect(host: str, port: int) -> socket.socket:
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    error: OSError | None = None
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                await loop.sock_connect(sock, address)
            return sock
        except (OSError, TimeoutError) as e:
            sock.close()
            error = e if isinstance(e, OSError) else OSError(f"connect timed out: {address}")
    raise StoreUnavailable(f"object store at {host}:{port} unreachable: {error}")


async def _read_head(sock: socket.socket) -> tuple[bytes, bytes]:
    loop, received = asyncio.get_running_loop(), b""
    while b"\r\n\r\n" not in received:
        if len(received) > MAX_HEAD:
            raise StoreUnavailable(f"object store's answer head is over {MAX_HEAD} bytes")
        async with asyncio.timeout(READ_TIMEOUT):
            got = await loop.sock_recv(sock, 65536)
        if not got:
            raise StoreUnavailable("object store closed the connection before answering")
        received += got
    head, _, rest = received.partition(b"\r\n\r\n")
    return head, rest


async def open_get(url: str, key: str) -> PlainGet:
    """GET the presigned ``url`` of object ``key`` (the module contract)."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"a plain GET needs an http:// URL, not {parts.scheme}://")
    target = f"{parts.path or '/'}{'?' + parts.query if parts.query else ''}"
    request = (
        f"GET {target} HTTP/1.1\r\nHost: {parts.netloc}\r\nConnection: close\r\n\r\n"
    ).encode("latin-1")
    sock = await _connect(parts.hostname, parts.port or 80)
    try:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(READ_TIMEOUT):
                await loop.sock_sendall(sock, request)
            head, rest = await _read_head(sock)
        except (OSError, TimeoutError) as e:
            raise StoreUnavailable(f"object store GET of {key!r} failed: {e!r}") from e
        status, fields = _head_fields(head)
        if status == 404:
            raise ObjectNotFound(f"no object {key!r}")
        if status != 200:
            raise StoreUnavailable(f"object store answered {status} to GET {key!r}: {rest[:200]!r}")
        if "transfer-encoding" in fields or not fields.get("content-length", "").isdigit():
            raise StoreUnavailable(
                f"object store's answer to GET {key!r} has no plain Content-Length"
            )
        size = int(fields["content-length"])
        if len(rest) > size:
            raise StoreUnavailable(f"object store sent more than {size} bytes of {key!r}")
        info = ObjectInfo(key, size, fields.get("etag", "").strip('"'), _modified(fields))
        return PlainGet(sock, info, rest)
    except BaseException:
        sock.close()
        raise
