"""The in-namespace relay: TCP on loopback → the session's proxy socket, bytes unchanged,
so the proxy's answers (tunnels and refusals alike) reach the sandboxed client as sent."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import socket

import pytest

from sandbox_workspace.egress.policy import DEFAULT_FORBIDDEN, EgressPolicy, Rule
from sandbox_workspace.egress.proxy import EgressProxy, ProxyConfig
from sandbox_workspace.egress.relay import relay

from .conftest import LOOPBACK, table_resolve
from .test_proxy import tls_context


@pytest.fixture
def relayed(loop_thread, upstreams, tmp_path):
    """A relay on 127.0.0.1 in front of session s1's Unix socket; yields the relay port."""
    policies = {"s1": EgressPolicy((Rule.make("allowed.test", ports=[upstreams.tls_port]),))}
    proxy = EgressProxy(
        policies.get,
        resolve=table_resolve,
        config=ProxyConfig(forbidden=tuple(n for n in DEFAULT_FORBIDDEN if n != LOOPBACK)),
    )
    sock = str(tmp_path / "egress.sock")
    server = loop_thread.run(proxy.serve_unix(sock, "s1"))
    ready: asyncio.Future[int] = loop_thread.run(_future())
    task = asyncio.run_coroutine_threadsafe(
        relay("127.0.0.1", 0, sock, lambda port: ready.set_result(port)), loop_thread.loop
    )
    port = loop_thread.run(asyncio.wait_for(_wait(ready), 10))
    yield port
    task.cancel()
    loop_thread.close(server)


async def _future() -> asyncio.Future[int]:
    return asyncio.get_running_loop().create_future()


async def _wait(future: asyncio.Future[int]) -> int:
    return await future


def test_a_tunnel_through_the_relay_reaches_the_allowed_host(relayed, upstreams):
    conn = http.client.HTTPSConnection(
        "127.0.0.1", relayed, timeout=10, context=tls_context(upstreams.ca_file)
    )
    conn.set_tunnel("allowed.test", upstreams.tls_port)
    conn.request("GET", "/via-relay")
    assert conn.getresponse().read() == b"upstream saw: GET /via-relay HTTP/1.1"
    conn.close()


def test_the_proxys_refusal_comes_back_through_the_relay(relayed, upstreams):
    conn = http.client.HTTPSConnection(
        "127.0.0.1", relayed, timeout=10, context=tls_context(upstreams.ca_file)
    )
    conn.set_tunnel("other.test", upstreams.tls_port)
    with pytest.raises(OSError, match=r"403 Egress refused: other\.test is not in"):
        conn.request("GET", "/")
    conn.close()


def test_without_the_proxy_socket_the_relay_just_closes(loop_thread, tmp_path):
    ready: asyncio.Future[int] = loop_thread.run(_future())
    task = asyncio.run_coroutine_threadsafe(
        relay("127.0.0.1", 0, str(tmp_path / "absent.sock"), ready.set_result),
        loop_thread.loop,
    )
    port = loop_thread.run(asyncio.wait_for(_wait(ready), 10))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"CONNECT allowed.test:443 HTTP/1.1\r\n\r\n")
        # Closed with our request unread: an end of stream or a reset, never an answer.
        with contextlib.suppress(ConnectionResetError):
            assert sock.recv(100) == b""
    task.cancel()
