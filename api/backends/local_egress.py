"""Egress of the local backend's sessions: a network namespace per session whose only way
out is the egress proxy (issue 40; docs/egress-spike.md, "Local backend").

Contract:
- One ``EgressProxy`` (``sandbox_workspace.egress.proxy``) in the API process, with one
  Unix listener per running session in a private run directory (mode 0700, a short path:
  Unix socket paths are limited to 107 bytes), each taking at most ``max_connections``
  connections at once (more are closed unanswered). The listener is the session's identity:
  the proxy applies the policy of the session whose socket a connection came in on, and
  nothing the sandbox sends can name another session.
- A session's runtime runs under bubblewrap with ``--unshare-net`` (nothing but
  loopback) and sees two directories of its own: ``/tmp/.sbw/rt`` (read-write; it listens
  there on ``runtime.sock``, which the API reaches from outside) and ``/tmp/.sbw/eg``
  (read-only; the proxy's socket). No other session's directory is bound in.
- The runtime runs with network ``proxy``: it relays 127.0.0.1:3128 in the namespace to
  the proxy's socket, and code gets ``HTTP(S)_PROXY`` pointing there.
- No policy: the proxy refuses every connection ("no egress policy"), so the session has
  no network at all. ``set_policy`` applies to the next connection.
- ``hosts``: a closed name table (tests, demos): when given, the proxy resolves only
  those names, to those addresses. ``permit``: networks taken off the forbidden ranges
  (loopback for a test's own servers); never set in production.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from sandbox_workspace.egress.overrides import table_resolver, without
from sandbox_workspace.egress.policy import (
    DEFAULT_FORBIDDEN,
    EgressPolicy,
    PolicyError,
    Rule,
)
from sandbox_workspace.egress.proxy import EgressProxy, ProxyConfig, system_resolve
from sandbox_workspace.runtime.settings import RuntimeSettings

# Where a session's runtime sees its two directories (bwrap's private /tmp: /run is the
# host's, read-only).
INSIDE = Path("/tmp/.sbw")
_RUNTIME_SOCKET = "runtime.sock"
_EGRESS_SOCKET = "egress.sock"
_MAX_SOCKET_PATH = 107


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
    ) -> None:
        self.max_connections = max_connections
        self.policies: dict[str, EgressPolicy] = {}
        self._servers: dict[str, asyncio.Server] = {}
        forbidden = without(DEFAULT_FORBIDDEN, [ipaddress.ip_network(p) for p in permit])
        self.proxy = EgressProxy(
            self.policies.get,
            resolve=table_resolver(hosts) if hosts is not None else system_resolve,
            config=ProxyConfig(forbidden=forbidden),
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
        self._servers[session_id] = await self._listen(str(path), session_id)

    async def _listen(self, path: str, session_id: str) -> asyncio.Server:
        """The proxy on the session's socket, at most ``max_connections`` at once: a
        flood from one sandbox ends at its own cap, not at the API's file descriptors."""
        open_now = 0

        async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal open_now
            if open_now >= self.max_connections:
                writer.close()
                return
            open_now += 1
            try:
                await self.proxy.handle(reader, writer, session_id)
            finally:
                open_now -= 1

        limit = self.proxy.config.header_limit
        return await asyncio.start_unix_server(on_client, path, limit=limit)

    async def close(self, session_id: str) -> None:
        server = self._servers.pop(session_id, None)
        if server is not None:
            server.close()
            with contextlib.suppress(Exception):
                await server.wait_closed()
        if self.run_dir is not None:
            await asyncio.to_thread(shutil.rmtree, self._dir(session_id), True)

    def bwrap_args(self, session_id: str) -> list[str]:
        directory = self._dir(session_id)
        return [
            "--unshare-net",
            "--bind", str(directory / "rt"), str(INSIDE / "rt"),
            "--ro-bind", str(directory / "eg"), str(INSIDE / "eg"),
        ]  # fmt: skip

    @staticmethod
    def runtime_args() -> list[str]:
        return ["--uds", str(INSIDE / "rt" / _RUNTIME_SOCKET)]

    @staticmethod
    def runtime_env() -> dict[str, str]:
        return RuntimeSettings.env(
            network="proxy", egress_socket=str(INSIDE / "eg" / _EGRESS_SOCKET)
        )
