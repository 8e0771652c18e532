"""A thin synchronous Kubernetes REST client on httpx (test helper).

It speaks JSON to the API server with a bearer token and the cluster CA. Paths are the
API's own (``/api/v1/namespaces/x/pods``); helpers cover the verbs tests need.
"""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import httpx

T = TypeVar("T")

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"


class ApiError(Exception):
    """A non-2xx answer from the API server."""

    def __init__(self, method: str, path: str, status: int, body: Any):
        self.method, self.path, self.status, self.body = method, path, status, body
        reason = body.get("message") if isinstance(body, dict) else body
        super().__init__(f"{method} {path} -> {status}: {reason}")

    @property
    def reason(self) -> str | None:
        return self.body.get("reason") if isinstance(self.body, dict) else None


def ssl_context(ca_file: str) -> ssl.SSLContext:
    """TLS context trusting only the test cluster's CA."""
    return ssl.create_default_context(cafile=ca_file)


def wait_until(
    predicate: Callable[[], T],
    timeout: float = 30.0,
    interval: float = 0.1,
    message: str = "condition",
) -> T:
    """Poll ``predicate`` until it returns something truthy; return it.

    Exceptions from the predicate count as "not yet"; the last one is reported when the
    deadline passes.
    """
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    last_value: Any = None
    while True:
        try:
            last_value = predicate()
            if last_value:
                return last_value
            last_exc = None
        except Exception as exc:
            last_exc = exc
        if time.monotonic() >= deadline:
            detail = f"last error: {last_exc!r}" if last_exc else f"last value: {last_value!r}"
            raise TimeoutError(f"timed out after {timeout}s waiting for {message}; {detail}")
        time.sleep(interval)


