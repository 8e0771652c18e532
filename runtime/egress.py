"""Egress through the proxy for a runtime in a network namespace of its own (network
``proxy``, the local backend under bubblewrap).

Contract:
- ``check_isolated()`` raises ``ValueError`` unless this process's network namespace has
  no interface but loopback: ``proxy`` relaxes the socket filter for IPv4, which is only
  safe where loopback leads nowhere but the relay. A runtime on the host's network with
  ``proxy`` refuses to start rather than give code the host's network.
- ``start_relay(settings)`` listens on 127.0.0.1:``egress_relay_port`` inside the
  namespace and copies each connection, bytes unchanged, to the proxy's Unix socket
  (``sandbox_workspace.egress.relay``). The proxy knows the session by that socket; the
  relay holds no credential.
- ``code_environment(port)`` is what code gets to find it: ``HTTP_PROXY``/``HTTPS_PROXY``
  (and lower-case forms, which some clients read only), ``NO_PROXY`` empty.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from sandbox_workspace.egress.relay import start_relay as _start_relay

from .settings import RuntimeSettings

RELAY_HOST = "127.0.0.1"


def interfaces(net_dev: Path = Path("/proc/net/dev")) -> list[str]:
    """Interface names of this network namespace (/proc/net/dev: /sys may be the host's)."""
    lines = net_dev.read_text().splitlines()[2:]
    return [line.split(":", 1)[0].strip() for line in lines if ":" in line]


def check_isolated(net_dev: Path = Path("/proc/net/dev")) -> None:
    found = interfaces(net_dev)
    if found != ["lo"]:
        raise ValueError(
            f"network `proxy` needs a network namespace with only loopback; this one has "
            f"{', '.join(found)} (start the runtime under the local backend's bubblewrap, "
            "or use network `deny`)"
        )


async def start_relay(settings: RuntimeSettings) -> asyncio.Server:
    assert settings.egress_socket is not None
    return await _start_relay(RELAY_HOST, settings.egress_relay_port, str(settings.egress_socket))


def code_environment(port: int) -> dict[str, str]:
    url = f"http://{RELAY_HOST}:{port}"
    return {
        "HTTP_PROXY": url,
        "HTTPS_PROXY": url,
        "http_proxy": url,
        "https_proxy": url,
        "NO_PROXY": "",
        "no_proxy": "",
    }
