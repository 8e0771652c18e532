"""E2B's host routing for production: the SDK's URLs on a wildcard domain (issue 39).

Without ``E2B_API_URL``/``E2B_SANDBOX_URL`` (marked for removal in the SDK's next
major) the SDK builds its URLs from ``E2B_DOMAIN``: the API at ``https://api.{domain}``
and each sandbox at ``https://{port}-{sandboxID}.{domain}`` (envd 49983, the code
interpreter 49999). With ``SANDBOX_WORKSPACE_E2B_DOMAIN`` set, a wildcard DNS name and
certificate send both to the API pod (the chart's Ingress), and ``HostRouting`` — the
outermost ASGI middleware — turns the Host header into the routes the header routing
already serves:

- ``api.{domain}/…`` → ``/e2b/…`` (E2B's control plane, keys included);
- ``{port}-{sandboxID}.{domain}/…`` → ``/e2b/envd/…`` with ``E2b-Sandbox-Id`` and
  ``E2b-Sandbox-Port`` set from the name (the SDK also sends ``E2b-Sandbox-Id``: one
  naming another sandbox is refused, never silently overridden);
- any other Host (the Service's name, a loopback name, ``{domain}`` itself) is left as
  it is, so the API's own routes and the header routing keep working.

A name under the domain that is neither answers an E2B error ``{"code", "message"}``:
400 for a malformed or overlong name, 501 for a port other than envd's and the code
interpreter's (exposing arbitrary ports is not supported), 404 for a sandbox id not of
our form. Who may open a sandbox is still decided by its access token
(``ids.AccessTokens``), so a Host naming another tenant's sandbox is 401 there.
``route`` is the pure decision; the middleware only applies it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from sandbox_workspace.contract.errors import ApiError

from .domain import check_domain
from .ids import check_sandbox_id

ENVD_PORT = 49983
CODE_INTERPRETER_PORT = 49999
PORTS = (ENVD_PORT, CODE_INTERPRETER_PORT)
MAX_HOST = 253  # a DNS name's length; a longer Host is refused before it is parsed
MAX_LABEL = 63
_LABEL = re.compile(r"(\d{1,5})-([0-9a-z][0-9a-z-]*)")


class HostError(ApiError):
    status = 400
    code = "invalid_host"


class PortNotSupported(ApiError):
    status = 501
    code = "not_supported"


@dataclass(frozen=True)
class Route:
    """Where a request goes: the path prefix to add and the E2B headers to set."""

    prefix: str
    sandbox_id: str | None = None
    port: int | None = None


def host_name(host: str) -> str:
    """The Host header's name: lowercased, without a port (``name:443``) or final dot."""
    if len(host) > MAX_HOST + 6:  # the name and ``:65535``
        raise HostError(f"the Host header is over {MAX_HOST} characters")
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return name.lower().rstrip(".")


def route(host: str, domain: str) -> Route | None:
    """The route of a request for ``host``; None when the Host is not under ``domain``."""
    name = host_name(host)
    if name == f"api.{domain}":
        return Route("/e2b")
    if not name.endswith("." + domain):
        return None
    label = name[: -len(domain) - 1]
    if "." in label or len(label) > MAX_LABEL:
        raise HostError(
            f"'{name}' is not a sandbox's name: use {{port}}-{{sandboxID}}.{domain} "
            f"(one DNS label of at most {MAX_LABEL} characters)"
        )
    match = _LABEL.fullmatch(label)
    if match is None:
        raise HostError(f"'{name}' is not a sandbox's name: use {{port}}-{{sandboxID}}.{domain}")
    port = int(match[1])
    if port not in PORTS:
        raise PortNotSupported(
            f"port {port} is not served: a sandbox answers on envd's port {ENVD_PORT} and "
            f"the code interpreter's {CODE_INTERPRETER_PORT} only (exposing other ports "
            "is not supported)"
        )
    return Route("/e2b/envd", check_sandbox_id(match[2]), port)


class HostRouting:
    """Applies ``route`` to every HTTP request (see the module docstring)."""

    def __init__(self, app: ASGIApp, domain: str) -> None:
        self.app = app
        self.domain = check_domain(domain)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        hosts = [v.decode("latin-1") for k, v in scope["headers"] if k == b"host"]
        try:
            if len(hosts) > 1:  # which one routes would be a guess (RFC 9112: 400)
                raise HostError("send one Host header")
            target = route(hosts[0] if hosts else "", self.domain)
            if target is not None:
                scope = rewrite(scope, target)
        except ApiError as e:
            answer = JSONResponse({"code": e.status, "message": e.message}, e.status)
            await answer(scope, receive, send)
            return
        await self.app(scope, receive, send)


def rewrite(scope: Scope, target: Route) -> Scope:
    """A copy of ``scope`` aimed at ``target``'s routes, its E2B headers set from it."""
    headers = list(scope["headers"])
    if target.sandbox_id is not None:
        sent = [v for k, v in headers if k == b"e2b-sandbox-id"]
        if any(check_sandbox_id(v.decode("latin-1")) != target.sandbox_id for v in sent):
            raise HostError(
                "the E2b-Sandbox-Id header names another sandbox than the Host "
                f"'{target.port}-{target.sandbox_id}…': send one sandbox's requests to its name"
            )
        headers = [(k, v) for k, v in headers if k not in (b"e2b-sandbox-id", b"e2b-sandbox-port")]
        headers += [
            (b"e2b-sandbox-id", target.sandbox_id.encode()),
            (b"e2b-sandbox-port", str(target.port).encode()),
        ]
    path = target.prefix + scope["path"]
    raw = target.prefix.encode() + scope.get("raw_path", scope["path"].encode())
    return {**scope, "path": path, "raw_path": raw, "headers": headers}
