"""The egress proxy's ``SecretSource`` on Kubernetes: a binding's value is a key of a
Kubernetes Secret in the session's own namespace (``spec.egress.secrets[].secretKeyRef``).

Contract:
- Only the proxy reads these Secrets (its ServiceAccount may ``get`` secrets in the
  sessions' namespaces; the sandbox pods have no token at all). The value goes from
  the apiserver to the proxy's memory and into the bound header, nowhere else.
- The Secret must be the platform's: labelled ``sandboxworkspace.io/egress-secret:
  "true"``. A session's spec cannot make the proxy read another Secret of the namespace
  (a runtime token, the pool's claim key) and send it to a host it names. When the
  Secret also carries the annotation ``sandboxworkspace.io/egress-hosts`` (hosts,
  comma-separated), the binding's host must be one of them.
- Anything that keeps the value from being used raises ``SecretUnavailable`` with a
  message naming the binding, the Secret and the key, never a value: the proxy then
  answers ``502 Egress refused: ...`` and sends nothing upstream (never the
  placeholder). Missing Secret, key absent, not labelled, host not allowed, the
  apiserver refusing or away.
- Each Secret is read at most once per ``ttl`` seconds (default 5; a miss is cached as
  long, so a flood of requests costs the apiserver one GET per Secret per ``ttl``); a
  changed or newly created Secret is used within ``ttl`` seconds, no restart.
  Concurrent requests for one Secret share one read. At most ``max_entries`` Secrets
  are cached (oldest dropped).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import time
from collections.abc import Callable
from typing import Any

from sandbox_workspace.contract.crd import PREFIX
from sandbox_workspace.kube import KubeError, core_path

from .cluster import SecretRef
from .secrets import SecretUnavailable

LABEL_EGRESS_SECRET = f"{PREFIX}/egress-secret"
ANNOTATION_EGRESS_HOSTS = f"{PREFIX}/egress-hosts"

RefLookup = Callable[[str, str], SecretRef | None]


def value_of(secret: dict[str, Any] | None, name: str, ref: SecretRef) -> str:
    """The value ``ref`` names in ``secret`` (the object as read, None: not found)."""
    where = f"secret {name!r}: Kubernetes Secret {ref.secret!r}"
    if secret is None:
        raise SecretUnavailable(f"{where} not found in the session's namespace")
    meta = secret.get("metadata") or {}
    if (meta.get("labels") or {}).get(LABEL_EGRESS_SECRET) != "true":
        raise SecretUnavailable(f"{where} is not labelled {LABEL_EGRESS_SECRET}=true")
    hosts = (meta.get("annotations") or {}).get(ANNOTATION_EGRESS_HOSTS)
    if hosts is not None and ref.host not in {h.strip().lower() for h in hosts.split(",")}:
        raise SecretUnavailable(
            f"{where} may not be sent to {ref.host} ({ANNOTATION_EGRESS_HOSTS})"
        )
    encoded = (secret.get("data") or {}).get(ref.key)
    if encoded is None:
        raise SecretUnavailable(f"{where} has no key {ref.key!r}")
    try:
        return base64.b64decode(encoded, validate=True).decode("ascii")
    except (binascii.Error, UnicodeDecodeError):
        raise SecretUnavailable(f"{where}, key {ref.key!r}: not ASCII text") from None


class KubeSecretSource:
    def __init__(
        self, kube: Any, refs: RefLookup, *, ttl: float = 5.0, max_entries: int = 1024
    ) -> None:
        self.kube, self.refs, self.ttl, self.max_entries = kube, refs, ttl, max_entries
        # (namespace, name) → (read at, the object or None, or the read in flight)
        self._cache: dict[tuple[str, str], tuple[float, dict | None]] = {}
        self._reads: dict[tuple[str, str], asyncio.Future] = {}

    async def _read(self, namespace: str, name: str) -> dict | None:
        key = (namespace, name)
        cached = self._cache.get(key)
        if cached is not None and time.monotonic() - cached[0] < self.ttl:
            return cached[1]
        if key in self._reads:  # one read for every request waiting on this Secret
            return await asyncio.shield(self._reads[key])
        future = asyncio.get_running_loop().create_future()
        self._reads[key] = future
        try:
            secret = await self.kube.get(core_path(namespace, "secrets", name))
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning when none waits
            raise
        else:
            future.set_result(secret)
        finally:
            del self._reads[key]
        self._cache.pop(key, None)
        if len(self._cache) >= self.max_entries:
            self._cache.pop(next(iter(self._cache)))
        self._cache[key] = (time.monotonic(), secret)
        return secret

    async def value(self, session_id: str, name: str) -> str | None:
        ref = self.refs(session_id, name)
        if ref is None:
            return None
        try:
            secret = await self._read(ref.namespace, ref.secret)
        except KubeError as exc:
            raise SecretUnavailable(
                f"secret {name!r}: Kubernetes Secret {ref.secret!r} could not be read "
                f"({exc.status or 'apiserver unreachable'})"
            ) from None
        return value_of(secret, name, ref)
