"""Dev mode's defences against the browser on the developer's own machine.

Contract: with ``auth_mode=dev`` (no credentials: anyone who reaches the port is a user)
``DevGuard`` is an outer middleware that

- answers 400 ``invalid_host`` to a request whose ``Host`` is not a loopback name
  (localhost, 127.0.0.1, ::1), the configured host or a name under the configured E2B
  domain (``e2b.hosts``, which has already refused the malformed ones): a page of
  evil.example whose name was re-bound to 127.0.0.1 (DNS rebinding) sends its own name,
  and is refused;
- answers 415 ``json_required`` to a body sent to a JSON route without a JSON content
  type: a cross-site form or a typeless ``fetch`` is a "simple" request a browser sends
  without asking (no preflight), and FastAPI would parse its body as JSON anyway.
  The upload routes (multipart, ``@streams_body``) are not JSON routes.

With ``auth_mode=required`` it is not installed: credentials a page cannot forge are
the defence there.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from sandbox_workspace.contract.errors import error_response

from .request_bounds import has_body, streaming_routes, streams

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_JSON_METHODS = frozenset({"POST", "PUT", "PATCH"})  # the methods routes take bodies with


def host_name(value: str) -> str:
    """The name of a Host header, without its port and IPv6 brackets."""
    if value.startswith("["):
        return value[1:].split("]", 1)[0]
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


class DevGuard:
    def __init__(
        self,
        app: ASGIApp,
        hosts: frozenset[str],
        json_routes: list[BaseRoute],
        suffix: str | None = None,
    ) -> None:
        self.app = app
        self.hosts = hosts
        self.suffix = suffix  # ".{E2B domain}": names the operator routes here
        self.json_routes = json_routes  # every route but the uploads

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        host = host_name(headers.get(b"host", b"").decode("latin-1")).lower()
        if host not in self.hosts and not (self.suffix and host.endswith(self.suffix)):
            response = error_response(
                400,
                "invalid_host",
                f"dev mode answers only requests for {', '.join(sorted(self.hosts))} "
                "(a Host check against DNS rebinding); use one of those names",
            )
            await response(scope, receive, send)
            return
        content_type = headers.get(b"content-type", b"").decode("latin-1")
        if (
            scope["type"] == "http"
            and scope["method"] in _JSON_METHODS
            and has_body(scope)
            and not is_json(content_type)
            # A route that takes this request (else the router's 404/405 answers it).
            and streams(scope, self.json_routes)
        ):
            response = error_response(
                415,
                "json_required",
                "send the body as JSON with Content-Type: application/json "
                "(dev mode refuses other types: cross-site requests)",
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def install(
    app: Any, configured_host: str, routers: Iterable[Any], domain: str | None = None
) -> None:
    hosts = LOOPBACK_NAMES | {configured_host.strip("[]").lower()}
    routers = list(routers)
    uploads = streaming_routes(routers)
    json_routes = [r for router in routers for r in router.routes if r not in uploads]
    suffix = f".{domain}" if domain else None
    app.add_middleware(DevGuard, hosts=frozenset(hosts), json_routes=json_routes, suffix=suffix)
