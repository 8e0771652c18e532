"""The local backend's egress wiring, piece by piece (no bubblewrap): the per-session
listener's connection cap, the forbidden ranges a dev setting may cut, policy records,
the runtime's isolation check, the runtime client's Unix-socket routing, and the socket
filter and Landlock rule of network ``proxy`` (in forked children)."""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import os
import socket
from pathlib import Path

import httpx
import pytest

from sandbox_workspace.api.backends.local_egress import (
    LocalEgress,
    policy_from_json,
    policy_to_json,
    without,
)
from sandbox_workspace.egress.policy import DEFAULT_FORBIDDEN, EgressPolicy, PolicyError, Rule
from sandbox_workspace.runtime import egress, landlock, seccomp
from sandbox_workspace.runtime.client import RuntimeClient
from sandbox_workspace.runtime.unix_transport import UnixSocketRouting


def test_permitted_networks_are_cut_out_of_the_forbidden_ones_and_nothing_else():
    loopback = ipaddress.ip_network("127.0.0.0/8")
    assert loopback not in without(DEFAULT_FORBIDDEN, [loopback])
    assert len(without(DEFAULT_FORBIDDEN, [loopback])) == len(DEFAULT_FORBIDDEN) - 1
    one = without(DEFAULT_FORBIDDEN, [ipaddress.ip_network("127.0.0.1/32")])
    covered = [n for n in one if ipaddress.ip_address("127.0.0.2") in n]
    assert covered and not [n for n in one if ipaddress.ip_address("127.0.0.1") in n]
    assert without(DEFAULT_FORBIDDEN, []) == DEFAULT_FORBIDDEN


def test_policy_records_round_trip_and_a_bad_one_is_a_policy_error():
    policy = EgressPolicy((Rule.make("*.PyPI.org.", ports=[443, 8443]),))
    assert policy_from_json(policy_to_json(policy)) == policy
    assert policy_from_json(None) is None and policy_to_json(None) is None
    for bad in ([{"host": "a.test"}], [{"host": "10.0.0.1", "ports": [1], "schemes": ["http"]}]):
        with pytest.raises(PolicyError):
            policy_from_json(bad)


async def _ask(path: str) -> bytes:
    """A CONNECT on the session's socket; what comes back before it closes."""
    reader, writer = await asyncio.open_unix_connection(path)
    try:
        writer.write(b"CONNECT a.test:443 HTTP/1.1\r\n\r\n")
        return await asyncio.wait_for(reader.read(), 5)
    except ConnectionError:
        return b""  # closed before or while we wrote
    finally:
        writer.close()


async def test_one_session_floods_its_own_cap_only(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    local = LocalEgress(max_connections=3)
    await local.start()
    try:
        await local.open("s1")
        path = str(local.runtime_socket("s1").parent.parent / "eg" / "egress.sock")
        held = [await asyncio.open_unix_connection(path) for _ in range(3)]  # idle: no head
        assert await _ask(path) == b""  # the fourth is closed unanswered
        held.pop()[1].close()
        for _ in range(250):  # at most 5 s: until the proxy has seen the closed one go
            if answer := await _ask(path):
                break
            await asyncio.sleep(0.02)
        assert answer.startswith(b"HTTP/1.1 403 Egress refused"), answer  # no policy
        for _, w in held:
            w.close()
    finally:
        await local.aclose()
    assert not await asyncio.to_thread(Path(local.run_dir).exists)


def test_a_runtime_with_network_proxy_needs_a_namespace_with_loopback_only(tmp_path):
    lo = "Inter-|\n face |\n    lo: 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n"
    (tmp_path / "lo").write_text(lo)
    (tmp_path / "host").write_text(lo + "  eth0: 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6\n")
    egress.check_isolated(tmp_path / "lo")
    with pytest.raises(ValueError, match="eth0"):
        egress.check_isolated(tmp_path / "host")


async def test_a_runtime_on_a_unix_socket_is_reached_through_it_and_nowhere_else():
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={})

    # Without the routing transport the request goes to runtime.invalid, never a real host.
    async with httpx.AsyncClient(transport=httpx.MockTransport(record)) as plain:
        await RuntimeClient(plain, "http://127.0.0.1:9", "t", "/nonexistent.sock").health()
    assert seen[-1].url.host == "runtime.invalid"
    routed = UnixSocketRouting(httpx.MockTransport(record))
    async with httpx.AsyncClient(transport=routed) as client:
        assert not await RuntimeClient(client, "http://x", "t", "/nonexistent.sock").health()
        assert len(seen) == 1  # the socket was tried, not the default transport
        assert await RuntimeClient(client, "http://127.0.0.1:9", "t").health()
        assert seen[-1].url.host == "127.0.0.1"


def _in_child(check) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            os._exit(check())
        except BaseException:
            os._exit(99)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _errno(make) -> int:
    try:
        make().close()
        return 0
    except OSError as e:
        return e.errno or -1


@pytest.mark.skipif(bool(seccomp.available()), reason="no seccomp here")
def test_network_proxy_filter_allows_ipv4_tcp_sockets_alone_and_no_listen():
    def check() -> int:
        seccomp.deny_sockets(inet=True)
        stream = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            stream.listen()
            return 1
        except OSError as e:
            if e.errno != errno.EACCES:
                return 2
        finally:
            stream.close()
        refused = [
            (socket.AF_INET, socket.SOCK_DGRAM),
            (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP),
            (socket.AF_INET, socket.SOCK_STREAM, 262),  # MPTCP
            (socket.AF_INET6, socket.SOCK_STREAM),
            (socket.AF_UNIX, socket.SOCK_STREAM),
        ]
        if any(_errno(lambda a=a: socket.socket(*a)) != errno.EACCES for a in refused):
            return 3
        return _errno(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM, 6))

    assert _in_child(check) == 0


@pytest.mark.skipif(landlock.abi_version() < 4, reason="Landlock TCP rules need ABI 4")
def test_landlock_lets_code_connect_to_the_relay_port_alone():
    servers = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    relay, other = (s.getsockname()[1] for s in servers)

    def check() -> int:
        policy = landlock.Policy(0, landlock.NET_BIND_TCP | landlock.NET_CONNECT_TCP)
        landlock.restrict_self(landlock.build_ruleset(policy, [], connect_ports=[relay]))
        if _errno(lambda: socket.create_connection(("127.0.0.1", relay), timeout=5)):
            return 1
        return _errno(lambda: socket.create_connection(("127.0.0.1", other), timeout=5))

    try:
        assert _in_child(check) == errno.EACCES
    finally:
        for s in servers:
            s.close()
