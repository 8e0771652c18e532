"""Bounds on what a client may hold before its request reaches the application.

Contract: ``HttpGuard(max_header_bytes, header_timeout_seconds).protocol()`` is uvicorn's
httptools protocol with the limits the stock one lacks:

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


@dataclass(frozen=True)
class HttpGuard:
    max_header_bytes: int = 64 * 1024
    header_timeout_seconds: float = 10.0

    def protocol(self) -> type[HttpToolsProtocol]:
        guard = self

        class GuardedHttpToolsProtocol(HttpToolsProtocol):
            _header_bytes = 0
            _header_timer = None
            _refused = False  # answered 431: the rest of the data in hand is ignored
            _in_headers = True  # what comes next is headers: no body is being read
            _raw_bytes = 0  # bytes fed since the last progress: a message or its headers
            # ended, or a body byte came (module docstring)
            _body_open = False  # a request's headers are complete, its body is not

            def data_received(self, data: bytes) -> None:
                # Data goes to the parser in pieces that stop at the bound on bytes that
                # brought no progress (``_raw_bytes``: headers, a trailer, chunk framing):
                # past it is 431 while the headers are open, else the end of the
                # connection. (A piece that ends one step and begins the next leaves the
                # next one's bytes in it uncounted: at most one bound more.)
                if self._refused:
                    return  # dropped: the connection is closing
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
                self._body_open = True
                self._raw_bytes = 0
                if not self._refused:
                    super().on_headers_complete()

            def on_body(self, body: bytes) -> None:
                self._raw_bytes = 0
                if not self._refused:
                    super().on_body(body)

            def on_message_complete(self) -> None:
                self._body_open = False
                self._in_headers = True  # the next message's, from the next byte on
                self._raw_bytes = 0
                if not self._refused:
                    super().on_message_complete()

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
