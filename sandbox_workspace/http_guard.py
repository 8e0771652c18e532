"""Bounds on what a client may hold before its request reaches the application.

Contract: ``HttpGuard(max_header_bytes, header_timeout_seconds, drain_seconds).protocol()`` is
uvicorn's httptools protocol with the limits the stock one lacks:

- the request line and headers together may hold at most ``max_header_bytes``; one byte
  more answers 431 and closes the connection (uvicorn keeps appending headers to a list
  for as long as a client sends them; h11's ``h11_max_incomplete_event_size`` exists,
  httptools has no such setting). Counted twice: as parsed (exact), and as the bytes
  arrive (``max_header_bytes`` + ``_RAW_SLACK``; at most twice that when requests are
  pipelined) — httptools hands a header over only once it is complete and holds it until
  then, re-copying it with each piece, so a header that never ends was held whole;
- the bytes of a body that bring no body byte (a chunked body's trailer fields, held as
  headers are; chunk framing) are bounded too (``_BODY_GAP_BYTES``): past it the
  connection ends (the request is under way: no 431), never held until the body timeout;
- a request's headers must be complete ``header_timeout_seconds`` after the connection
  opened or its previous response ended (slowloris: uvicorn starts no timer until a
  first response, so a connection trickling header bytes was held for ever); past it the
  connection is closed;
- an answer begun before its request's body has all come (a 413, a 401 on an upload)
  carries ``Connection: close`` and ends the connection: a client never sends another
  request on it (stock uvicorn kept it alive, and each byte of the body nobody reads
  cancels its keep-alive timer, which only a next answer arms again: one byte a minute
  held the connection for ever). The end is a lingering close: the answer, end of file,
  then what the client still sends is read and dropped, for at most ``drain_seconds`` and
  ``_DRAIN_BYTES``, before the socket closes (closed at once with bytes unread, the kernel
  resets the connection, and a reset can cost the client the answer itself). The header
  tells the client not to reuse the half-closed connection (without it, session 17's
  first lingering close had clients sending their next request into it).

Bodies' sizes and times are bounded by the application
(``sandbox_workspace.api.request_bounds``), which knows which routes stream.
"""

from __future__ import annotations

from dataclasses import dataclass

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

_431 = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"content-type: text/plain; charset=utf-8\r\ncontent-length: 34\r\n"
    b"connection: close\r\n\r\nrequest line and headers too large"
)
# What the raw count allows beyond the parsed one: the method, the version, separators and
# whitespace around values (a request within the parsed limit is refused for them only
# past this much).
_RAW_SLACK = 1024
# Bytes of a body that bring no body byte (trailers, chunk framing), at most.
_BODY_GAP_BYTES = 1024 * 1024
# What a lingering close reads and drops at most: enough for a client that writes its
# whole body before it reads (httpx does) to reach the end of a moderate one and read the
# answer; past it the connection is reset (a flood is not read for the whole drain time).
_DRAIN_BYTES = 16 * 1024 * 1024


class _CloseLingers:
    """The connection's transport as a request answered before its body ended sees it:
    its close (uvicorn's, at the answer's end) is the protocol's lingering close."""

    def __init__(self, protocol) -> None:
        self._protocol = protocol

    def __getattr__(self, name: str):
        return getattr(self._protocol.transport, name)

    def close(self) -> None:
        self._protocol.linger()


