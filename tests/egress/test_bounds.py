"""Bounds on what one session holds open through the egress proxy (issue 40): a cap on
its connections (the next is answered 429 naming the setting), an idle deadline per
tunnel, and open tunnels that follow their session — closed when its policy no longer
allows them, its peer stops being it, or it goes. Real sockets on loopback; each test
fails with its defence off (no cap: the third tunnel opens; no deadline, no re-check:
the tunnel stays open and ``recv`` times out).

One proxy per test (its config is what is tested); the upstreams are the package's
shared ones. Short deadlines (0.5-1 s) keep each test near a second."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from sandbox_workspace.contract import crd
from sandbox_workspace.egress.cluster import ClusterPolicies
from sandbox_workspace.egress.policy import DEFAULT_FORBIDDEN, EgressPolicy, Rule
from sandbox_workspace.egress.proxy import EgressProxy, ProxyConfig
from sandbox_workspace.egress.relay import start_relay

from .conftest import LOOPBACK, Loop, table_resolve
from .test_proxy import tls_context

# How long a test waits for a close it expects; without the defence recv times out here.
CLOSE_WITHIN = 5.0


@dataclass
class Bounded:
    port: int
    policies: dict[str, EgressPolicy]
    proxy: EgressProxy
    who: dict[str, str | None]  # what the TCP listener's identify answers for every peer
    loop: Loop
    silent_port: int  # an upstream that accepts and never answers (plain.test)

    def on_loop(self, call: Callable[[], object]) -> object:
        async def run() -> object:
            return call()

        return self.loop.run(run())


@pytest.fixture
def bounded(loop_thread, upstreams) -> Iterator[Callable[..., Bounded]]:
    servers = []

    silent = Silent()

    def make(**config) -> Bounded:
        rules = (
            Rule.make("allowed.test", ports=[upstreams.tls_port]),
            Rule.make("other.test", ports=[upstreams.tls_port]),
            Rule.make("plain.test", ports=[silent.port], schemes=["http"]),
        )
        policies = {"s1": EgressPolicy(rules)}
        proxy = EgressProxy(
            policies.get,
            resolve=table_resolve,
            config=ProxyConfig(
                forbidden=tuple(n for n in DEFAULT_FORBIDDEN if n != LOOPBACK),
                client_timeout=5,
                **config,
            ),
        )
        who: dict[str, str | None] = {"peer": "s1"}
        server = loop_thread.run(proxy.serve_tcp("127.0.0.1", 0, lambda peer: who["peer"]))
        servers.append(server)
        port = server.sockets[0].getsockname()[1]
        return Bounded(port, policies, proxy, who, loop_thread, silent.port)

    yield make
    for server in servers:
        loop_thread.close(server)
    silent.close()


class Silent:
    """A TCP server that accepts, reads and never answers (an upstream gone quiet)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with self.sock:
            while True:
                try:
                    conn, _ = self.sock.accept()
                except OSError:
                    return
                self.accepted.append(conn)

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        for conn in self.accepted:
            conn.close()


def connect(port: int, target: str, path: str | None = None) -> tuple[socket.socket, bytes]:
    """A CONNECT to ``target`` (by TCP, or the Unix socket ``path``); the socket and the
    proxy's status line."""
    if path is None:
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    else:
        sock = socket.socket(socket.AF_UNIX)
        sock.settimeout(10)
        sock.connect(path)
    sock.sendall(f"CONNECT {target} HTTP/1.1\r\n\r\n".encode())
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        chunk = sock.recv(1)
        if not chunk:
            break
        head += chunk
    return sock, head.split(b"\r\n")[0]


def tunnel(port: int, host: str, upstreams, path: str | None = None) -> ssl.SSLSocket:
    """A tunnel to ``host`` with TLS to the upstream done: a live tunnel, idle."""
    sock, status = connect(port, f"{host}:{upstreams.tls_port}", path)
    assert status == b"HTTP/1.1 200 Connection established", status
    tls = tls_context(upstreams.ca_file).wrap_socket(sock, server_hostname=host)
    tls.settimeout(CLOSE_WITHIN)
    return tls


