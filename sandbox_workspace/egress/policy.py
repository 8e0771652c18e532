"""A session's egress policy and the pure decisions the proxy makes with it.

Contract:
- Deny by default: an ``EgressPolicy`` with no rules allows nothing.
- A rule names a host exactly (``pypi.org``) or a suffix (``*.pythonhosted.org``, which
  matches every name *below* the suffix, not the suffix itself — say both when both are
  wanted), with the ports and schemes it allows (``https`` is a CONNECT tunnel carrying
  TLS, ``http`` a plain request the proxy forwards).
- Names are compared in their canonical form: lower case, no trailing dot, IDNA (A-label)
  encoding, so ``PyPI.org.`` and ``pypi.org`` are one name.
- An IP literal is never allowed, whatever the rules say: a policy speaks of names, and a
  raw address would skip both the name check and the proxy's own resolution.
- Addresses in ``forbidden`` networks are refused after the proxy resolves an allowed
  name (DNS rebinding: a permitted name pointing at the metadata service or the cluster).
  IPv4-mapped, NAT64 (64:ff9b::/96), 6to4 and Teredo IPv6 forms are checked as the IPv4
  address they carry; the local-use NAT64 prefix 64:ff9b:1::/48 (where the address sits
  depends on the deployment) and IPv4-compatible ::/96 are refused whole.
- A ``SecretBinding`` ties a named secret to one exact host and one place in a request
  (a header, or ``Authorization: Bearer``). The sandbox sees only its placeholder, a
  random string that is never derived from the value; the proxy swaps it for the value
  in that place of requests to that host only (``secrets.py`` says exactly how).
"""

from __future__ import annotations

import ipaddress
import re
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

SCHEMES = frozenset({"http", "https"})
DEFAULT_PORTS = {"http": 80, "https": 443}

# Never reachable through the proxy, whatever the policy: "this" network, private ranges,
# carrier-grade NAT, loopback, link-local (the cloud metadata address 169.254.169.254),
# benchmarking, multicast and reserved space, and their IPv6 counterparts. Deployments add
# the pod, service and store ranges (``forbidden_networks(extra)``).
DEFAULT_FORBIDDEN: tuple[IPNetwork, ...] = tuple(
    ipaddress.ip_network(n)
    for n in (
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.0.0.0/24",
        "192.168.0.0/16",
        "198.18.0.0/15",
        "224.0.0.0/4",
        "240.0.0.0/4",
        "::/128",
        "::1/128",
        "::/96",  # IPv4-compatible (deprecated): ::a.b.c.d may still reach a.b.c.d
        "64:ff9b:1::/48",  # local-use NAT64 (RFC 8215): the embedded IPv4 can't be located
        "fc00::/7",
        "fe80::/10",
        "ff00::/8",
    )
)


class PolicyError(ValueError):
    """A policy or a destination that cannot be understood; the message says what to fix."""


def canonical_host(host: str) -> str:
    """The comparable form of a DNS name, or PolicyError saying why it is not one."""
    name = host.strip().rstrip(".").lower()
    if not name:
        raise PolicyError("empty host name")
    try:
        name = name.encode("idna").decode("ascii")
    except UnicodeError as exc:
        raise PolicyError(f"{host!r} is not a valid host name ({exc})") from None
    labels = name.split(".")
    if len(name) > 253 or any(
        not label or len(label) > 63 or not all(c.isalnum() or c in "-_" for c in label)
        for label in labels
    ):
        raise PolicyError(f"{host!r} is not a valid host name")
    return name


def ip_literal(host: str) -> IPAddress | None:
    """The address when ``host`` is an IP literal (``[::1]`` included), else None."""
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        return ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        pass
    # Forms inet_aton accepts and some resolvers honour: 2130706433, 0x7f.1, 127.1.
    try:
        import socket

        return ipaddress.IPv4Address(socket.inet_aton(text))
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class Rule:
    host: str  # canonical exact name, or "*." + canonical suffix
    ports: frozenset[int] = frozenset({443})
    schemes: frozenset[str] = frozenset({"https"})

    @classmethod
    def make(
        cls, host: str, ports: Iterable[int] = (443,), schemes: Iterable[str] = ("https",)
    ) -> Rule:
        """A validated rule; PolicyError names the bad field."""
        wildcard = host.strip().startswith("*.")
        name = canonical_host(host.strip()[2:] if wildcard else host)
        if ip_literal(name) is not None:
            raise PolicyError(f"{host!r}: rules name hosts, not IP addresses")
        if "*" in name:
            raise PolicyError(f"{host!r}: only a leading '*.' wildcard is supported")
        port_set = frozenset(int(p) for p in ports)
        if not port_set or any(not 0 < p < 65536 for p in port_set):
            raise PolicyError(f"{host!r}: ports must be 1-65535, got {sorted(port_set)}")
        scheme_set = frozenset(s.lower() for s in schemes)
        if not scheme_set or not scheme_set <= SCHEMES:
            raise PolicyError(
                f"{host!r}: schemes must be among {sorted(SCHEMES)}, got {sorted(scheme_set)}"
            )
        return cls(("*." if wildcard else "") + name, port_set, scheme_set)

    def matches_host(self, name: str) -> bool:
        """``name`` is canonical; ``*.example.com`` matches ``a.example.com``, not the apex."""
        if self.host.startswith("*."):
            return name.endswith(self.host[1:])
        return name == self.host


