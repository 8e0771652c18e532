"""Overrides of the egress proxy's name resolution and forbidden ranges, for tests and
demos (the local backend's ``SANDBOX_WORKSPACE_LOCAL_EGRESS_*``, the cluster proxy's
``--hosts``/``--permit``): a test's servers live on loopback, which the proxy otherwise
never reaches. Never set in production: the chart exposes neither.

- ``table_resolver(hosts)``: resolves only the names in ``hosts``, to those addresses.
- ``without(forbidden, permit)``: the forbidden networks with ``permit`` cut out.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence

from .policy import IPAddress, IPNetwork


def without(forbidden: Iterable[IPNetwork], permit: Iterable[IPNetwork]) -> tuple:
    """``forbidden`` with the ``permit`` networks cut out of them."""
    result = list(forbidden)
    for allowed in permit:
        cut: list[IPNetwork] = []
        for net in result:
            if net.version != allowed.version or not net.overlaps(allowed):
                cut.append(net)
            elif not allowed.supernet_of(net):  # net is larger: keep the rest of it
                cut.extend(net.address_exclude(allowed))  # type: ignore[arg-type]
        result = cut
    return tuple(result)


def table_resolver(hosts: Mapping[str, Sequence[str]]):
    table = {
        name.lower().rstrip("."): [ipaddress.ip_address(a) for a in addresses]
        for name, addresses in hosts.items()
    }

    async def resolve(host: str, port: int) -> list[IPAddress]:
        if host not in table:
            raise OSError(f"{host} is not in the egress host table")
        return table[host]

    return resolve
