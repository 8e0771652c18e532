"""The egress proxy as a cluster component (``sandbox-workspace egress-proxy``).

Contract: one TCP listener; each connection's session is its source pod address
(``cluster.ClusterPolicies``), its policy that session's ``spec.egress``, read from the
SandboxSessions of ``namespaces`` every ``interval`` seconds (list only: the proxy's
ServiceAccount may read sessions and pods, and ``get`` Secrets). Destinations in
``forbidden`` (the defaults plus the deployment's pod, service and store ranges) are
never reached.

With ``ca_dir`` (the mounted CA Secret: ``tls.crt``, ``tls.key``) hosts with a secret
bound terminate TLS with that CA and get their values from the Kubernetes Secrets the
bindings name (``kube_secrets.KubeSecretSource``); without it such hosts are refused
(503). ``upstream_ca``: the CA file bound hosts must chain to (default: the system's).
``publish_trust_to``: ``namespace/name`` ConfigMaps the CA's public part is written to
at start (``ca_store.publish_trust``: what sandbox pods mount). ``max_connections`` per
session and ``idle_timeout`` bound tunnels (``proxy.ProxyConfig``); after each read the
open tunnels are re-checked: a session deleted, its pod gone or its policy narrowed
closes them within ``interval``. ``hosts``/``permit``:
test overrides (``overrides``), never set by the chart.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from ipaddress import ip_network
from pathlib import Path

from sandbox_workspace.kube import Kube, load_credentials

from .ca import InterceptCA
from .ca_store import CERT_KEY, KEY_KEY, publish_trust
from .cluster import ClusterPolicies
from .kube_secrets import KubeSecretSource
from .overrides import table_resolver, without
from .policy import forbidden_networks
from .proxy import EgressProxy, ProxyConfig, system_resolve

log = logging.getLogger(__name__)

CONNECTIONS_SETTING = "chart egressProxy.maxConnectionsPerSession"


async def serve_cluster(
    namespaces: Sequence[str],
    host: str,
    port: int,
    *,
    forbidden: Sequence[str] = (),
    interval: float = 2.0,
    kubeconfig: Path | None = None,
    port_file: Path | None = None,
    ca_dir: Path | None = None,
    upstream_ca: str | None = None,
    secret_ttl: float = 5.0,
    hosts: Mapping[str, Sequence[str]] | None = None,
    permit: Sequence[str] = (),
    publish_trust_to: Sequence[str] = (),
    max_connections: int = 64,
    idle_timeout: float = 600.0,
) -> None:
    """Run until cancelled."""
    networks = without(forbidden_networks(forbidden), [ip_network(p) for p in permit])
    config = ProxyConfig(
        forbidden=networks,
        upstream_ca=upstream_ca,
        max_connections=max_connections,
        connections_setting=CONNECTIONS_SETTING,
        idle_timeout=idle_timeout,
    )
    ca = None
    if ca_dir is not None:
        ca = InterceptCA.from_pem((ca_dir / CERT_KEY).read_bytes(), (ca_dir / KEY_KEY).read_bytes())
    kube = Kube(load_credentials(kubeconfig))
    view = ClusterPolicies(max_stale=max(30.0, 5 * interval))
    try:
        if ca is not None and publish_trust_to:
            targets = [tuple(t.split("/", 1)) for t in publish_trust_to]
            await publish_trust(kube, ca.cert_pem, targets)  # type: ignore[arg-type]
        await view.refresh(kube, namespaces)  # a first read before the first client
        proxy = EgressProxy(
            view.lookup,
            resolve=table_resolver(hosts) if hosts is not None else system_resolve,
            config=config,
            ca=ca,
            secrets=KubeSecretSource(kube, view.secret_ref, ttl=secret_ttl) if ca else None,
        )
        poller = asyncio.create_task(view.run(kube, namespaces, interval, proxy.recheck))
        server = await proxy.serve_tcp(host, port, view.identify)
        bound = server.sockets[0].getsockname()[1]
        if port_file is not None:
            await asyncio.to_thread(port_file.write_text, str(bound))
        log.info("egress proxy ready", extra={"port": bound, "namespaces": list(namespaces)})
        try:
            async with server:
                await server.serve_forever()
        finally:
            poller.cancel()
    finally:
        await kube.aclose()
