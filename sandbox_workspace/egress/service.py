"""The egress proxy as a cluster component (``sandbox-workspace egress-proxy``).

Contract: one TCP listener; each connection's session is its source pod address
(``cluster.ClusterPolicies``), its policy that session's ``spec.egress``, read from the
SandboxSessions of ``namespaces`` every ``interval`` seconds (list only: the proxy's
ServiceAccount may read sessions and pods, nothing else). Destinations in ``forbidden``
(the defaults plus the deployment's pod, service and store ranges) are never reached.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path

from sandbox_workspace.kube import Kube, load_credentials

from .cluster import ClusterPolicies
from .policy import forbidden_networks
from .proxy import EgressProxy, ProxyConfig

log = logging.getLogger(__name__)


async def serve_cluster(
    namespaces: Sequence[str],
    host: str,
    port: int,
    *,
    forbidden: Sequence[str] = (),
    interval: float = 2.0,
    kubeconfig: Path | None = None,
    port_file: Path | None = None,
) -> None:
    """Run until cancelled."""
    config = ProxyConfig(forbidden=forbidden_networks(forbidden))
    kube = Kube(load_credentials(kubeconfig))
    view = ClusterPolicies(max_stale=max(30.0, 5 * interval))
    try:
        await view.refresh(kube, namespaces)  # a first read before the first client
        poller = asyncio.create_task(view.run(kube, namespaces, interval))
        proxy = EgressProxy(view.lookup, config=config)
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