def closed(tls: ssl.SSLSocket) -> bool:
    """Whether the proxy closes the tunnel within CLOSE_WITHIN (False: still open)."""
    try:
        return tls.recv(100) == b""
    except TimeoutError:
        return False
    except (ssl.SSLError, ConnectionError):
        return True  # an end of stream without close_notify, or a reset


def ask(tls: ssl.SSLSocket, path: str) -> bytes:
    tls.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    answer = b""
    while chunk := tls.recv(4096):
        answer += chunk
    return answer


def test_a_session_holds_at_most_its_cap_and_the_next_is_told_why(bounded, upstreams, tmp_path):
    proxy = bounded(max_connections=2)
    held = [tunnel(proxy.port, "allowed.test", upstreams) for _ in range(2)]
    sock, status = connect(proxy.port, f"allowed.test:{upstreams.tls_port}")
    sock.close()
    assert status == (
        b"HTTP/1.1 429 Egress refused: this session has 2 egress connections open, its most "
        b"(max_connections); close some and retry"
    ), status
    # Another session (its own socket) is not held back by this one's cap.
    path = str(tmp_path / "s2.sock")
    proxy.policies["s2"] = proxy.policies["s1"]
    server = proxy.loop.run(proxy.proxy.serve_unix(path, "s2"))
    other, status = connect(0, f"allowed.test:{upstreams.tls_port}", path)
    other.close()
    assert status == b"HTTP/1.1 200 Connection established", status
    # A tunnel closed frees its place.
    held.pop().close()
    deadline = time.monotonic() + CLOSE_WITHIN
    while proxy.proxy.open_connections("s1") > 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert b"upstream saw: GET /again" in ask(
        tunnel(proxy.port, "allowed.test", upstreams), "/again"
    )
    for tls in held:
        tls.close()
    proxy.loop.close(server)


def test_a_flood_past_twice_the_cap_is_closed_unanswered(bounded):
    proxy = bounded(max_connections=1)
    # Heads never sent: the first holds the cap, the second waits for its head (to be
    # answered 429); the third is closed at once.
    waiting = [socket.create_connection(("127.0.0.1", proxy.port), timeout=10) for _ in range(2)]
    deadline = time.monotonic() + CLOSE_WITHIN
    while proxy.proxy.open_connections("s1") < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    started = time.monotonic()
    with (
        socket.create_connection(("127.0.0.1", proxy.port), timeout=CLOSE_WITHIN) as third,
        contextlib.suppress(ConnectionResetError),
    ):
        assert third.recv(100) == b""
    # At once, not at the 5 s head deadline (client_timeout) every connection has.
    assert time.monotonic() - started < 2.5
    for sock in waiting:
        sock.close()


def test_an_idle_tunnel_is_closed_and_a_busy_one_is_not(bounded, upstreams):
    proxy = bounded(idle_timeout=2.0)
    busy = tunnel(proxy.port, "allowed.test", upstreams)
    idle = tunnel(proxy.port, "allowed.test", upstreams)
    started = time.monotonic()
    # The busy one sends part of its request every 0.2 s for 4.2 s (two deadlines; 1.8 s
    # of margin for a loaded machine's late wakeups: at 1 s of idle timeout, a test
    # thread starved for 0.8 s had its busy tunnel closed).
    busy.sendall(b"GET /busy HTTP/1.1\r\n")
    while time.monotonic() - started < 4.2:
        time.sleep(0.2)
        busy.sendall(b"X-A: b\r\n")
    idle.settimeout(1.0)  # closed at ~2 s, well before the loop's end: no wait left
    assert closed(idle)
    busy.sendall(b"\r\n")
    answer = b""
    while chunk := busy.recv(4096):
        answer += chunk
    assert answer.endswith(b"upstream saw: GET /busy HTTP/1.1"), answer
    busy.close()
    idle.close()


def test_an_upstream_that_never_answers_a_forwarded_request_is_cut_off(bounded):
    proxy = bounded(idle_timeout=0.5)
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=CLOSE_WITHIN) as sock:
        url = f"http://plain.test:{proxy.silent_port}/"
        sock.sendall(f"GET {url} HTTP/1.1\r\n\r\n".encode())
        with contextlib.suppress(ConnectionResetError):
            assert sock.recv(100) == b""  # closed: no answer to relay


