"""The per-install intercept CA kept in the cluster.

Contract:
- ``ensure_ca_secret`` (``sandbox-workspace egress-ca``, the chart's hook Job before
  every install and upgrade): the CA (``ca.InterceptCA``) lives in a
  ``kubernetes.io/tls`` Secret in the release's namespace, created once when absent and
  never replaced — a second run, a ``helm upgrade``, two runs at once (the create is
  create-if-absent; the loser reads the winner's) all keep the one there. Rotating is
  deleting it (docs/operations.md). Only the egress proxy mounts it.
- ``publish_trust`` (the proxy, at start): what sandbox pods mount is a ConfigMap in the
  sessions' namespace with the *certificate* (``ca.crt``) and a trust bundle
  (``bundle.pem``: the image's system roots followed by the CA certificate), rewritten
  on every start so it matches the CA the proxy serves with. Never the key.
"""

from __future__ import annotations

import base64
from typing import Any

from sandbox_workspace.kube import core_path

from .ca import InterceptCA, trust_bundle

CERT_KEY, KEY_KEY = "tls.crt", "tls.key"
CONFIGMAP_CERT, CONFIGMAP_BUNDLE = "ca.crt", "bundle.pem"
LABELS = {"app.kubernetes.io/name": "sandbox-workspace", "app.kubernetes.io/component": "egress-ca"}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def ca_secret(name: str, ca: InterceptCA) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "labels": LABELS},
        "type": "kubernetes.io/tls",
        "data": {CERT_KEY: _b64(ca.cert_pem), KEY_KEY: _b64(ca.key_pem)},
    }


def trust_configmap(name: str, cert_pem: bytes) -> dict[str, Any]:
    """The public part sandbox pods mount (``ca.crt``, ``bundle.pem``)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": LABELS},
        "data": {
            CONFIGMAP_CERT: cert_pem.decode("ascii"),
            CONFIGMAP_BUNDLE: trust_bundle(cert_pem).decode("utf-8", "replace"),
        },
    }


async def ensure_ca_secret(kube: Any, namespace: str, secret: str) -> bytes:
    """The CA certificate (PEM) of Secret ``namespace/secret``, created when absent."""
    path = core_path(namespace, "secrets", secret)
    existing = await kube.get(path)
    if existing is None:
        body = ca_secret(secret, InterceptCA.generate())
        await kube.create(core_path(namespace, "secrets"), body)
        existing = await kube.get(path)  # ours, or the one a concurrent run created first
    data = (existing or {}).get("data") or {}
    if CERT_KEY not in data or KEY_KEY not in data:
        raise RuntimeError(f"Secret {namespace}/{secret} lacks {CERT_KEY} or {KEY_KEY}")
    cert_pem = base64.b64decode(data[CERT_KEY])
    InterceptCA.from_pem(cert_pem, base64.b64decode(data[KEY_KEY]))  # a usable pair
    return cert_pem


async def publish_trust(kube: Any, cert_pem: bytes, targets: list[tuple[str, str]]) -> None:
    """Write the public part to each ``(namespace, name)`` ConfigMap of ``targets``."""
    for namespace, name in targets:
        body = trust_configmap(name, cert_pem)
        if await kube.create(core_path(namespace, "configmaps"), body) is None:
            await kube.patch(core_path(namespace, "configmaps", name), {"data": body["data"]})
