"""The egress proxy server: an HTTP proxy that applies each session's egress policy.

Contract:
- A connection belongs to the session its *listener or peer address* says (``serve_unix``:
  one Unix socket per session, bound only into that session's namespace; ``serve_tcp``:
  ``identify(peer address)``, the pod address under an enforced NetworkPolicy). Nothing
  the client sends picks the session.
- ``CONNECT host:port`` opens a tunnel when ``decide(policy, "https", host, port)``
  allows it; the first bytes in the tunnel must be a TLS ClientHello whose server name is
  that same host, or the tunnel is closed with a TLS ``unrecognized_name`` alert. The
  proxy never terminates TLS here: bytes pass through untouched.
- ``METHOD http://host[:port]/path`` forwards that one request (scheme ``http``) with its
  ``Host`` set from the URL, one ``Content-Length`` and ``Connection: close``; the answer
  is relayed as is. A head an upstream could read differently from the proxy (bare CR or
  LF, folded or spaced header names, two lengths, chunked bodies, control characters or
  an odd version in the request line) is refused, so no second request or ``Host`` rides
  past the checks.
- The proxy resolves names itself and connects to the address it checked; a name with any
  address in a forbidden network is refused (DNS rebinding), as is any IP literal.
- A refusal is an HTTP answer whose status line and body say why (``403 Egress refused:
  evil.test is not in this session's egress policy ...``): Python's http.client, pip and
  curl print the status line. Nothing is relayed from a refused destination.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import re
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from .policy import (
    DEFAULT_FORBIDDEN,
    DEFAULT_PORTS,
    EgressPolicy,
    IPAddress,
    IPNetwork,
    check_addresses,
    decide,
)
from .tls import MAX_HELLO, NotClientHello, client_hello_sni

log = logging.getLogger(__name__)

PolicyLookup = Callable[[str], EgressPolicy | None]
Resolver = Callable[[str, int], Awaitable[Sequence[IPAddress]]]
Identify = Callable[[object], str | None]

# A fatal TLS alert "unrecognized_name" (112), record version TLS 1.2.
TLS_ALERT_UNRECOGNIZED_NAME = bytes([0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x70])
_HOP_BY_HOP = {
    b"connection",
    b"keep-alive",
    b"proxy-connection",
    b"proxy-authorization",
    b"proxy-authenticate",
    b"te",
    b"trailer",
    b"upgrade",
    b"host",
}
_LENGTH = {b"content-length"}
_CHUNK = 256 * 1024
# RFC 9110 token characters: a header name is exactly this, no spaces around it.
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_VERSION = re.compile(rb"HTTP/1\.[01]")


async def system_resolve(host: str, port: int) -> list[IPAddress]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(ipaddress.ip_address(i[4][0].split("%", 1)[0]) for i in infos))


@dataclass(frozen=True)
class ProxyConfig:
    forbidden: tuple[IPNetwork, ...] = DEFAULT_FORBIDDEN
    connect_timeout: float = 10.0
    # The client must send its request head, in a tunnel its ClientHello, and each part of
    # a forwarded body within this.
    client_timeout: float = 10.0
    header_limit: int = 32 * 1024


class Refused(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


def refusal_response(status: int, reason: str) -> bytes:
    # The reason goes into the status line too: clients of CONNECT only show that.
    phrase = "".join(c if 32 <= ord(c) < 127 else "?" for c in reason)[:300]
    body = f"Egress refused: {reason}\n".encode()
    return (
        f"HTTP/1.1 {status} Egress refused: {phrase}\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n"
        "X-Sandbox-Egress: refused\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + body


def parse_headers(lines: list[bytes]) -> list[tuple[bytes, bytes]]:
    """(lower-case name, value) pairs; Refused(400) for anything an upstream could read
    differently from us: a name that is not a token (spaces, obs-fold continuation
    lines), a bare CR or LF or a NUL in a value (a second header or request smuggled
    past the checks)."""
    headers = []
    for line in lines:
        name, sep, value = line.partition(b":")
        if not sep or not _TOKEN.fullmatch(name) or any(c in value for c in b"\r\n\0"):
            raise Refused(400, "malformed header line")
        headers.append((name.lower(), value.strip(b" \t")))
    return headers


def parse_authority(authority: str, default_port: int | None) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) → (host, port); Refused(400) when malformed."""
    host, sep, port_text = authority.rpartition(":")
    if not sep or "]" in port_text:
        host, port_text = authority, ""
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not port_text:
        if default_port is None:
            raise Refused(400, f"CONNECT needs host:port, got {authority!r}")
        return host, default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise Refused(400, f"bad port in {authority!r}")
    return host, int(port_text)