class KubeClient:
    """Minimal REST client. ``server`` must be a loopback https URL."""

    def __init__(self, server: str, token: str, ca_file: str, timeout: float = 30.0):
        self.server = server
        self.token = token
        self.ca_file = ca_file
        self._http = httpx.Client(
            base_url=server,
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
            verify=ssl_context(ca_file),
            timeout=timeout,
            trust_env=False,  # never route through a proxy: loopback only
        )

    # -- plumbing --------------------------------------------------------------------
    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> KubeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: dict[str, Any] | None = None,
        content_type: str = "application/json",
        ok404: bool = False,
    ) -> Any:
        headers = {}
        content = None
        if body is not None:
            content = json.dumps(body)
            headers["Content-Type"] = content_type
        resp = self._http.request(method, path, content=content, params=params, headers=headers)
        if resp.status_code == 404 and ok404:
            return None
        if resp.status_code >= 400:
            try:
                payload = resp.json()
            except ValueError:
                payload = resp.text
            raise ApiError(method, path, resp.status_code, payload)
        if not resp.content:
            return None
        ctype = resp.headers.get("content-type", "")
        return resp.json() if "json" in ctype else resp.text

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params or None)

    def get_or_none(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params or None, ok404=True)

    def create(self, path: str, body: Any, **params: Any) -> Any:
        return self.request("POST", path, body=body, params=params or None)

    def replace(self, path: str, body: Any) -> Any:
        return self.request("PUT", path, body=body)

    def patch(self, path: str, body: Any, patch_type: str = MERGE_PATCH, **params: Any) -> Any:
        return self.request(
            "PATCH", path, body=body, content_type=patch_type, params=params or None
        )

    def delete(self, path: str, body: Any = None, ok404: bool = True, **params: Any) -> Any:
        return self.request("DELETE", path, body=body, params=params or None, ok404=ok404)

    def list(self, path: str, **params: Any) -> list[dict[str, Any]]:
        return self.get(path, **params).get("items", [])

    def watch(
        self, path: str, resource_version: str | None, timeout_seconds: int = 10, **params: Any
    ) -> Iterator[dict[str, Any]]:
        """Yield watch events (``{"type", "object"}``) until the server ends the watch."""
        query: dict[str, Any] = {
            "watch": "1",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
            **params,
        }
        if resource_version:
            query["resourceVersion"] = resource_version
        timeout = httpx.Timeout(self._http.timeout.connect, read=timeout_seconds + 10)
        with self._http.stream("GET", path, params=query, timeout=timeout) as resp:
            if resp.status_code >= 400:
                resp.read()
                raise ApiError("WATCH", path, resp.status_code, resp.text)
            for line in resp.iter_lines():
                if line:
                    yield json.loads(line)

    # -- conveniences ----------------------------------------------------------------
    def apply(self, obj: dict[str, Any]) -> Any:
        """Create ``obj``, or replace it (keeping its resourceVersion) when it exists."""
        collection, name = object_path(obj)
        try:
            return self.create(collection, obj)
        except ApiError as exc:
            if exc.status != 409:
                raise
        current = self.get(f"{collection}/{name}")
        obj = {**obj, "metadata": {**obj["metadata"]}}
        obj["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        return self.replace(f"{collection}/{name}", obj)

    def wait_for(
        self,
        path: str,
        predicate: Callable[[dict[str, Any]], Any],
        timeout: float = 30.0,
        message: str | None = None,
    ) -> dict[str, Any]:
        """Poll ``GET path`` until ``predicate(obj)`` is truthy; return the object."""

        def check() -> dict[str, Any] | None:
            obj = self.get(path)
            return obj if predicate(obj) else None

        return wait_until(check, timeout=timeout, message=message or f"{path} to match")

    def wait_gone(self, path: str, timeout: float = 30.0) -> None:
        wait_until(
            lambda: self.get_or_none(path) is None, timeout=timeout, message=f"{path} to be gone"
        )


# Resources whose plural is not simply kind.lower() + "s".
_PLURALS = {
    "Endpoints": "endpoints",
    "NetworkPolicy": "networkpolicies",
    "PodSecurityPolicy": "podsecuritypolicies",
    "StorageClass": "storageclasses",
    "Ingress": "ingresses",
    "IngressClass": "ingressclasses",
    "PriorityClass": "priorityclasses",
    "RuntimeClass": "runtimeclasses",
    "CustomResourceDefinition": "customresourcedefinitions",
}
_CLUSTER_SCOPED = {
    "Namespace",
    "Node",
    "PersistentVolume",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "StorageClass",
    "PriorityClass",
    "RuntimeClass",
    "IngressClass",
    "APIService",
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
}


def object_path(obj: dict[str, Any]) -> tuple[str, str]:
    """Collection path and name of a built-in or CRD-backed object.

    Custom resources are assumed namespaced unless they carry no namespace.
    """
    api_version, kind = obj["apiVersion"], obj["kind"]
    meta = obj["metadata"]
    plural = _PLURALS.get(kind) or (kind.lower() + ("es" if kind.endswith("s") else "s"))
    if kind.endswith("y") and kind not in _PLURALS:
        plural = kind[:-1].lower() + "ies"
    prefix = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    ns = meta.get("namespace")
    if kind in _CLUSTER_SCOPED or not ns:
        return f"{prefix}/{plural}", meta["name"]
    return f"{prefix}/namespaces/{ns}/{plural}", meta["name"]


SANDBOX_API = "/apis/sandboxworkspace.io/v1alpha1"


def delete_sandbox_resources(api: KubeClient, namespace: str, timeout: float = 60.0) -> None:
    """Delete every ConversationWorkspace and SandboxSession in ``namespace`` and wait for
    them to go — while an operator still runs, since their finalizers need it."""
    base = f"{SANDBOX_API}/namespaces/{namespace}"
    plurals = ("conversationworkspaces", "sandboxsessions")
    for plural in plurals:
        for obj in api.list(f"{base}/{plural}"):
            api.delete(f"{base}/{plural}/{obj['metadata']['name']}")
    for plural in plurals:
        for obj in api.list(f"{base}/{plural}"):
            api.wait_gone(f"{base}/{plural}/{obj['metadata']['name']}", timeout=timeout)
