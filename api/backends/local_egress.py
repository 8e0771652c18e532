"""Egress of the local backend's sessions: a network namespace per session whose only way
out is the egress proxy (issue 40; docs/egress-spike.md, "Local backend").

Contract:
- One ``EgressProxy`` (``sandbox_workspace.egress.proxy``) in the API process, with one
  Unix listener per running session in a private run directory (mode 0700, a short path:
  Unix socket paths are limited to 107 bytes). The listener is the session's identity:
  the proxy applies the policy of the session whose socket a connection came in on, and
  nothing the sandbox sends can name another session.
- A session's runtime runs under bubblewrap with ``--unshare-net`` (nothing but
  loopback) and sees two directories of its own: ``/tmp/.sbw/rt`` (read-write; it listens
  there on ``runtime.sock``, which the API reaches from outside) and ``/tmp/.sbw/eg``
  (read-only; the proxy's socket). No other session's directory is bound in.
- The runtime runs with network ``proxy``: it relays 127.0.0.1:3128 in the namespace to
  the proxy's socket, and code gets ``HTTP(S)_PROXY`` pointing there.
- No policy: the proxy refuses every connection ("no egress policy"), so the session has
  no network at all. ``set_policy`` applies to the next connection and closes the open
  ones it no longer allows; ``close`` (the runtime stops, the session goes) closes them
  all.
- Bounds per session (the proxy's): ``max_connections`` open at once (the next answered
  ``429`` naming ``SANDBOX_WORKSPACE_EGRESS_MAX_CONNECTIONS``), ``idle_timeout`` seconds
  of silence close a tunnel.
- Secrets (``secrets``: the bindings of ``SANDBOX_WORKSPACE_SESSION_EGRESS``, for every
  session): the value of each is the file ``secrets_dir/<secretKeyRef.name>/<key>``
  (the layout of a mounted Kubernetes Secret), read by the proxy when a request needs
  it and never bound into a sandbox. Code gets the placeholder (``placeholder_for`` of
  ``local``, the session and the name) in ``SBW_SECRET_<NAME>`` (or the binding's
  ``env``), through the runtime's ``code_env``. For bound hosts the proxy terminates
  TLS with a per-install CA (``ca_dir``: the key 0600 in a 0700 directory, the API's);
  the sandbox sees the system's CA bundle file replaced by a copy with the CA's
  certificate added, and ``SSL_CERT_FILE`` and friends at it (Landlock lets code read
  ``/etc``, not ``/tmp``). ``upstream_ca``: the CA the bound hosts must chain to (tests;
  default the system's).
- ``hosts``: a closed name table (tests, demos): when given, the proxy resolves only
  those names, to those addresses. ``permit``: networks taken off the forbidden ranges
  (loopback for a test's own servers); never set in production.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import os
import shutil
import ssl
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from sandbox_workspace.egress.ca import InterceptCA, trust_env
from sandbox_workspace.egress.cluster import placeholder_for
from sandbox_workspace.egress.overrides import table_resolver, without
from sandbox_workspace.egress.policy import (
    DEFAULT_FORBIDDEN,
    EgressPolicy,
    PolicyError,
    Rule,
    SecretBinding,
)
from sandbox_workspace.egress.proxy import EgressProxy, ProxyConfig, system_resolve
from sandbox_workspace.operator.models import EgressSecret
from sandbox_workspace.runtime.settings import RuntimeSettings

# Where a session's runtime sees its two directories (bwrap's private /tmp: /run is the
# host's, read-only).
INSIDE = Path("/tmp/.sbw")
_RUNTIME_SOCKET = "runtime.sock"
_EGRESS_SOCKET = "egress.sock"
_MAX_SOCKET_PATH = 107
_TRUST = "trust.pem"
# The placeholders' namespace part (Kubernetes: the session's namespace).
LOCAL_NAMESPACE = "local"
CONNECTIONS_SETTING = "SANDBOX_WORKSPACE_EGRESS_MAX_CONNECTIONS"


def policy_to_json(policy: EgressPolicy | None) -> list[dict] | None:
    if policy is None:
        return None
    return [
        {"host": r.host, "ports": sorted(r.ports), "schemes": sorted(r.schemes)}
        for r in policy.rules
    ]


def policy_from_json(rules: Sequence[Mapping] | None) -> EgressPolicy | None:
    """The policy a session record holds (``PolicyError`` when it is not one)."""
    if rules is None:
        return None
    try:
        made = [Rule.make(r["host"], ports=r["ports"], schemes=r["schemes"]) for r in rules]
    except (KeyError, TypeError) as e:
        raise PolicyError(f"not an egress rule: {e!r}") from None
    return EgressPolicy(tuple(made))


class LocalEgress:
    def __init__(
        self,
        *,
        hosts: Mapping[str, Sequence[str]] | None = None,
        permit: Sequence[str] = (),
        max_connections: int = 64,
        idle_timeout: float = 600.0,
        secrets: Sequence[EgressSecret] = (),
        secrets_dir: Path | None = None,
        ca_dir: Path | None = None,
        upstream_ca: str | None = None,
    ) -> None:
        if secrets and (secrets_dir is None or ca_dir is None):
            raise ValueError("egress secrets on the local backend need secrets_dir and ca_dir")
        self.secret_specs = {s.name: s for s in secrets}
        self.secrets_dir, self.ca_dir = secrets_dir, ca_dir
        # The file code's TLS clients read by default: the bundle is bound over it.
        self.system_bundle = ssl.get_default_verify_paths().cafile
        if secrets and not (self.system_bundle and os.path.isfile(self.system_bundle)):
            raise ValueError(
                "egress secrets on the local backend need the system's CA bundle file "
                "(install ca-certificates): the sandbox sees it with the egress CA added"
            )
        self.policies: dict[str, EgressPolicy] = {}
        self._servers: dict[str, asyncio.Server] = {}
        forbidden = without(DEFAULT_FORBIDDEN, [ipaddress.ip_network(p) for p in permit])
        config = ProxyConfig(
            forbidden=forbidden,
            max_connections=max_connections,
            connections_setting=CONNECTIONS_SETTING,
            idle_timeout=idle_timeout,
            upstream_ca=upstream_ca,
        )
        self.proxy = EgressProxy(
            self.policies.get,
            resolve=table_resolver(hosts) if hosts is not None else system_resolve,
            config=config,
        )
        self.run_dir: Path | None = None

    async def start(self) -> None:
        self.run_dir = Path(tempfile.mkdtemp(prefix="sbw-net-"))  # 0700
        longest = self.run_dir / ("0" * 16) / "rt" / _RUNTIME_SOCKET
        if len(str(longest)) > _MAX_SOCKET_PATH:
            raise RuntimeError(
                f"the temporary directory {self.run_dir.parent} is too deep for Unix sockets "
                "(set TMPDIR to a shorter path)"
            )
        if self.secret_specs:
            assert self.ca_dir is not None
            self.proxy.ca = await asyncio.to_thread(InterceptCA.load_or_create, self.ca_dir)
            self.proxy.secrets = self

    async def aclose(self) -> None:
        for session_id in list(self._servers):
            await self.close(session_id)
        if self.run_dir is not None:
            await asyncio.to_thread(shutil.rmtree, self.run_dir, True)

    def _dir(self, session_id: str) -> Path:
        assert self.run_dir is not None, "LocalEgress.start() first"
        # A fixed-length name: any session id, a short socket path.
        return self.run_dir / hashlib.sha256(session_id.encode()).hexdigest()[:16]

    def runtime_socket(self, session_id: str) -> Path:
        """Where the API reaches the session's runtime."""
        return self._dir(session_id) / "rt" / _RUNTIME_SOCKET

    async def open(self, session_id: str) -> None:
        """The session's directories and proxy listener (before its runtime starts)."""
        await self.close(session_id)
        directory = self._dir(session_id)
        for sub in ("rt", "eg"):
            (directory / sub).mkdir(parents=True, mode=0o700, exist_ok=True)
        path = directory / "eg" / _EGRESS_SOCKET
        path.unlink(missing_ok=True)
        if self.proxy.ca is not None:
            await asyncio.to_thread(
                self.proxy.ca.write_trust_bundle, directory / "eg" / _TRUST, self.system_bundle
            )
        self._servers[session_id] = await self.proxy.serve_unix(str(path), session_id)

    def set_policy(self, session_id: str, policy: EgressPolicy | None) -> None:
        """The session's policy from now on (with the platform's secret bindings): the
        next connection is judged by it, and its open connections that it no longer
        allows are closed."""
        if policy is None:
            self.policies.pop(session_id, None)
        else:
            self.policies[session_id] = EgressPolicy(policy.rules, self._bindings(session_id))
        self.proxy.recheck(session_id)

    def _bindings(self, session_id: str) -> tuple[SecretBinding, ...]:
        return tuple(
            SecretBinding.make(
                s.name,
                s.host,
                header=s.header,
                prefix=s.prefix,
                placeholder=placeholder_for(LOCAL_NAMESPACE, session_id, s.name),
            )
            for s in self.secret_specs.values()
        )

    async def value(self, session_id: str, name: str) -> str | None:
        """The proxy's ``SecretSource``: the binding's file (None: no such binding or
        file; the proxy then refuses the request rather than send the placeholder)."""
        spec = self.secret_specs.get(name)
        if spec is None or self.secrets_dir is None:
            return None
        ref = spec.secret_key_ref
        if ref.key in (".", ".."):  # the pattern lets dots through: never a directory
            return None
        path = self.secrets_dir / ref.name / ref.key
        try:
            text = await asyncio.to_thread(path.read_text, encoding="utf-8")
        except (OSError, UnicodeError):
            return None
        return text.removesuffix("\n")

    async def close(self, session_id: str) -> None:
        """The session's runtime is stopping or the session is gone: its listener and
        every connection still open through it (a tunnel's upstream side would otherwise
        outlive the sandbox until the upstream hangs up)."""
        self.proxy.close_session(session_id)
        server = self._servers.pop(session_id, None)
        if server is not None:
            server.close()
            with contextlib.suppress(Exception):
                await server.wait_closed()
        if self.run_dir is not None:
            await asyncio.to_thread(shutil.rmtree, self._dir(session_id), True)

    def bwrap_args(self, session_id: str) -> list[str]:
        directory = self._dir(session_id)
        trust = []
        if self.proxy.ca is not None and self.system_bundle:
            # Over the file itself: bwrap cannot mount onto a symlink's path (Fedora's
            # bundle is one); SSL_CERT_FILE may still name the link.
            bundle = os.path.realpath(self.system_bundle)
            trust = ["--ro-bind", str(directory / "eg" / _TRUST), bundle]
        if self.secrets_dir is not None:  # the values: never in the sandbox's filesystem
            trust += ["--tmpfs", str(self.secrets_dir.resolve())]
        return [
            "--unshare-net",
            "--bind", str(directory / "rt"), str(INSIDE / "rt"),
            "--ro-bind", str(directory / "eg"), str(INSIDE / "eg"),
            *trust,
        ]  # fmt: skip

    @staticmethod
    def runtime_args() -> list[str]:
        return ["--uds", str(INSIDE / "rt" / _RUNTIME_SOCKET)]

    def runtime_env(self, session_id: str) -> dict[str, str]:
        code_env = {}
        if self.proxy.ca is not None and self.system_bundle:
            code_env = trust_env(self.system_bundle)
        for spec in self.secret_specs.values():
            code_env[spec.env_name] = placeholder_for(LOCAL_NAMESPACE, session_id, spec.name)
        return RuntimeSettings.env(
            network="proxy",
            egress_socket=str(INSIDE / "eg" / _EGRESS_SOCKET),
            code_env=code_env or None,
        )
