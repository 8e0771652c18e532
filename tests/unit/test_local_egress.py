"""The local backend's egress wiring, piece by piece (no bubblewrap): the per-session
listener's connection cap, the forbidden ranges a dev setting may cut, policy records,
the runtime's isolation check, the runtime client's Unix-socket routing, and the socket
filter and Landlock rule of network ``proxy`` (in forked children), and the calls that
close a session's open tunnels."""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import json
import os
import socket
import ssl
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
from sandbox_workspace.operator.models import EgressSecret
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


async def _ask(path: str, target: str = "a.test:443") -> bytes:
    """A CONNECT on the session's socket; what comes back before it closes."""
    reader, writer = await asyncio.open_unix_connection(path)
    try:
        writer.write(f"CONNECT {target} HTTP/1.1\r\n\r\n".encode())
        return await asyncio.wait_for(reader.read(), 5)
    except ConnectionError:
        return b""  # closed before or while we wrote
    finally:
        writer.close()


def _egress_socket(local: LocalEgress, session_id: str) -> str:
    return str(local.runtime_socket(session_id).parent.parent / "eg" / "egress.sock")


async def test_one_session_floods_its_own_cap_only(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    local = LocalEgress(max_connections=3)
    await local.start()
    try:
        await local.open("s1")
        path = _egress_socket(local, "s1")
        held = [await asyncio.open_unix_connection(path) for _ in range(3)]  # idle: no head
        answer = await _ask(path)  # the fourth is told why, naming the setting
        assert answer.startswith(b"HTTP/1.1 429 Egress refused: this session has 3 "), answer
        assert b"(SANDBOX_WORKSPACE_EGRESS_MAX_CONNECTIONS)" in answer, answer
        held.pop()[1].close()
        for _ in range(250):  # at most 5 s: until the proxy has seen the closed one go
            if (answer := await _ask(path)).startswith(b"HTTP/1.1 403"):
                break
            await asyncio.sleep(0.02)
        assert answer.startswith(b"HTTP/1.1 403 Egress refused"), answer  # no policy
        for _, w in held:
            w.close()
    finally:
        await local.aclose()
    assert not await asyncio.to_thread(Path(local.run_dir).exists)


def _client_hello(host: str) -> bytes:
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname=host)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


async def test_a_policy_change_or_a_stop_closes_the_sessions_open_tunnels(tmp_path, monkeypatch):
    """The backend's calls (``set_policy``, ``close``) reach tunnels already open: an
    upstream that never speaks would otherwise hold them until the idle deadline."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    reached = asyncio.Queue()

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reached.put(await reader.read(10))  # the ClientHello arrived; say nothing
        await reader.read()

    upstream = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = upstream.sockets[0].getsockname()[1]
    local = LocalEgress(hosts={"up.test": ["127.0.0.1"]}, permit=["127.0.0.0/8"])
    await local.start()

    async def open_tunnel() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_unix_connection(_egress_socket(local, "s1"))
        writer.write(f"CONNECT up.test:{port} HTTP/1.1\r\n\r\n".encode())
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        writer.write(_client_hello("up.test"))
        assert await asyncio.wait_for(reached.get(), 5)  # relayed: a live tunnel
        return reader, writer  # the writer kept: collected, it would close the tunnel

    try:
        await local.open("s1")
        local.set_policy("s1", EgressPolicy((Rule.make("up.test", ports=[port]),)))
        tunnel, _kept = await open_tunnel()
        local.set_policy("s1", EgressPolicy((Rule.make("up.test", ports=[port]),)))
        assert local.proxy.open_connections("s1") == 1  # still allowed: kept
        local.set_policy("s1", EgressPolicy((Rule.make("other.test"),)))
        assert await asyncio.wait_for(tunnel.read(), 5) == b""
        local.set_policy("s1", EgressPolicy((Rule.make("up.test", ports=[port]),)))
        tunnel, _kept = await open_tunnel()
        await local.close("s1")  # the runtime stops, or the session is deleted
        assert await asyncio.wait_for(tunnel.read(), 5) == b""
    finally:
        await local.aclose()
        upstream.close()


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


async def test_bound_secrets_give_code_a_placeholder_and_trust_and_hide_the_values(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    spec = EgressSecret.model_validate(
        {"name": "api", "host": "api.test", "secretKeyRef": {"name": "k", "key": "t"}}
    )
    (tmp_path / "values" / "k").mkdir(parents=True)
    (tmp_path / "values" / "k" / "t").write_text("sk-value-123\n")
    local = LocalEgress(secrets=[spec], secrets_dir=tmp_path / "values", ca_dir=tmp_path / "ca")
    await local.start()
    try:
        await local.open("s1")
        local.set_policy("s1", EgressPolicy((Rule.make("api.test"),)))
        (binding,) = local.policies["s1"].secrets
        assert await local.value("s1", "api") == "sk-value-123"  # the file, no newline
        assert await local.value("s1", "other") is None
        code_env = json.loads(local.runtime_env("s1")["SANDBOX_RUNTIME_CODE_ENV"])
        assert code_env["SBW_SECRET_API"] == binding.placeholder
        assert code_env["SSL_CERT_FILE"] == local.system_bundle
        assert "sk-value-123" not in json.dumps(code_env)
        args = local.bwrap_args("s1")
        hidden = args.index("--tmpfs")
        assert args[hidden + 1] == str((tmp_path / "values").resolve())
        # The bundle with the CA, over the system's (the file, not a link to it).
        bound = args.index(await asyncio.to_thread(os.path.realpath, local.system_bundle))
        assert args[bound - 2] == "--ro-bind" and args[bound - 1].endswith("trust.pem")
        assert oct((tmp_path / "ca").stat().st_mode & 0o777) == "0o700"
    finally:
        await local.aclose()
