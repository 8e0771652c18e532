"""Bounds on what a client may hold before its request reaches the application.

Contract: ``HttpGuard(max_header_bytes, header_timeout_seconds).protocol()`` is uvicorn's
httptools protocol with two limits the stock one lacks:

- the request line and headers together may hold at most ``max_header_bytes``; one byte
  more answers 431 and closes the connection (uvicorn keeps appending headers to a list
  for as long as a client sends them; h11's ``h11_max_incomplete_event_size`` exists,
  httptools has no such setting);
- a request's headers must be complete ``header_timeout_seconds`` after the connection
  opened or its previous response ended (slowloris: uvicorn starts no timer until a
  first response, so a connection trickling header bytes was held for ever); past it the
  connection is closed.

Bodies are bounded by the application (``sandbox_workspace.api.request_bounds``), which
knows which routes stream.
"""

from __future__ import annotations

from dataclasses import dataclass

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

_431 = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"content-type: text/plain; charset=utf-8\r\ncontent-length: 34\r\n"
    b"connection: close\r\n\r\nrequest line and headers too large"
)


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
                if not self._refused:
                    super().on_headers_complete()

            def on_body(self, body: bytes) -> None:
                if not self._refused:
                    super().on_body(body)

            def on_message_complete(self) -> None:
                if not self._refused:
                    super().on_message_complete()

            def _count(self, size: int) -> bool:
                """Whether the header bytes so far are within the limit."""
                self._header_bytes += size
                if self._refused or self._header_bytes <= guard.max_header_bytes:
                    return not self._refused
                self._refused = True
                self._disarm()
                self.transport.write(_431)
                self.transport.close()
                return False

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
