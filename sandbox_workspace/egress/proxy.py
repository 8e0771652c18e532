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
- Except for a host with a secret bound to it in the session's policy (exact name): there
  the proxy verifies the upstream's certificate (system roots, or ``upstream_ca``)
  before answering the CONNECT, then terminates the client's TLS with a leaf of its
  per-install CA (``ca.py``; SNI must be the host), reads one request (origin form, the
  same head checks as below, ``Content-Length`` bodies only), swaps each bound
  placeholder in the bound header only (``secrets.py``), sets ``Host`` from the CONNECT
  name, ``Accept-Encoding: identity`` and ``Connection: close``, and relays the answer
  with the injected values masked. One request per connection; redirects are relayed,
  never followed. Plain ``http://`` never carries a secret: its placeholders go as is.
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
- Bounds per session (``ProxyConfig``): at most ``max_connections`` connections open at
  once (tunnels, forwarded requests, heads still being read); the next ones are answered
  ``429 Egress refused: ... (<connections_setting>)`` once their head is read, and past
  twice the cap closed unanswered, so a flood ends at its own session's cap, not at the
  proxy's descriptors. A tunnel or an answer being relayed with no byte moved for
  ``idle_timeout`` seconds is closed.
- Open connections follow their session: ``recheck()`` closes each one whose policy no
  longer allows its destination (or, for ``serve_tcp``, whose peer address no longer
  identifies its session), ``close_session()`` closes all of a session's. Callers call
  them when a policy changes or a session goes; a change takes effect on open tunnels
  then, not only on the next connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import re
import socket
import ssl
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from .ca import InterceptCA
from .policy import (
    DEFAULT_FORBIDDEN,
    DEFAULT_PORTS,
    EgressPolicy,
    IPAddress,
    IPNetwork,
    SecretBinding,
    check_addresses,
    decide,
)
from .secrets import (
    Scrubber,
    SecretSource,
    SecretUnavailable,
    bound_in,
    checked_value,
    swap_headers,
)
from .splice import relay_streams
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
    # CA file that upstreams of intercepted hosts must chain to (None: the system's).
    upstream_ca: str | None = None
    # Connections one session may have open at once; the setting that changes it, named
    # in the refusal (the local backend's variable, the chart's value).
    max_connections: int = 64
    connections_setting: str = "max_connections"
    # A tunnel (or a relayed answer) with no byte moved either way this long is closed.
    idle_timeout: float = 600.0