_SECRET_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9a-z]+")
# Headers the proxy itself sets or that frame the request: a secret never goes there.
_RESERVED_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "accept-encoding", "te"}
)


@dataclass(frozen=True)
class SecretBinding:
    """Secret ``name`` goes to ``host`` (exact) in header ``header``, after ``prefix``
    (``Bearer `` for a bearer token). ``placeholder`` is what the sandbox sees."""

    name: str
    host: str
    header: str = "authorization"
    prefix: str = "Bearer "
    placeholder: str = ""

    @classmethod
    def make(
        cls,
        name: str,
        host: str,
        *,
        header: str = "authorization",
        prefix: str | None = None,
        placeholder: str = "",
    ) -> SecretBinding:
        """A validated binding. ``prefix`` defaults to ``Bearer `` for Authorization and
        to nothing for any other header; the placeholder is random unless given."""
        if not _SECRET_NAME.fullmatch(name):
            raise PolicyError(f"secret name {name!r}: lower-case letters, digits and '-'")
        if host.strip().startswith("*") or ip_literal(host) is not None:
            raise PolicyError(f"secret {name!r}: bind it to one exact host name, not {host!r}")
        header = header.strip().lower()
        if not _HEADER_NAME.fullmatch(header) or header in _RESERVED_HEADERS:
            raise PolicyError(f"secret {name!r}: {header!r} cannot carry a secret")
        if prefix is None:
            prefix = "Bearer " if header == "authorization" else ""
        if not all(32 <= ord(c) < 127 for c in prefix):
            raise PolicyError(f"secret {name!r}: the prefix must be printable ASCII")
        placeholder = placeholder or f"sbw-secret-{name}-{secrets.token_hex(16)}"
        if len(placeholder) < 24 or not re.fullmatch(r"[A-Za-z0-9._-]+", placeholder):
            raise PolicyError(f"secret {name!r}: a placeholder is 24+ characters [A-Za-z0-9._-]")
        return cls(name, canonical_host(host), header, prefix, placeholder)


@dataclass(frozen=True)
class EgressPolicy:
    rules: tuple[Rule, ...] = ()
    secrets: tuple[SecretBinding, ...] = ()

    def describe(self) -> str:
        return ", ".join(r.host for r in self.rules) or "nothing"

    def bindings_for(self, host: str) -> tuple[SecretBinding, ...]:
        """The secrets bound to canonical ``host`` (exact match only)."""
        return tuple(b for b in self.secrets if b.host == host)


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str
    host: str = ""  # the canonical name the decision is about (empty when refused early)


def decide(policy: EgressPolicy | None, scheme: str, host: str, port: int) -> Decision:
    """May this session open ``scheme://host:port``? The reason is shown to the sandbox."""
    if policy is None:
        return Decision(False, "this session has no egress policy: its network is closed")
    if ip_literal(host) is not None:
        return Decision(False, f"raw IP address {host} refused: name the host instead")
    try:
        name = canonical_host(host)
    except PolicyError as exc:
        return Decision(False, str(exc))
    by_host = [r for r in policy.rules if r.matches_host(name)]
    if not by_host:
        return Decision(
            False, f"{name} is not in this session's egress policy (allowed: {policy.describe()})"
        )
    if not any(scheme in r.schemes for r in by_host):
        return Decision(False, f"{scheme} to {name} is not allowed by the egress policy")
    if not any(scheme in r.schemes and port in r.ports for r in by_host):
        return Decision(False, f"port {port} of {name} is not allowed by the egress policy")
    return Decision(True, "allowed", name)


def forbidden_networks(extra: Iterable[str] = ()) -> tuple[IPNetwork, ...]:
    """The defaults plus the deployment's own ranges (pod, service, store CIDRs)."""
    try:
        added = tuple(ipaddress.ip_network(n, strict=False) for n in extra)
    except ValueError as exc:
        raise PolicyError(f"bad forbidden network: {exc}") from None
    return DEFAULT_FORBIDDEN + added


def embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped ::ffff:a.b.c.d, NAT64 64:ff9b::/96,
    6to4 2002:aabb:ccdd::/48, Teredo's client address): the one a relay would reach."""
    if isinstance(address, ipaddress.IPv4Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if address in ipaddress.ip_network("64:ff9b::/96"):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def forbidden_match(address: IPAddress, forbidden: Sequence[IPNetwork]) -> IPNetwork | None:
    """The forbidden network ``address`` falls in, or None."""
    candidates = [address]
    if (v4 := embedded_ipv4(address)) is not None:
        candidates.append(v4)
    for candidate in candidates:
        for network in forbidden:
            if candidate.version == network.version and candidate in network:
                return network
    return None


@dataclass
class Resolved:
    """The outcome of checking a name's addresses: the usable ones, or why none is."""

    addresses: list[IPAddress] = field(default_factory=list)
    refusal: str = ""


def check_addresses(
    name: str, addresses: Sequence[IPAddress], forbidden: Sequence[IPNetwork]
) -> Resolved:
    """All of a name's addresses must be outside ``forbidden``: one inside refuses the
    name (a name mixing public and internal addresses is a rebinding attempt, and which
    address a client ends up on must not decide safety)."""
    if not addresses:
        return Resolved(refusal=f"{name} does not resolve")
    for address in addresses:
        if (network := forbidden_match(address, forbidden)) is not None:
            return Resolved(
                refusal=f"{name} resolves to {address}, inside the forbidden range {network}"
            )
    return Resolved(addresses=list(addresses))
