"""Request bodies are bounded before anything reads them.

Contract: ``RequestBodyLimit`` is the outermost ASGI middleware of the API. On every
route but those marked ``@streams_body`` (uploads, which stream to the sandbox under
their own per-session limit):

- a ``Content-Length`` above ``max_body_bytes`` answers 413 ``body_too_large`` at once:
  no byte of the body is read, no authentication, no route runs;
- a body (with its length or chunked) is received here, up to the limit, before the
  route runs: one byte more answers 413 the same way, and nothing past the limit is ever
  held;
- a body that does not arrive in full within ``body_timeout_seconds`` answers 408 — a
  declared length too: the route would wait for the rest for ever, holding what came;
- a client gone before its body has all come is answered nothing and no route runs
  (never a route acting on the part that came as if it were the whole).

Without this, FastAPI reads and parses the whole JSON body before it resolves any
dependency, authentication included: an unauthenticated client could make the API hold
any number of bytes (docs/security.md, "Bounded memory").
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

from pydantic import BaseModel, Field
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandbox_workspace.contract.errors import error_response

_STREAMS = "__streams_body__"


class RequestBounds(BaseModel):
    """SANDBOX_WORKSPACE_BOUNDS__*: size and time bounds of what a client sends."""

    max_body_bytes: int = Field(
        8 * 1024 * 1024,
        ge=1024,
        description="Largest request body of any route but the uploads (which have their "
        "own per-session limit); a larger one answers 413 before it is read.",
    )
    body_timeout_seconds: float = Field(
        60.0,
        gt=0,
        description="A bounded body must arrive in full within this (else 408); the rest "
        "of a body answered before it ended is drained for at most this long.",
    )
    max_header_bytes: int = Field(
        64 * 1024, ge=4096, description="Request line and headers together (else 431)."
    )
    header_timeout_seconds: float = Field(
        10.0, gt=0, description="A request's headers must be complete within this."
    )


def streams_body(endpoint: Callable) -> Callable:
    """Mark a route whose body streams (an upload): not bounded by ``max_body_bytes``."""
    setattr(endpoint, _STREAMS, True)
    return endpoint


class BodyTooLarge(Exception):
    pass


class RequestBodyLimit:
    def __init__(self, app: ASGIApp, bounds: RequestBounds, streaming: list[BaseRoute]) -> None:
        self.app = app
        self.limit = bounds.max_body_bytes
        self.timeout = bounds.body_timeout_seconds
        self.streaming = streaming  # the routes marked @streams_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared, chunked = _framing(scope)
        # No body at all (most GETs), or one the route streams: nothing to bound here.
        if (declared is None and not chunked) or self._streams(scope):
            await self.app(scope, receive, send)
            return
        if declared is not None and declared > self.limit:
            await self._refuse(scope, receive, send)
            return
        try:
            async with asyncio.timeout(self.timeout):
                body = await self._receive_bounded(receive)
        except BodyTooLarge:
            await self._refuse(scope, receive, send)
            return
        except TimeoutError:
            response = error_response(
                408,
                "body_timeout",
                f"the request body did not arrive within {self.timeout:g} s",
                {"Connection": "close"},
            )
            await response(scope, receive, send)
            return
        if body is None:
            return  # the client went away: nobody to answer, nothing whole to act on
        await self.app(scope, _replay(body, receive), send)

    def _streams(self, scope: Scope) -> bool:
        return streams(scope, self.streaming)

    async def _receive_bounded(self, receive: Receive) -> bytes | None:
        """The whole body; None when the client went away before it ended."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                raise BodyTooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(
            413,
            "body_too_large",
            f"the request body is larger than the limit of {self.limit} bytes "
            "(SANDBOX_WORKSPACE_BOUNDS__MAX_BODY_BYTES); send less, or upload files "
            "through the upload routes",
            # The body is left unread: the connection cannot carry another request.
            {"Connection": "close"},
        )
        await response(scope, receive, send)


def _framing(scope: Scope) -> tuple[int | None, bool]:
    """The declared Content-Length (None: none), and whether the body is chunked."""
    declared, chunked = None, False
    for name, value in scope["headers"]:
        if name == b"content-length" and value.isdigit():
            declared = int(value)
        elif name == b"transfer-encoding":
            chunked = True
    return declared, chunked


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # after the body: the disconnect, as from the server

    return replayed


def install(app: Any, bounds: RequestBounds, routers: Iterable[Any]) -> None:
    """Add the limit to ``app`` (a FastAPI app) for the routes of ``routers`` (the ones
    marked ``@streams_body`` exempt); call it before CORS, which must stay outside so a
    413 carries the CORS headers too."""
    app.add_middleware(RequestBodyLimit, bounds=bounds, streaming=streaming_routes(routers))


def streaming_routes(routers: Iterable[Any]) -> list[BaseRoute]:
    """The routes of ``routers`` marked ``@streams_body``."""
    return [
        route
        for router in routers
        for route in router.routes
        if getattr(getattr(route, "endpoint", None), _STREAMS, False)
    ]


def has_body(scope: Scope) -> bool:
    declared, chunked = _framing(scope)
    return chunked or bool(declared)


def streams(scope: Scope, streaming: list[BaseRoute]) -> bool:
    return any(route.matches(scope)[0] is Match.FULL for route in streaming)