@dataclass(eq=False)
class _Connection:
    """One open client connection: its task (cancelled to close it), where it goes once
    its head named it, and how to ask again which session its peer is."""

    task: asyncio.Task | None
    target: tuple[str, str, int] | None = None  # (scheme, host, port)
    whose: Callable[[], str | None] | None = None


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
        ca: InterceptCA | None = None,
        secrets: SecretSource | None = None,
    ) -> None:
        self.policies = policies
        self.resolve = resolve
        self.config = config or ProxyConfig()
        self.ca, self.secrets = ca, secrets
        self._upstream_tls = ssl.create_default_context(cafile=self.config.upstream_ca)
        self._upstream_tls.set_alpn_protocols(["http/1.1"])
        self._open_by_session: dict[str | None, set[_Connection]] = {}

    def open_connections(self, session_id: str | None) -> int:
        return len(self._open_by_session.get(session_id, ()))

    def recheck(self, session_id: str | None = None) -> int:
        """Close the open connections of ``session_id`` (every session: None) that its
        policy no longer allows, or whose peer now identifies another session (or none).
        Returns how many were closed."""
        closed = 0
        for key, connections in list(self._open_by_session.items()):
            if session_id is not None and key != session_id:
                continue
            policy = self.policies(key) if key is not None else None
            for conn in list(connections):
                moved = conn.whose is not None and conn.whose() != key
                if moved or (conn.target is not None and not decide(policy, *conn.target).allowed):
                    closed += _cancel(conn)
        return closed

    def close_session(self, session_id: str) -> int:
        """Close every open connection of ``session_id`` (it is gone); how many."""
        return sum(_cancel(c) for c in list(self._open_by_session.get(session_id, ())))

    async def serve_unix(self, path: str, session_id: str) -> asyncio.Server:
        async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self.handle(reader, writer, session_id)

        return await asyncio.start_unix_server(on_client, path, limit=self.config.header_limit)

    async def serve_tcp(self, host: str, port: int, identify: Identify) -> asyncio.Server:
        async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            peer = writer.get_extra_info("peername")
            await self.handle(reader, writer, identify(peer), lambda: identify(peer))

        return await asyncio.start_server(on_client, host, port, limit=self.config.header_limit)

    async def handle(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        session_id: str | None,
        whose: Callable[[], str | None] | None = None,
    ) -> None:
        """Serve one client connection of ``session_id``; ``whose``: asks again which
        session the peer is (``recheck`` closes the connection when the answer changes)."""
        open_now = self._open_by_session.setdefault(session_id, set())
        conn = _Connection(asyncio.current_task(), whose=whose)
        open_now.add(conn)
        cap = self.config.max_connections
        try:
            if len(open_now) > 2 * cap:
                return  # refusals in flight too: a flood is closed unanswered
            try:
                await self._handle(reader, writer, session_id, conn, len(open_now) > cap)
            except Refused as exc:
                log.info(
                    "egress refused",
                    extra={"session_id": session_id, "status": exc.status, "reason": exc.reason},
                )
                writer.write(refusal_response(exc.status, exc.reason))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError, ssl.SSLError):
            pass
        finally:
            open_now.discard(conn)
            if not open_now and self._open_by_session.get(session_id) is open_now:
                del self._open_by_session[session_id]
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _handle(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        session_id: str | None,
        conn: _Connection,
        over_cap: bool,
    ) -> None:
        method, target, version, headers = await self._read_head(reader)
        if over_cap:
            # After the head: a client shown an answer before it finished sending could
            # see a reset instead.
            raise Refused(
                429,
                f"this session has {self.config.max_connections} egress connections open, "
                f"its most ({self.config.connections_setting}); close some and retry",
            )
        policy = self.policies(session_id) if session_id is not None else None
        if method == "CONNECT":
            host, port = parse_authority(target, None)
            conn.target = ("https", host, port)
            await self._tunnel(reader, writer, policy, host, port, session_id or "")
        elif target.lower().startswith("http://"):
            await self._forward(reader, writer, policy, method, target, version, headers, conn)
        else:
            raise Refused(
                400, "send requests in absolute form (http://host/path) or tunnel with CONNECT"
            )

    async def _read_head(
        self, reader: asyncio.StreamReader
    ) -> tuple[str, str, str, list[tuple[bytes, bytes]]]:
        """(method, target, version, headers) of a request head that every upstream reads
        as we do; Refused(400/431) otherwise."""
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
        return method, target, version, parse_headers(header_lines)

    async def _send_body(
        self, reader: asyncio.StreamReader, up_writer: asyncio.StreamWriter, length: int
    ) -> bool:
        """Copy ``length`` body bytes; False when the client stopped early."""
        while length > 0:
            # Each part of the body within client_timeout: a client that stops
            # sending (slowloris) must not hold this task and the upstream forever.
            chunk = await asyncio.wait_for(
                reader.read(min(length, _CHUNK)), self.config.client_timeout
            )
            if not chunk:
                return False
            up_writer.write(chunk)
            async with asyncio.timeout(self.config.idle_timeout):  # an upstream not reading
                await up_writer.drain()
            length -= len(chunk)
        return True

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
        session_id: str,
    ) -> None:
        name, up_reader, up_writer = await self._open(policy, "https", host, port)
        bindings = policy.bindings_for(name) if policy is not None else ()
        if bindings:
            try:
                await self._intercept(
                    reader, writer, up_reader, up_writer, name, port, bindings, session_id
                )
            finally:
                up_writer.close()
            return
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
            # Nothing more is inspected: the kernel moves the rest (splice.py).
            await relay_streams(reader, writer, up_reader, up_writer, self.config.idle_timeout)
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

    async def _intercept(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
        name: str,
        port: int,
        bindings: Sequence[SecretBinding],
        session_id: str,
    ) -> None:
        if self.ca is None or self.secrets is None:
            raise Refused(503, f"{name} has a secret bound to it, but this proxy has no CA")
        try:
            await asyncio.wait_for(
                up_writer.start_tls(self._upstream_tls, server_hostname=name),
                self.config.connect_timeout,
            )
        except ssl.SSLCertVerificationError as exc:
            raise Refused(
                502, f"the certificate of {name} did not verify: {exc.verify_message}"
            ) from None
        except (OSError, TimeoutError) as exc:
            raise Refused(502, f"TLS with {name} failed ({type(exc).__name__})") from None
        # Stop reading before the client may answer the 200: start_tls, run as a task by
        # wait_for, begins a loop turn later, and a ClientHello read into the stream's
        # buffer meanwhile would never reach TLS (the handshake then hangs).
        writer.transport.pause_reading()
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        try:
            await asyncio.wait_for(
                writer.start_tls(self.ca.server_context(name)), self.config.client_timeout
            )
        except (OSError, TimeoutError) as exc:
            # Another SNI (the context's sni_callback), no TLS, or a client that does not
            # trust the CA: nothing was read, nothing reaches the upstream.
            log.info(
                "egress interception: client TLS with %s failed: %r",
                name,
                exc,
                extra={"host": name, "error": type(exc).__name__},
            )
            return
        method, target, version, headers = await self._read_head(reader)
        if not target.startswith("/") or method == "CONNECT":
            raise Refused(400, "inside a tunnel, send origin-form requests (GET /path)")
        length = body_length(headers)
        values = {}
        try:
            for binding_name in bound_in(headers, bindings):
                value = await self.secrets.value(session_id, binding_name)
                values[binding_name] = checked_value(binding_name, value)
        except SecretUnavailable as exc:
            raise Refused(502, str(exc)) from None
        headers = swap_headers(headers, bindings, values)
        authority = name if port == 443 else f"{name}:{port}"
        # identity: an echo of the value comes back as sent, where the scrubber finds it.
        up_writer.write(
            upstream_head(
                f"{method} {target} {version}",
                authority,
                headers,
                length,
                (b"Accept-Encoding: identity",),
            )
        )
        if await self._send_body(reader, up_writer, length or 0):
            scrub = Scrubber(list(values.values()))
            await _copy(up_reader, writer, self.config.idle_timeout, scrub)

    async def _forward(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        policy: EgressPolicy | None,
        method: str,
        target: str,
        version: str,
        headers: list[tuple[bytes, bytes]],
        conn: _Connection,
    ) -> None:
        url = urlsplit(target)
        if url.username or url.password:
            raise Refused(400, "credentials in the URL are not forwarded")
        host, port = parse_authority(url.netloc, DEFAULT_PORTS["http"])
        conn.target = ("http", host, port)
        length = body_length(headers)
        _, up_reader, up_writer = await self._open(policy, "http", host, port)
        try:
            path = (url.path or "/") + (f"?{url.query}" if url.query else "")
            up_writer.write(
                upstream_head(f"{method} {path} {version}", url.netloc, headers, length, ())
            )
            if not await self._send_body(reader, up_writer, length or 0):
                return
            # One request per connection: whatever else the client sends is not forwarded
            # (a second request on this connection could name another Host).
            await _copy(up_reader, writer, self.config.idle_timeout)
        finally:
            up_writer.close()


