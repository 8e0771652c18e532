"""Error contract shared by the runtime and the API: ``{"error": {"code", "message"}}``.

``ApiError`` subclasses carry their HTTP status; handlers installed by
``install_error_handlers`` render them, FastAPI validation errors (as 422) and stray
HTTP exceptions in the same JSON shape, so no client ever has to parse two formats.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

log = logging.getLogger(__name__)

_STATUS_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "too_many_requests",
    502: "bad_gateway",
    503: "unavailable",
    504: "gateway_timeout",
}


class ApiError(Exception):
    """Base of every error that becomes an HTTP response."""

    status = 500
    code = "internal_error"
    # Seconds after which a retry may succeed: sent as ``Retry-After`` when set.
    retry_after: int | None = None
    # Whether waiting can cure it: a 429/503 that can gets the default ``Retry-After``.
    transient = True

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class BadRequest(ApiError):
    """The request is malformed; the message says what to change."""

    status, code = 400, "bad_request"


class Unauthorized(ApiError):
    """Missing or invalid credentials."""

    status, code = 401, "unauthorized"


class NotFoundError(ApiError):
    """The thing does not exist, or it is not the caller's."""

    status, code = 404, "not_found"


class Conflict(ApiError):
    """The request conflicts with current state (exists already, limit reached)."""

    status, code = 409, "conflict"


class ConversationDeleting(Conflict):
    """The conversation is being deleted: nothing may write or start in it until it is
    gone (then the same id starts afresh) — so the client is told when to retry. The one
    class for it: the runtime (its deletion gate) and the API (its backends) raise it."""

    code = "conversation_deleting"
    retry_after = 1

    def __init__(self, conversation_id: str) -> None:
        super().__init__(
            f"conversation '{conversation_id}' is being deleted; its files cannot be "
            "written now. Retry once the deletion completes (the same id then starts a "
            "fresh, empty conversation)."
        )


class TooLarge(ApiError):
    """The body or file is larger than allowed."""

    status, code = 413, "file_too_large"


class UnsupportedType(ApiError):
    """The file type or content type is not accepted."""

    status, code = 415, "unsupported_file_type"


class Unavailable(ApiError):
    """A dependency (session, runtime) is not ready; retrying later may work."""

    status, code = 503, "unavailable"


class NotConfigured(Unavailable):
    """This server is not configured for the request (no model, no object store): only
    its operator can change that, so no ``Retry-After`` — a client that honours it would
    poll forever."""

    code = "not_configured"
    transient = False


class BadGateway(ApiError):
    """A dependency answered something we cannot use."""

    status, code = 502, "bad_gateway"


class JSONLineResponse(JSONResponse):
    """JSON that ends with a newline, so answers do not run together in a terminal
    (``curl`` prints the body as is); parsers ignore the trailing whitespace."""

    def render(self, content: Any) -> bytes:
        return super().render(content) + b"\n"


def error_body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, **extra}}


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None):
    return JSONLineResponse(error_body(code, message), status_code=status, headers=headers)


def _describe_validation(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "request"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


def install_error_handlers(app: FastAPI, *, default_retry_after: int | None = None) -> None:
    """``default_retry_after``: the ``Retry-After`` of a 429/503 whose error names none
    (the API promises one on every such answer that waiting can cure — not on
    ``NotConfigured``); an error's own ``retry_after`` wins."""

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else {}
        retry_after = exc.retry_after
        if retry_after is None and exc.transient and exc.status in (429, 503):
            retry_after = default_retry_after
        if retry_after is not None:
            headers["Retry-After"] = str(retry_after)
        return error_response(exc.status, exc.code, exc.message, headers or None)

    @app.exception_handler(ClientDisconnect)
    async def _client_gone(request: Request, _: ClientDisconnect) -> JSONResponse:
        # The client hung up mid-body (the API aborts uploads it refuses): whatever was
        # being received has been discarded by the handler; nobody reads this answer.
        log.info("client disconnected mid-request", extra={"path": request.url.path})
        return error_response(400, "client_disconnected", "the client closed the request")

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(422, "invalid_request", _describe_validation(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _STATUS_CODES.get(exc.status_code, "error")
        return error_response(exc.status_code, code, str(exc.detail), exc.headers)
