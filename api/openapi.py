"""What the OpenAPI document says beyond the routes, and the HTTP behaviour it promises.

Contract:
- Every error is ``{"error": {"code", "message"}}`` (``ErrorBody``); ``errors(*statuses)``
  gives a route's ``responses=`` entry documenting each status it can answer with that
  model (``COMMON_ERRORS``, 400, 401 and 422, are added to every /api router), with
  ``Retry-After`` on 429 and 503.
- Operation ids are the handlers' names (``create_session``, ``list_files``…): unique,
  stable, and what a generated client calls its methods.
- ``install`` makes the server keep those promises: 405 answers carry an ``Allow`` header
  listing every method of the resource the path names (all routes of its template, not
  only the first route's), ``OPTIONS`` without a
  CORS preflight answers 204 with that ``Allow``, and 429/503 carry ``Retry-After``.
"""

from __future__ import annotations

from collections.abc import Iterator

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.routing import BaseRoute, Match

from sandbox_workspace.contract.errors import _STATUS_CODES, error_response

from .openapi_deployment import document_deployment
from .openapi_security import document_security

# Seconds a client should wait before retrying: a session that is starting is usually
# running within a few seconds; a busy runtime frees an execution slot about as fast.
RETRY_AFTER_SECONDS = 2


DESCRIPTION = """\
Sessions, conversation files, code execution and agent runs of Sandbox Workspace.

* Every error answers `{"error": {"code", "message"}}` with the right status; 429 and 503
  carry `Retry-After`, except a 503 `…_not_configured` (this server lacks a model, the
  object store or a table source), which no retry cures.
* All fields are snake_case, in requests and answers.
* The caller is `X-User-Id` (dev mode) or `Authorization: Bearer` (service token +
  `X-User-Id`, or a JWT). A user's one session is `sb-session-{user_id}`.
* Where a conversation is named by a header, the seed's `conversation_id` header, the
  `X-Conversation-Id` header and the `conversation_id` query parameter are equivalent.
  Query parameters are the portable choice: proxies drop headers with underscores unless
  told otherwise (nginx: `underscores_in_headers on;`).
* Streams (`text/event-stream`): each event has an `id:` and a JSON `data:`; re-attach with
  `Last-Event-ID` or `?after=`. Browsers' `EventSource` authenticates with
  `?token=` from `POST /api/v1/runs/{run_id}/stream-token`.
"""

TAGS = [
    {"name": "sessions", "description": "The caller's sandbox session (one per user)."},
    {"name": "files", "description": "Uploads in a conversation's temparea; downloads."},
    {"name": "conversations", "description": "Conversation state, runs and deletion."},
    {"name": "execute", "description": "Run Python or bash in a conversation's directory."},
    {"name": "chat", "description": "Agent runs, their event streams and approvals."},
    {"name": "health", "description": "Liveness and readiness."},
    {
        "name": "workspace",
        "description": "Seed 003's workspace: files with metadata, by file_id.",
    },
]

# Headers a browser may send cross-origin (beyond the CORS-safelisted ones), and headers
# it may read from answers.
CORS_REQUEST_HEADERS = [
    "Authorization",
    "Content-Type",
    "X-User-Id",
    "X-Conversation-Id",
    "X-Subdir",
    "conversation_id",
    "subdir",
    "Last-Event-ID",
    "X-Tenant-Id",  # a tenant's caller (docs/api.md, Sessions)
    "traceparent",  # W3C trace context: a browser's span continues in the API's
]
CORS_EXPOSED_HEADERS = [
    "Content-Disposition",
    "Retry-After",
    "X-Content-Sha256",
    "X-File-Version",  # seed 003's download by file_id
    "X-Run-Id",
    "X-Sandbox-Path",
]


class ErrorDetail(BaseModel):
    code: str = Field(description="Stable machine-readable code, e.g. `invalid_file_name`.")
    message: str = Field(description="What went wrong and what to change, for humans.")


class ErrorBody(BaseModel):
    """Every error answer of the API."""

    error: ErrorDetail


_DESCRIPTIONS = {
    400: "The request is malformed; `error.message` says what to change.",
    401: "Missing or invalid credentials.",
    403: "Well-formed, but asks for what is not the caller's (another user or session).",
    404: "No such resource, or it is not the caller's.",
    409: "Conflicts with the current state (exists, already decided, being deleted).",
    413: "The file is larger than the session's limit.",
    415: "The file type is not accepted by the session's upload config.",
    422: "The body or a parameter does not match the schema.",
    429: "Too many concurrent requests of this kind; retry after `Retry-After` seconds.",
    502: "The sandbox runtime answered something unusable.",
    503: "A dependency is not ready (session starting): retry after `Retry-After` seconds; "
    "or this server is not configured for the request (`llm_not_configured`, "
    "`store_not_configured`, `table_source_not_configured`): no `Retry-After`, as no retry "
    "cures it.",
    504: "The sandbox runtime did not answer in time.",
}
RETRY_HEADER = {
    "Retry-After": {
        "description": "Seconds to wait before retrying.",
        "schema": {"type": "integer", "minimum": 0},
    }
}