def body_length(headers: Sequence[tuple[bytes, bytes]]) -> int | None:
    """The request's one Content-Length (None: no body); Refused for anything else."""
    if any(name == b"transfer-encoding" for name, _ in headers):
        raise Refused(411, "chunked request bodies are not forwarded: send Content-Length")
    lengths = {value for name, value in headers if name == b"content-length"}
    if len(lengths) > 1 or not all(v.isdigit() for v in lengths):
        # Two lengths could make the upstream read a second, unchecked request.
        raise Refused(400, "one numeric Content-Length, please")
    return int(next(iter(lengths))) if lengths else None


def upstream_head(
    request_line: str,
    host: str,
    headers: Sequence[tuple[bytes, bytes]],
    length: int | None,
    extra: Sequence[bytes],
) -> bytes:
    """The head the upstream gets: our ``Host``, the client's end-to-end headers, one
    length, ``extra`` and ``Connection: close`` (one request per connection)."""
    dropped = _HOP_BY_HOP | _LENGTH | {h.split(b":")[0].lower() for h in extra}
    out = [request_line.encode(), b"Host: " + host.encode()]
    out += [k + b": " + v for k, v in headers if k not in dropped]
    if length is not None:
        out.append(b"Content-Length: %d" % length)
    out += [*extra, b"Connection: close"]
    return b"\r\n".join(out) + b"\r\n\r\n"


def _sni_or_none(hello: bytes) -> str | None:
    try:
        return client_hello_sni(hello)
    except NotClientHello:
        return None


def _cancel(conn: _Connection) -> int:
    if conn.task is None or conn.task.done():
        return 0
    conn.task.cancel()
    return 1


async def _copy(
    src: asyncio.StreamReader,
    dst: asyncio.StreamWriter,
    idle: float,
    scrub: Scrubber | None = None,
) -> None:
    """Relay an answer; TimeoutError when no byte comes, or none can go, for ``idle``."""
    loop = asyncio.get_running_loop()
    try:
        # One deadline moved on at each chunk (no task per read, as wait_for makes).
        async with asyncio.timeout(idle) as deadline:
            while data := await src.read(_CHUNK):
                dst.write(scrub.feed(data) if scrub else data)
                await dst.drain()
                deadline.reschedule(loop.time() + idle)
        if scrub:
            dst.write(scrub.flush())
    finally:
        if dst.can_write_eof():
            with contextlib.suppress(OSError):
                dst.write_eof()
