"""A thin async Kubernetes REST client (httpx) and the credentials it and kopf share.

Neutral ground: the operator and the API's kubernetes backend both use it, so it lives
beside neither (DESIGN: the API never reaches into the operator's client internals).

Contract: ``load_credentials`` finds the cluster the way kubectl does (explicit
kubeconfig, ``$KUBECONFIG``, ``~/.kube/config``, then the pod's service account);
``Credentials.connection_info()`` gives kopf the same cluster, so the operator has one
notion of "the cluster". ``Kube`` speaks JSON with the verbs the handlers need; every
non-2xx answer raises a ``KubeError`` subclass saying what happened (404 ``KubeNotFound``,
409 ``KubeConflict``), so callers can treat "already exists" and "already gone" as success.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from httpx_aiohttp import AiohttpTransport

from sandbox_workspace import tracing
from sandbox_workspace.contract.crd import GROUP, VERSION

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
MERGE_PATCH = "application/merge-patch+json"


class KubeError(Exception):
    """An error answered by the Kubernetes API."""

    def __init__(self, status: int, message: str, reason: str = "") -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status, self.reason = status, reason


class KubeNotFound(KubeError):
    """The object does not exist (404)."""


class KubeConflict(KubeError):
    """The object exists already, or changed under us (409)."""


class Unreachable(KubeError):
    """The API server could not be reached."""


class CredentialsError(Exception):
    """No usable cluster credentials were found."""


@dataclass(frozen=True)
class Credentials:
    server: str
    token: str | None = None
    token_file: Path | None = None  # re-read: projected tokens rotate
    ca_file: str | None = None
    ca_data: str | None = None  # PEM
    cert_file: str | None = None
    key_file: str | None = None
    insecure: bool = False
    namespace: str | None = None

    def bearer(self) -> str | None:
        if self.token_file is not None:
            return self.token_file.read_text().strip()
        return self.token

    def ssl_context(self) -> ssl.SSLContext | bool:
        if self.insecure:
            return False
        ctx = ssl.create_default_context(cafile=self.ca_file, cadata=self.ca_data)
        if self.cert_file:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx

    def connection_info(self) -> Any:
        import kopf

        return kopf.ConnectionInfo(
            server=self.server,
            ca_path=self.ca_file,
            ca_data=self.ca_data,
            insecure=self.insecure or None,
            scheme="Bearer" if self.bearer() else None,
            token=self.bearer(),
            certificate_path=self.cert_file,
            private_key_path=self.key_file,
            default_namespace=self.namespace,
        )


def _data_file(data: str, suffix: str) -> str:
    """kubeconfig ``*-data`` (base64) as a private temporary file (ssl wants paths)."""
    fd, path = tempfile.mkstemp(prefix="sandbox-operator-", suffix=suffix)
    with os.fdopen(fd, "wb") as fh:
        fh.write(base64.b64decode(data))
    return path


def _from_kubeconfig(path: Path) -> Credentials:
    config = yaml.safe_load(path.read_text()) or {}
    current = config.get("current-context")
    by_name = {
        kind: {item["name"]: item.get(kind[:-1]) or {} for item in config.get(kind) or []}
        for kind in ("contexts", "clusters", "users")
    }
    if current not in by_name["contexts"]:
        raise CredentialsError(f"{path}: current-context {current!r} is not defined")
    context = by_name["contexts"][current]
    cluster = by_name["clusters"].get(context.get("cluster"), {})
    user = by_name["users"].get(context.get("user"), {})
    base = path.parent

    def rel(value: str | None) -> str | None:
        return str(base / value) if value else None

    ca_data = cluster.get("certificate-authority-data")
    cert_data, key_data = user.get("client-certificate-data"), user.get("client-key-data")
    return Credentials(
        server=cluster["server"],
        token=user.get("token"),
        token_file=Path(rel(user["tokenFile"])) if user.get("tokenFile") else None,  # type: ignore[arg-type]
        ca_file=rel(cluster.get("certificate-authority")),
        ca_data=base64.b64decode(ca_data).decode() if ca_data else None,
        cert_file=_data_file(cert_data, ".crt")
        if cert_data
        else rel(user.get("client-certificate")),
        key_file=_data_file(key_data, ".key") if key_data else rel(user.get("client-key")),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        namespace=context.get("namespace"),
    )


def load_credentials(kubeconfig: Path | None = None) -> Credentials:
    """Credentials of the cluster to manage, found as kubectl finds them."""
    if kubeconfig is not None and not kubeconfig.expanduser().exists():
        raise CredentialsError(f"kubeconfig {kubeconfig} does not exist")
    candidates = [kubeconfig] if kubeconfig else []
    if not candidates and os.environ.get("KUBECONFIG"):
        candidates = [Path(p) for p in os.environ["KUBECONFIG"].split(os.pathsep) if p]
    if not candidates and (SA_DIR / "token").exists():
        host = os.environ.get("KUBERNETES_SERVICE_HOST", "kubernetes.default.svc")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        ns = SA_DIR / "namespace"
        return Credentials(
            server=f"https://{host}:{port}",
            token_file=SA_DIR / "token",
            ca_file=str(SA_DIR / "ca.crt"),
            namespace=ns.read_text().strip() if ns.exists() else None,
        )
    if not candidates:
        candidates = [Path.home() / ".kube" / "config"]
    for path in candidates:
        if path.expanduser().exists():
            return _from_kubeconfig(path.expanduser())
    raise CredentialsError(
        "no cluster credentials: set SANDBOX_OPERATOR_KUBECONFIG or KUBECONFIG, or run in a pod"
    )


def _error(response: httpx.Response) -> KubeError:
    try:
        body = response.json()
        message, reason = body.get("message", ""), body.get("reason", "")
    except ValueError:
        message, reason = response.text[:500], ""
    cls = {404: KubeNotFound, 409: KubeConflict}.get(response.status_code, KubeError)
    return cls(response.status_code, message, reason)


class Kube:
    """JSON verbs on API paths (``/api/v1/namespaces/x/pods/y``)."""

    def __init__(
        self, credentials: Credentials, timeout: float = 30.0, concurrency: int | None = None
    ) -> None:
        self.credentials = credentials
        # ``concurrency``: at most this many requests in flight; the rest wait here, not in
        # the connection pool's queue (httpcore's cost O(queued × connections) per request:
        # half the operator's CPU in a burst of 300 new sessions).
        self._slots = asyncio.Semaphore(concurrency) if concurrency else contextlib.nullcontext()
        connections = concurrency or 100
        limits = httpx.Limits(
            max_connections=connections,
            max_keepalive_connections=connections,
            keepalive_expiry=120,
        )
        self.http = httpx.AsyncClient(
            base_url=credentials.server,
            timeout=timeout,
            trust_env=False,
            headers={"Accept": "application/json"},
            # httpx over aiohttp's pool and C parser (httpx-aiohttp, as the API's runtime
            # calls): httpcore's pool asks every connection whether the server closed it
            # (through anyio's TLS stream attributes) on each request's start and end —
            # 26% of the operator's CPU while stopping 1,000 idle sessions with 32
            # connections (py-spy, bench operator --sessions 1000, 2026-11-27). Many
            # concurrent handlers talk to one apiserver: keep their connections open
            # rather than paying a TLS handshake per request.
            transport=tracing.transport(  # a span per apiserver call when tracing is on
                AiohttpTransport(verify=credentials.ssl_context(), trust_env=False, limits=limits)
            ),
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        params: dict[str, str] | None = None,
    ) -> Any:
        headers = {"Content-Type": content_type} if body is not None else {}
        token = self.credentials.bearer()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        try:
            async with self._slots:
                response = await self.http.request(
                    method, path, json=body, headers=headers, params=params
                )
        except httpx.TransportError as e:
            raise Unreachable(0, f"{method} {path}: {e!r}", "Unreachable") from e
        if response.status_code >= 400:
            raise _error(response)
        return response.json() if response.content else None

    async def get(self, path: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        try:
            return await self.request("GET", path)
        except KubeNotFound:
            return None

    async def list(self, path: str, label_selector: str | None = None) -> list[dict[str, Any]]:
        params = {"labelSelector": label_selector} if label_selector else None
        return (await self.request("GET", path, params=params)).get("items", [])

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """Create; None when it exists already (create-if-absent, 409 tolerated)."""
        try:
            return await self.request("POST", path, body)
        except KubeConflict:
            return None

    async def patch(self, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """Merge-patch; None when the object is gone."""
        try:
            return await self.request("PATCH", path, body, MERGE_PATCH)
        except KubeNotFound:
            return None

    async def delete(self, path: str, uid: str | None = None) -> bool:
        """Delete (only that incarnation when ``uid`` is given); False when already gone."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            await self.request("DELETE", path, body)
        except KubeNotFound:
            return False
        except KubeConflict:  # the uid precondition failed: that incarnation is gone
            return False
        return True


def core_path(namespace: str, plural: str, name: str | None = None) -> str:
    base = f"/api/v1/namespaces/{namespace}/{plural}"
    return f"{base}/{name}" if name else base


def custom_path(namespace: str, plural: str, name: str | None = None) -> str:
    """A path of the custom resources (group and version: the contract's)."""
    base = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{plural}"
    return f"{base}/{name}" if name else base