def errors(*statuses: int) -> dict[int | str, dict]:
    """``responses=`` entries for the error statuses a route can answer."""
    out: dict[int | str, dict] = {}
    for status in sorted(statuses):
        entry: dict = {"model": ErrorBody, "description": _DESCRIPTIONS[status]}
        if status in (429, 503):
            entry["headers"] = RETRY_HEADER
        out[status] = entry
    return out


def rules_400(rules: str, *statuses: int) -> dict[int | str, dict]:
    """``errors(400, *statuses)`` with the 400 naming the request rules JSON Schema
    cannot state (``rules``: each rule with its error code), so a client knows which
    schema-valid requests are still refused."""
    out = errors(400, *statuses)
    out[400] = {**out[400], "description": f"{_DESCRIPTIONS[400]} {rules}"}
    return out


# What starting a chat run can answer, on every chat route: the conversation being
# deleted (409), a selected file that is not an upload of it (404), no model configured
# or the session starting (503).
RUN_START_ERRORS = (404, 409, 503)


CHAT_EVENTS = [
    "run_started",
    "status",
    "text",
    "tool_start",
    "tool_approval",
    "tool_end",
    "result",
    "error",
    "done",
]
EXECUTE_EVENTS = ["stdout", "stderr", "result", "error", "done"]


def sse(kinds: list[str], description: str) -> dict[int | str, dict]:
    """A 200 answer that is a Server-Sent Events stream of these event kinds; each event's
    ``data`` is one line of JSON (keep-alive comments carry no event)."""
    event = {
        "type": "object",
        "required": ["event", "data"],
        "properties": {
            "id": {"type": "string", "pattern": "^[0-9]+$"},
            "event": {"type": "string", "enum": kinds},
            "data": {"type": "string", "contentMediaType": "application/json"},
        },
    }
    return {200: {"description": description, "content": {"text/event-stream": {"schema": event}}}}


# What any route that talks to a session can answer besides its own errors: the session
# may be starting (503), its runtime may be busy (429), slow (504) or broken (502).
SESSION_ERRORS = (400, 404, 429, 502, 503, 504)


COMMON_ERRORS = (400, 401, 422)  # 400 also for a body that is not JSON at all


def operation_id(route: APIRoute) -> str:
    return route.name


def _leaf_routes(routes: list) -> Iterator[BaseRoute]:
    # FastAPI >= 0.16x keeps included routers as wrappers (``original_router``).
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            yield from _leaf_routes(inner.routes)
        else:
            yield route


def _allowed(request: Request) -> list[str]:
    """The methods of the resource the path names: the path template of the first route
    that matches it (routing order), as the OpenAPI document lists them."""
    matching = [
        route
        for route in _leaf_routes(request.app.router.routes)
        if getattr(route, "methods", None) and route.matches(request.scope)[0] != Match.NONE
    ]
    if not matching:
        return []
    template = matching[0].path
    methods = {m for route in matching if route.path == template for m in route.methods}
    methods.add("OPTIONS")
    order = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
    return sorted(methods, key=lambda m: order.index(m) if m in order else len(order))


def install(
    app: FastAPI,
    upload_ceiling: int,
    tool_policies: dict[str, list[str]],
    allowed_types: list[str] | None = None,
    auth_mode: str = "dev",
) -> None:
    """Error handlers that keep the document's promises (after ``install_error_handlers``),
    and the document itself with what only this deployment knows (its upload ceiling,
    how its callers authenticate)."""

    def document() -> dict:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
                tags=app.openapi_tags,
            )
            document_deployment(schema, upload_ceiling, tool_policies, allowed_types)
            document_security(schema, auth_mode)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = document  # type: ignore[method-assign]

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code != 405:
            code = _STATUS_CODES.get(exc.status_code, "error")
            return error_response(exc.status_code, code, str(exc.detail), exc.headers)
        allow = ", ".join(_allowed(request))
        if request.method == "OPTIONS":  # not a CORS preflight (the middleware answers those)
            return Response(status_code=204, headers={"Allow": allow})
        return error_response(
            405,
            "method_not_allowed",
            f"{request.method} is not supported here; allowed: {allow}",
            {"Allow": allow},
        )
