"""CORS for browser frontends calling the API directly (``SANDBOX_WORKSPACE_CORS_ALLOW_ORIGINS``).

Contract: ``install(app, origins)`` adds Starlette's CORS middleware outermost, so
preflights are answered before routing and every answer, errors included, carries the
CORS headers (else a browser shows a CORS failure instead of the 4xx). Allowed: every
method the API has (``PATCH`` included), the request headers of ``openapi``'s list;
readable: its exposed headers. A refused preflight answers the API's JSON error model,
400 ``cors_refused``, naming what was refused — never Starlette's plain text.
"""

from __future__ import annotations

from fastapi import FastAPI
from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response

from sandbox_workspace.contract.errors import error_response

from .openapi import CORS_EXPOSED_HEADERS, CORS_REQUEST_HEADERS

METHODS = ["GET", "POST", "PATCH", "DELETE"]
_REFUSED = "Disallowed CORS "


class _JsonErrorCORS(CORSMiddleware):
    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        text = bytes(response.body).decode()
        if response.status_code != 400 or not text.startswith(_REFUSED):
            return response
        refused = text.removeprefix(_REFUSED)  # e.g. "origin, headers"
        headers = {k: v for k, v in response.headers.items() if k.startswith("access-control")}
        return error_response(
            400,
            "cors_refused",
            f"CORS preflight refused: its {refused} not allowed (origins: the server's "
            f"SANDBOX_WORKSPACE_CORS_ALLOW_ORIGINS; methods: {', '.join(METHODS)}; "
            f"headers: {', '.join(CORS_REQUEST_HEADERS)})",
            headers=headers,
        )


def install(app: FastAPI, origins: list[str]) -> None:
    app.add_middleware(
        _JsonErrorCORS,
        allow_origins=origins,
        allow_methods=METHODS,
        allow_headers=CORS_REQUEST_HEADERS,
        expose_headers=CORS_EXPOSED_HEADERS,
        max_age=600,
    )
