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
- ``spec.egress.secrets`` binds secrets (``policy.SecretBinding``) whose values live in
  Kubernetes Secrets of the session's namespace (``secretKeyRef``; read by
  ``kube_secrets.KubeSecretSource``). A binding's placeholder is ``placeholder_for``
  the session and binding name: the operator puts the same string in the pod's
  environment (``placeholder_env``), and nothing about it derives from the value. A
  secrets list that does not validate makes the whole policy invalid (deny all).
- ``ClusterPolicies`` keeps the last index it read (``refresh``); when it cannot read the
  cluster for ``max_stale`` seconds it forgets it (deny all) rather than apply old
  policies forever. ``run`` calls ``on_refresh`` after each read, failed or not (the
  proxy re-checks its open tunnels against what it now knows).
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sandbox_workspace.contract import crd

from .policy import EgressPolicy, PolicyError, Rule, SecretBinding

log = logging.getLogger(__name__)


def session_key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


@dataclass(frozen=True)
class SecretRef:
    """Where a binding's value is: key ``key`` of Secret ``secret`` in ``namespace``."""

    namespace: str
    secret: str
    key: str
    host: str  # the binding's host (the Secret's allowed hosts are checked against it)


_ENV_RESERVED = re.compile(
    r"(SANDBOX_|LD_|PYTHON|NODE_|PIP_|GIT_|SSL_|CURL_|REQUESTS_).*"
    r"|(HTTPS?_PROXY|NO_PROXY|ALL_PROXY|HOME|PATH|TMPDIR|SHELL|USER|LANG)",
    re.IGNORECASE,
)


def reserved_env(name: str) -> bool:
    """Variables the platform sets or that change how code runs: never a placeholder's."""
    return _ENV_RESERVED.fullmatch(name) is not None


def placeholder_env(name: str) -> str:
    """The default variable holding binding ``name``'s placeholder in the sandbox."""
    return "SBW_SECRET_" + name.upper().replace("-", "_")


def placeholder_for(namespace: str, session: str, name: str) -> str:
    """The placeholder of binding ``name`` in session ``namespace/session``: the operator
    (pod environment) and the proxy (swap) compute the same string. Not secret: it only
    marks where the proxy puts the value, and only for that session's connections."""
    digest = hashlib.sha256(f"{namespace}/{session}/{name}".encode()).hexdigest()[:32]
    return f"sbw-secret-{name}-{digest}"


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


def _text(raw: Mapping[str, Any], key: str, default: str | None = None) -> str | None:
    value = raw.get(key, default)
    if value is not None and not isinstance(value, str):
        raise PolicyError(f"egress secret field {key!r} must be a string")
    return value


def secrets_from_spec(
    raw: Any, namespace: str, session: str
) -> tuple[tuple[SecretBinding, ...], dict[str, SecretRef]]:
    """``spec.egress.secrets`` as bindings and where their values are; PolicyError when
    it is not a valid list (the schema of ``operator.models.EgressSecret``)."""
    if raw is None:
        return (), {}
    if not isinstance(raw, list):
        raise PolicyError("spec.egress.secrets must be a list")
    bindings, refs = [], {}
    for item in raw:
        if not isinstance(item, Mapping) or not isinstance(item.get("secretKeyRef"), Mapping):
            raise PolicyError("each egress secret needs a name, a host and a secretKeyRef")
        name, host = _text(item, "name", ""), _text(item, "host", "")
        ref = item["secretKeyRef"]
        secret, key = _text(ref, "name", ""), _text(ref, "key", "")
        if not secret or not key or name in refs:
            raise PolicyError(f"egress secret {name!r}: one secretKeyRef name and key each")
        binding = SecretBinding.make(
            name or "",
            host or "",
            header=_text(item, "header", "authorization") or "",
            prefix=_text(item, "prefix"),
            placeholder=placeholder_for(namespace, session, name or ""),
        )
        bindings.append(binding)
        refs[name] = SecretRef(namespace, secret, key, binding.host)
    return tuple(bindings), refs


def session_egress(
    session: Mapping[str, Any],
) -> tuple[EgressPolicy | None, dict[str, SecretRef]]:
    """The policy of a SandboxSession object and its secrets' references; (None, {})
    when it has none or it is invalid."""
    raw = (session.get("spec") or {}).get("egress")
    if raw is None:
        return None, {}
    meta = session.get("metadata") or {}
    try:
        policy = policy_from_spec(raw)
        bindings, refs = secrets_from_spec(
            raw.get("secrets"), meta.get("namespace", ""), meta.get("name", "")
        )
        return EgressPolicy(policy.rules, bindings), refs
    except PolicyError as exc:
        meta = session.get("metadata") or {}
        log.warning(
            "egress policy refused, session has none",
            extra={"session": meta.get("name"), "error": str(exc)[:300]},
        )
        return None, {}


def session_policy(session: Mapping[str, Any]) -> EgressPolicy | None:
    """The policy of a SandboxSession object; None when it has none or it is invalid."""
    return session_egress(session)[0]


def policy_index(
    sessions: Iterable[Mapping[str, Any]],
) -> tuple[dict[str, EgressPolicy | None], dict[str, dict[str, SecretRef]]]:
    """Session key → policy, and session key → its secrets' references."""
    index, refs = {}, {}
    for session in sessions:
        meta = session.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        key = session_key(meta.get("namespace", ""), meta["name"])
        index[key], refs[key] = session_egress(session)
    return index, refs


@dataclass
class ClusterPolicies:
    """The proxy's view of the cluster: ``identify`` a peer, ``lookup`` its policy."""

    max_stale: float = 30.0
    addresses: dict[str, str] = field(default_factory=dict)
    policies: dict[str, EgressPolicy | None] = field(default_factory=dict)
    refs: dict[str, dict[str, SecretRef]] = field(default_factory=dict)
    read_at: float = 0.0

    def update(
        self, sessions: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]
    ) -> None:
        self.addresses = address_index(pods)
        self.policies, self.refs = policy_index(sessions)
        self.read_at = time.monotonic()

    def secret_ref(self, key: str, name: str) -> SecretRef | None:
        """Where session ``key``'s secret ``name`` is (None: no such binding, or the view
        is stale)."""
        if self.lookup(key) is None:
            return None
        return self.refs.get(key, {}).get(name)

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

    async def run(
        self,
        kube: Any,
        namespaces: Sequence[str],
        interval: float,
        on_refresh: Callable[[], object] | None = None,
    ) -> None:
        """Refresh every ``interval`` seconds until cancelled; failures are logged and
        retried (``lookup`` denies once the last good read is ``max_stale`` old)."""
        while True:
            try:
                await self.refresh(kube, namespaces)
            except Exception as exc:  # the apiserver away: keep trying, deny when stale
                log.warning("egress proxy cannot read sessions", extra={"error": repr(exc)})
            if on_refresh is not None:
                on_refresh()
            await asyncio.sleep(interval)