class EgressProxy:
    def __init__(
        self,
        policies: PolicyLookup,
        *,
        resolve: Resolver = system_resolve,
        config: ProxyConfig | None = None,
    ) -> None:
        self.policies = policies
        self.resolve = resolve
        self.config = config or ProxyConfig()

    async def serve_unix(self, path: str, session_id: str) -> asyncio.Server:
        async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self.handle(reader, writer, session_id)

        return await asyncio.start_unix_server(on_client, path, limit=self.config.header_limit)

    async def serve_tcp(self, host: str, port: int, identify: Identify) -> asyncio.Server:
        async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self.handle(reader, writer, identify(writer.get_extra_info("peername")))

        return await asyncio.start_server(on_client, host, port, limit=self.config.header_limit)

    async def handle(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        session_id: str | None,
    ) -> None:
        try:
            try:
                await self._handle(reader, writer, session_id)
            except Refused as exc:
                log.info(
                    "egress refused",
                    extra={"session_id": session_id, "status": exc.status, "reason": exc.reason},
                )
                writer.write(refusal_response(exc.status, exc.reason))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _handle(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, session_id: str | None
    ) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.config.client_timeout)
        except asyncio.LimitOverrunError:
            raise Refused(431, "request head too large") from None
        request_line, *header_lines = head[:-4].split(b"\r\n")
        parts = request_line.split(b" ")
        if (
            len(parts) != 3
            or not _TOKEN.fullmatch(parts[0])
            or not _VERSION.fullmatch(parts[2])
            or not parts[1].isascii()
            or any(c < 0x21 or c == 0x7F for c in parts[1])
        ):
            raise Refused(400, "malformed request line")
        method, target, version = (part.decode("ascii") for part in parts)
        headers = parse_headers(header_lines)
        policy = self.policies(session_id) if session_id is not None else None
        if method == "CONNECT":
            host, port = parse_authority(target, None)
            await self._tunnel(reader, writer, policy, host, port)
        elif target.lower().startswith("http://"):
            await self._forward(reader, writer, policy, method, target, version, headers)
        else:
            raise Refused(
                400, "send requests in absolute form (http://host/path) or tunnel with CONNECT"
            )

    async def _open(
        self, policy: EgressPolicy | None, scheme: str, host: str, port: int
    ) -> tuple[str, asyncio.StreamReader, asyncio.StreamWriter]:
        decision = decide(policy, scheme, host, port)
        if not decision.allowed:
            raise Refused(403, decision.reason)
        name = decision.host
        try:
            addresses = await asyncio.wait_for(
                self.resolve(name, port), self.config.connect_timeout
            )
        except (OSError, TimeoutError):
            raise Refused(502, f"{name} does not resolve") from None
        checked = check_addresses(name, addresses, self.config.forbidden)
        if checked.refusal:
            raise Refused(403, checked.refusal)
        for address in checked.addresses:
            with contextlib.suppress(OSError, TimeoutError):
                upstream_reader, upstream_writer = await asyncio.wait_for(
                    asyncio.open_connection(str(address), port), self.config.connect_timeout
                )
                return name, upstream_reader, upstream_writer
        raise Refused(502, f"could not connect to {name}:{port}")

    async def _tunnel(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        policy: EgressPolicy | None,
        host: str,
        port: int,
    ) -> None:
        name, up_reader, up_writer = await self._open(policy, "https", host, port)
        try:
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            hello = await asyncio.wait_for(self._client_hello(reader), self.config.client_timeout)
            sni = _sni_or_none(hello)
            if sni != name:
                log.info(
                    "egress tunnel refused: server name mismatch",
                    extra={"connect_host": name, "sni": sni},
                )
                writer.write(TLS_ALERT_UNRECOGNIZED_NAME)
                await writer.drain()
                return
            up_writer.write(hello)
            await _relay(reader, writer, up_reader, up_writer)
        finally:
            up_writer.close()

    async def _client_hello(self, reader: asyncio.StreamReader) -> bytes:
        data = b""
        while True:
            chunk = await reader.read(MAX_HELLO - len(data))
            if not chunk:
                return data
            data += chunk
            try:
                if client_hello_sni(data) is not None:
                    return data
            except NotClientHello:
                return data
            if len(data) >= MAX_HELLO:
                return data

    async def _forward(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        policy: EgressPolicy | None,
        method: str,
        target: str,
        version: str,
        headers: list[tuple[bytes, bytes]],
    ) -> None:
        url = urlsplit(target)
        if url.username or url.password:
            raise Refused(400, "credentials in the URL are not forwarded")
        host, port = parse_authority(url.netloc, DEFAULT_PORTS["http"])
        if any(name == b"transfer-encoding" for name, _ in headers):
            raise Refused(411, "chunked request bodies are not forwarded: send Content-Length")
        lengths = {value for name, value in headers if name == b"content-length"}
        if len(lengths) > 1 or not all(v.isdigit() for v in lengths):
            # Two lengths could make the upstream read a second, unchecked request.
            raise Refused(400, "one numeric Content-Length, please")
        length = int(next(iter(lengths), b"0"))
        _, up_reader, up_writer = await self._open(policy, "http", host, port)
        try:
            path = (url.path or "/") + (f"?{url.query}" if url.query else "")
            out = [f"{method} {path} {version}".encode(), b"Host: " + url.netloc.encode()]
            out += [k + b": " + v for k, v in headers if k not in _HOP_BY_HOP | _LENGTH]
            if lengths:
                out.append(b"Content-Length: %d" % length)
            out.append(b"Connection: close")
            up_writer.write(b"\r\n".join(out) + b"\r\n\r\n")
            while length > 0:
                # Each part of the body within client_timeout: a client that stops
                # sending (slowloris) must not hold this task and the upstream forever.
                chunk = await asyncio.wait_for(
                    reader.read(min(length, _CHUNK)), self.config.client_timeout
                )
                if not chunk:
                    return
                up_writer.write(chunk)
                await up_writer.drain()
                length -= len(chunk)
            # One request per connection: whatever else the client sends is not forwarded
            # (a second request on this connection could name another Host).
            await _copy(up_reader, writer)
        finally:
            up_writer.close()


def _sni_or_none(hello: bytes) -> str | None:
    try:
        return client_hello_sni(hello)
    except NotClientHello:
        return None


async def _copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while data := await src.read(_CHUNK):
            dst.write(data)
            await dst.drain()
    finally:
        if dst.can_write_eof():
            with contextlib.suppress(OSError):
                dst.write_eof()


async def _relay(
    client_reader: asyncio.StreamReader,
    client_writer: asyncio.StreamWriter,
    up_reader: asyncio.StreamReader,
    up_writer: asyncio.StreamWriter,
) -> None:
    await asyncio.gather(
        _copy(client_reader, up_writer), _copy(up_reader, client_writer), return_exceptions=True
    )
