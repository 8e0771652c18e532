"""Run the operator: ``sandbox-workspace operator`` (or ``run_async`` in a test's thread).

Namespaces come from ``SANDBOX_OPERATOR_NAMESPACES`` (empty: the whole cluster).
"""

from __future__ import annotations

import asyncio
import getpass
import ipaddress
import logging
import os
import secrets
import socket
import time
from typing import Any

import kopf

from sandbox_workspace import tracing

from .context import OperatorContext
from .handlers import build_registry
from .settings import OperatorSettings, host_port

log = logging.getLogger(__name__)


async def run_async(
    settings: OperatorSettings,
    *,
    context: OperatorContext | None = None,
    stop_flag: Any = None,
    ready_flag: Any = None,
) -> None:
    tracing.configure("sandbox-workspace-operator")  # only when OTEL_EXPORTER_OTLP_ENDPOINT is set
    ctx = context or OperatorContext(settings)
    namespaces = list(settings.namespaces)
    ctx.identity = identity = settings.identity or _own_id()
    await kopf.operator(
        registry=build_registry(settings),
        memo=kopf.Memo(ctx=ctx),
        clusterwide=not namespaces,
        namespaces=namespaces,
        standalone=settings.standalone,
        # A peering name makes peering mandatory in kopf, even when standalone.
        peering_name=None if settings.standalone else settings.peering_name,
        priority=settings.priority,
        identity=identity,
        liveness_endpoint=settings.liveness_endpoint,
        stop_flag=stop_flag,
        ready_flag=ready_flag,
    )


def _own_id() -> str:
    """The replica's id in the peering object, as kopf makes it: the pod's name
    ($POD_ID), else user@host with the start time and a random tail."""
    pod = os.environ.get("POD_ID")
    if pod:
        return pod
    stamp = time.strftime("%Y%m%d%H%M%S", time.gmtime())
    return f"{getpass.getuser()}@{socket.gethostname()}/{stamp}/{secrets.token_hex(3)}"


def resolve_egress_proxy(settings: OperatorSettings) -> OperatorSettings:
    """The egress proxy's host name resolved to its address, once (a Service's ClusterIP
    lives as long as the Service): sandbox pods reach only the proxy, not DNS, so their
    HTTP(S)_PROXY must be an address. Unresolvable: the name stays, with a warning."""
    if not settings.egress_proxy:
        return settings
    host, port = host_port(settings.egress_proxy)
    try:
        ipaddress.ip_address(host.strip("[]"))
        return settings
    except ValueError:
        pass
    try:
        address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][4][0]
    except (OSError, ValueError) as exc:
        log.warning("egress proxy %r not resolved (%s): sandboxes get the name", host, exc)
        return settings
    shown = f"[{address}]" if ":" in address else address
    return settings.model_copy(update={"egress_proxy": f"{shown}:{port}"})


def run(settings: OperatorSettings) -> None:
    settings = resolve_egress_proxy(settings)
    context = OperatorContext(settings)
    context.ensure_credentials()  # fail here, loudly, rather than inside kopf's login
    asyncio.run(run_async(settings, context=context))