def test_a_policy_change_closes_the_tunnels_it_no_longer_allows(bounded, upstreams):
    proxy = bounded()
    dropped = tunnel(proxy.port, "allowed.test", upstreams)
    kept = tunnel(proxy.port, "other.test", upstreams)
    proxy.policies["s1"] = EgressPolicy((Rule.make("other.test", ports=[upstreams.tls_port]),))
    assert proxy.on_loop(lambda: proxy.proxy.recheck("s1")) == 1
    assert closed(dropped)
    assert ask(kept, "/kept").endswith(b"upstream saw: GET /kept HTTP/1.1")


def test_a_session_that_goes_or_a_peer_that_is_no_longer_it_loses_its_tunnels(bounded, upstreams):
    proxy = bounded()
    first = tunnel(proxy.port, "allowed.test", upstreams)
    assert proxy.on_loop(lambda: proxy.proxy.close_session("s1")) == 1
    assert closed(first)
    # serve_tcp: the pod address now belongs to no session (its pod was deleted).
    second = tunnel(proxy.port, "allowed.test", upstreams)
    proxy.who["peer"] = None
    assert proxy.on_loop(proxy.proxy.recheck) == 1
    assert closed(second)


def test_the_bounds_reach_the_client_through_the_in_namespace_relay(
    bounded, upstreams, loop_thread, tmp_path
):
    """The relay holds no bounds of its own: each of its connections is one on the
    session's proxy socket, so the proxy's refusal and its closes come back through it."""
    proxy = bounded(max_connections=1)
    path = str(tmp_path / "s1.sock")
    listener = loop_thread.run(proxy.proxy.serve_unix(path, "s1"))
    relay = loop_thread.run(start_relay("127.0.0.1", 0, path))
    port = relay.sockets[0].getsockname()[1]
    held = tunnel(port, "allowed.test", upstreams)
    sock, status = connect(port, f"allowed.test:{upstreams.tls_port}")
    sock.close()
    assert status.startswith(b"HTTP/1.1 429 Egress refused: this session has 1"), status
    proxy.policies.clear()
    assert proxy.on_loop(lambda: proxy.proxy.recheck("s1")) == 1
    assert closed(held)
    for server in (relay, listener):
        loop_thread.close(server)


class ListingKube:
    """The two lists a cluster proxy reads: SandboxSessions and sandbox pods."""

    def __init__(self, sessions: list[dict], pods: list[dict]) -> None:
        self.sessions, self.pods = sessions, pods

    async def list(self, path: str, label_selector: str | None = None) -> list[dict]:
        return self.sessions if crd.SESSION_PLURAL in path else self.pods


def test_in_a_cluster_a_deleted_session_loses_its_tunnels_at_the_next_read(loop_thread, upstreams):
    """``serve_cluster`` re-checks after each read of the sessions (``on_refresh``): the
    session deleted, its tunnel is closed within the poll interval."""
    meta = {"name": "a", "namespace": "ns"}
    rules = [{"host": "allowed.test", "ports": [upstreams.tls_port]}]
    labels = {crd.LABEL_COMPONENT: crd.COMPONENT_RUNTIME, crd.LABEL_SESSION: "a"}
    kube = ListingKube(
        [{"metadata": meta, "spec": {"egress": {"rules": rules}}}],
        [{"metadata": {"name": "p", "namespace": "ns", "labels": labels},
          "status": {"podIP": "127.0.0.1"}}],
    )  # fmt: skip
    view = ClusterPolicies()
    forbidden = tuple(n for n in DEFAULT_FORBIDDEN if n != LOOPBACK)
    proxy = EgressProxy(view.lookup, resolve=table_resolve, config=ProxyConfig(forbidden))

    async def start():
        await view.refresh(kube, ["ns"])
        poller = asyncio.create_task(view.run(kube, ["ns"], 0.05, proxy.recheck))
        return poller, await proxy.serve_tcp("127.0.0.1", 0, view.identify)

    poller, server = loop_thread.run(start())
    tls = tunnel(server.sockets[0].getsockname()[1], "allowed.test", upstreams)
    kube.sessions = []  # kubectl delete sandboxsession a
    assert closed(tls)
    loop_thread.close(server)
    loop_thread.loop.call_soon_threadsafe(poller.cancel)
