"""Which session a connection to the egress proxy comes from, on Kubernetes, and its policy.

Contract:
- A connection's session is decided by its source address alone: the pod address of a
  sandbox pod (label ``sandboxworkspace.io/component: runtime``) that names its session
  (``sandboxworkspace.io/session``), is not being deleted and has an address. Under the
  sandbox NetworkPolicy only sandbox pods reach the proxy, and a pod cannot forge its
  address (no NET_ADMIN/NET_RAW).
- An address two such pods claim (a dying pod and its successor, a reused address) maps
  to no session: refused, never the wrong policy.
- A session's policy is its ``spec.egress`` (``operator.models.EgressSpec``); none, or one
  that does not validate, is no policy (the proxy refuses everything).
- ``ClusterPolicies`` keeps the last index it read (``refresh``); when it cannot read the
  cluster for ``max_stale`` seconds it forgets it (deny all) rather than apply old
  policies forever.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sandbox_workspace.contract import crd

from .policy import EgressPolicy, PolicyError, Rule

log = logging.getLogger(__name__)


def session_key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def normal_address(text: str) -> str | None:
    """The comparable form of an address (an IPv4-mapped IPv6 peer as IPv4), or None."""
    try:
        address = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return str(address)


def _pod_addresses(pod: Mapping[str, Any]) -> set[str]:
    status = pod.get("status") or {}
    texts = [status.get("podIP")] + [p.get("ip") for p in status.get("podIPs") or []]
    return {a for t in texts if t and (a := normal_address(t)) is not None}


def address_index(pods: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Pod address → session key, for sandbox pods of a session; ambiguous addresses out."""
    owners: dict[str, set[str]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        session = labels.get(crd.LABEL_SESSION)
        if (
            labels.get(crd.LABEL_COMPONENT) != crd.COMPONENT_RUNTIME
            or not session
            or meta.get("deletionTimestamp")
            or (pod.get("spec") or {}).get("hostNetwork")  # the node's address, shared
        ):
            continue
        for address in _pod_addresses(pod):
            owners.setdefault(address, set()).add(session_key(meta.get("namespace", ""), session))
    return {address: keys.pop() for address, keys in owners.items() if len(keys) == 1}


def policy_from_spec(raw: Any) -> EgressPolicy:
    """``spec.egress`` (``{"rules": [{"host", "ports", "schemes"}]}``, the schema of
    ``operator.models.EgressSpec``) as a policy; PolicyError when it is not one."""
    if not isinstance(raw, Mapping) or not isinstance(raw.get("rules", []), list):
        raise PolicyError("spec.egress must be an object with a list of rules")
    rules = []
    for rule in raw.get("rules", []):
        if not isinstance(rule, Mapping) or not isinstance(rule.get("host"), str):
            raise PolicyError("each egress rule needs a host")
        ports, schemes = rule.get("ports", [443]), rule.get("schemes", ["https"])
        if not isinstance(ports, list) or not all(type(p) is int for p in ports):
            raise PolicyError(f"{rule['host']!r}: ports must be a list of integers")
        if not isinstance(schemes, list) or not all(isinstance(s, str) for s in schemes):
            raise PolicyError(f"{rule['host']!r}: schemes must be a list of strings")
        rules.append(Rule.make(rule["host"], ports, schemes))
    return EgressPolicy(tuple(rules))


def session_policy(session: Mapping[str, Any]) -> EgressPolicy | None:
    """The policy of a SandboxSession object; None when it has none or it is invalid."""
    raw = (session.get("spec") or {}).get("egress")
    if raw is None:
        return None
    try:
        return policy_from_spec(raw)
    except PolicyError as exc:
        meta = session.get("metadata") or {}
        log.warning(
            "egress policy refused, session has none",
            extra={"session": meta.get("name"), "error": str(exc)[:300]},
        )
        return None


def policy_index(sessions: Iterable[Mapping[str, Any]]) -> dict[str, EgressPolicy | None]:
    index = {}
    for session in sessions:
        meta = session.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        index[session_key(meta.get("namespace", ""), meta["name"])] = session_policy(session)
    return index


@dataclass
class ClusterPolicies:
    """The proxy's view of the cluster: ``identify`` a peer, ``lookup`` its policy."""

    max_stale: float = 30.0
    addresses: dict[str, str] = field(default_factory=dict)
    policies: dict[str, EgressPolicy | None] = field(default_factory=dict)
    read_at: float = 0.0

    def update(
        self, sessions: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]
    ) -> None:
        self.addresses = address_index(pods)
        self.policies = policy_index(sessions)
        self.read_at = time.monotonic()

    def identify(self, peer: object) -> str | None:
        if not isinstance(peer, tuple) or not peer or not isinstance(peer[0], str):
            return None
        address = normal_address(peer[0])
        return None if address is None else self.addresses.get(address)

    def lookup(self, key: str) -> EgressPolicy | None:
        if time.monotonic() - self.read_at > self.max_stale:
            return None  # the cluster has not been read lately: deny rather than guess
        return self.policies.get(key)

    async def refresh(self, kube: Any, namespaces: Sequence[str]) -> None:
        """Read the sessions and the sandbox pods of ``namespaces`` (``kube``: a
        ``sandbox_workspace.kube.Kube``)."""
        from sandbox_workspace.kube import core_path, custom_path

        sessions: list[dict[str, Any]] = []
        pods: list[dict[str, Any]] = []
        selector = f"{crd.LABEL_COMPONENT}={crd.COMPONENT_RUNTIME}"
        for namespace in namespaces:
            sessions += await kube.list(custom_path(namespace, crd.SESSION_PLURAL))
            pods += await kube.list(core_path(namespace, "pods"), label_selector=selector)
        self.update(sessions, pods)

    async def run(self, kube: Any, namespaces: Sequence[str], interval: float) -> None:
        """Refresh every ``interval`` seconds until cancelled; failures are logged and
        retried (``lookup`` denies once the last good read is ``max_stale`` old)."""
        while True:
            try:
                await self.refresh(kube, namespaces)
            except Exception as exc:  # the apiserver away: keep trying, deny when stale
                log.warning("egress proxy cannot read sessions", extra={"error": repr(exc)})
            await asyncio.sleep(interval)