@dataclass(frozen=True)
class HttpGuard:
    max_header_bytes: int = 64 * 1024
    header_timeout_seconds: float = 10.0
    drain_seconds: float = 10.0  # the API's: its body timeout

    def protocol(self) -> type[HttpToolsProtocol]:
        guard = self

        class GuardedHttpToolsProtocol(HttpToolsProtocol):
            _header_bytes = 0
            _header_timer = None
            _refused = False  # answered 431: the rest of the data in hand is ignored
            # What comes next is headers; False: a request's headers are complete, its
            # body is not (being read).
            _in_headers = True
            _raw_bytes = 0  # bytes fed since the last progress: a message or its headers
            # ended, or a body byte came (module docstring)
            _lingering = False  # answered with its body unread: closing (module docstring)
            _drained = 0  # bytes dropped while lingering

            def data_received(self, data: bytes) -> None:
                # Data goes to the parser in pieces that stop at the bound on bytes that
                # brought no progress (``_raw_bytes``: headers, a trailer, chunk framing):
                # past it is 431 while the headers are open, else the end of the
                # connection. (A piece that ends one step and begins the next leaves the
                # next one's bytes in it uncounted: at most one bound more.)
                if self._refused:
                    return  # dropped: the connection is closing
                if self._lingering:
                    self._drained += len(data)
                    if self._drained > _DRAIN_BYTES:
                        self.transport.close()
                    return  # the rest of a body nobody reads: dropped, never parsed
                if len(data) > self._bound() - self._raw_bytes:
                    data = memoryview(data)  # sliced below: no copies (httptools takes it)
                while data:
                    room = self._bound() - self._raw_bytes
                    if room <= 0:
                        self._too_much()
                        return
                    piece, data = data[:room], data[room:]
                    self._raw_bytes += len(piece)
                    super().data_received(piece)  # type: ignore[arg-type]
                    if self._refused or self.transport.is_closing():
                        return
                    if self.transport.get_protocol() is not self:
                        return  # upgraded: what follows is not ours to parse

            def connection_made(self, transport) -> None:  # type: ignore[override]
                super().connection_made(transport)
                self._arm()

            def connection_lost(self, exc: Exception | None) -> None:
                self._disarm()
                super().connection_lost(exc)

            def on_message_begin(self) -> None:
                super().on_message_begin()
                self._header_bytes = 0
                # A keep-alive connection's next request: uvicorn's keep-alive timer bounded
                # the idle wait, ours bounds the headers from their first byte on.
                if self._header_timer is None and not self._refused:
                    self._arm()

            def on_url(self, url: bytes) -> None:
                if self._count(len(url)):
                    super().on_url(url)

            def on_header(self, name: bytes, value: bytes) -> None:
                if self._count(len(name) + len(value) + 4):
                    super().on_header(name, value)

            def on_headers_complete(self) -> None:
                self._disarm()
                self._in_headers = False
                self._raw_bytes = 0
                if not self._refused:
                    previous = self.cycle
                    super().on_headers_complete()
                    if self.cycle is not previous:  # else an upgrade: no cycle of ours
                        self._watch(self.cycle)

            def on_body(self, body: bytes) -> None:
                self._raw_bytes = 0
                if not self._refused:
                    super().on_body(body)

            def on_message_complete(self) -> None:
                self._in_headers = True  # the next message's, from the next byte on
                self._raw_bytes = 0
                if not self._refused:
                    super().on_message_complete()

            def on_response_complete(self) -> None:
                super().on_response_complete()
                if self._lingering:  # the drain's bound is ours, not the keep-alive's
                    self._unset_keepalive_if_required()

            def _watch(self, cycle) -> None:
                """Whether ``cycle``'s answer begins before its body has all come is
                known when it begins: its first ``send``, wrapped here (the app is
                handed ``cycle.send`` when its task first runs, after this)."""
                send = cycle.send

                async def watched_send(message) -> None:
                    if not cycle.response_started and not self._in_headers and self.cycle is cycle:
                        # The body is the answered request's own (a pipelined request
                        # parsed after it would be the current cycle): the connection
                        # can carry no other request.
                        cycle.keep_alive = False  # uvicorn writes Connection: close
                        cycle.transport = _CloseLingers(self)
                    await send(message)

                cycle.send = watched_send

            def linger(self) -> None:
                """The end of a connection whose last request's body is unread: end of
                file after what is written, then what comes is dropped (``data_received``)
                until the client closes, ``_DRAIN_BYTES`` came or ``drain_seconds``
                passed."""
                if self._lingering or self.transport.is_closing():
                    return
                self._lingering = True
                self._disarm()
                if not self.transport.can_write_eof():
                    self.transport.close()
                    return
                self.transport.write_eof()  # sent after the answer, which is buffered
                self.flow.resume_reading()  # paused while the unread body piled up
                # The client's end of file closes it at once (eof_received).
                self._header_timer = self.loop.call_later(guard.drain_seconds, self.transport.close)

            def _count(self, size: int) -> bool:
                """Whether the header bytes so far are within the limit."""
                self._header_bytes += size
                if self._refused or self._header_bytes <= guard.max_header_bytes:
                    return not self._refused
                self._refuse()
                return False

            def _bound(self) -> int:
                if self._in_headers:
                    return guard.max_header_bytes + _RAW_SLACK
                # Larger than a read (256 KiB): a body's data is never cut in pieces.
                return max(guard.max_header_bytes + _RAW_SLACK, _BODY_GAP_BYTES)

            def _too_much(self) -> None:
                if self._in_headers:
                    self._refuse()
                    return
                # Under way (its answer may be too): no answer of ours, the end.
                self._refused = True
                self.transport.close()

            def _refuse(self) -> None:
                self._refused = True
                self._disarm()
                self.transport.write(_431)
                self.transport.close()

            def _arm(self) -> None:
                self._disarm()
                self._header_timer = self.loop.call_later(
                    guard.header_timeout_seconds, self._headers_too_slow
                )

            def _disarm(self) -> None:
                if self._header_timer is not None:
                    self._header_timer.cancel()
                    self._header_timer = None

            def _headers_too_slow(self) -> None:
                self._header_timer = None
                if not self.transport.is_closing():
                    self.transport.close()

        return GuardedHttpToolsProtocol
