"""Secrets injected on the way out (issue 40 item 3), on loopback: a real proxy with a
per-install CA, a real TLS upstream that echoes what it received (its own test CA, which
the proxy verifies), and real clients that trust only what a sandbox would be given.

What is swapped: only a header named by the binding whose whole value is the bound
placeholder (``Authorization: Bearer <placeholder>``), and only on requests to the bound
host. The value never comes back to the sandbox side in the echo (masked with ``*``)."""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandbox_workspace.egress.ca import InterceptCA, trust_env
from sandbox_workspace.egress.policy import (
    DEFAULT_FORBIDDEN,
    EgressPolicy,
    PolicyError,
    Rule,
    SecretBinding,
)
from sandbox_workspace.egress.proxy import EgressProxy, ProxyConfig
from sandbox_workspace.egress.secrets import MemorySecretSource, Scrubber

from .conftest import LOOPBACK, Loop, self_signed, table_resolve

VALUE = "sk-live-0123456789abcdef-REAL"
KEY_VALUE = "key-value-for-x-api-0001"


@dataclass
class Echo:
    port: int
    plain_port: int
    cert: str
    received: list[bytes]  # each request (head and body) an upstream got


async def _echo(reader, writer, received, port_box) -> None:
    """Answers with the whole request it got; ``/redirect`` sends the client elsewhere."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.lower().split(b"\r\n")
        length = sum(int(x[15:]) for x in lines if x.startswith(b"content-length:"))
        request = head + (await reader.readexactly(length) if length else b"")
    except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
        writer.close()
        return
    received.append(request)
    if request.split(b" ")[1] == b"/redirect":
        status = b"302 Found\r\nLocation: https://other.test:%d/landing" % port_box[0]
    else:
        status = b"200 OK"
    writer.write(
        b"HTTP/1.1 %s\r\nX-Echo: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
        % (status, request.split(b"\r\n")[2][:200], len(request), request)
    )
    await writer.drain()
    writer.close()


@pytest.fixture(scope="module")
def echo(loop_thread: Loop, tmp_path_factory) -> Iterator[Echo]:
    cert, key = self_signed(tmp_path_factory.mktemp("echo"), ["allowed.test", "other.test"])
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    received: list[bytes] = []
    port_box = [0]

    async def start():
        def handler(r, w):
            return _echo(r, w, received, port_box)

        return (
            await asyncio.start_server(handler, "127.0.0.1", 0, ssl=ctx),
            await asyncio.start_server(handler, "127.0.0.1", 0),
        )

    tls, plain = loop_thread.run(start())
    port_box[0] = tls.sockets[0].getsockname()[1]
    yield Echo(port_box[0], plain.sockets[0].getsockname()[1], str(cert), received)
    for server in (tls, plain):
        loop_thread.close(server)


@dataclass
class Setup:
    port: int
    ca: InterceptCA
    bundle: str  # the trust bundle a sandbox is given
    binding: SecretBinding
    key_binding: SecretBinding
    echo: Echo


@pytest.fixture(scope="module")
def ca_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("egress-ca") / "ca"


def start_proxy(
    loop_thread: Loop,
    echo: Echo,
    ca: InterceptCA | None,
    upstream_ca: str,
    policy,
    session: str = "s1",
):
    config = ProxyConfig(
        forbidden=tuple(n for n in DEFAULT_FORBIDDEN if n != LOOPBACK),
        client_timeout=5,
        upstream_ca=upstream_ca,
    )
    source = MemorySecretSource({"s1": {"api": VALUE, "xkey": KEY_VALUE}, "s2": {}})
    proxy = EgressProxy(policy, resolve=table_resolve, config=config, ca=ca, secrets=source)
    return loop_thread.run(proxy.serve_tcp("127.0.0.1", 0, lambda peer: session))


@pytest.fixture(scope="module")
def setup(loop_thread: Loop, echo: Echo, ca_dir, tmp_path_factory) -> Iterator[Setup]:
    ca = InterceptCA.load_or_create(ca_dir)
    bundle = ca.write_trust_bundle(tmp_path_factory.mktemp("sandbox") / "ca-bundle.pem")
    binding = SecretBinding.make("api", "allowed.test")
    key_binding = SecretBinding.make("xkey", "allowed.test", header="X-Api-Key")
    policy = EgressPolicy(
        (
            Rule.make(
                "allowed.test", ports=[echo.port, echo.plain_port], schemes=["https", "http"]
            ),
            Rule.make("other.test", ports=[echo.port]),
        ),
        (binding, key_binding),
    )
    server = start_proxy(loop_thread, echo, ca, echo.cert, lambda s: policy)
    yield Setup(server.sockets[0].getsockname()[1], ca, str(bundle), binding, key_binding, echo)
    loop_thread.close(server)


def connect(proxy_port: int, host: str, port: int) -> tuple[socket.socket, bytes]:
    sock = socket.create_connection(("127.0.0.1", proxy_port), timeout=10)
    sock.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    answer = b""
    while b"\r\n\r\n" not in answer and (chunk := sock.recv(4096)):
        answer += chunk
    return sock, answer


def exchange(proxy_port: int, host: str, port: int, request: bytes, cafile: str) -> bytes:
    """Everything the sandbox side receives (the CONNECT answer, then the decrypted
    stream) for one request sent through the proxy with TLS trusting ``cafile``."""
    sock, answer = connect(proxy_port, host, port)
    if not answer.startswith(b"HTTP/1.1 200"):
        sock.close()
        return answer
    ctx = ssl.create_default_context(cafile=cafile)
    with ctx.wrap_socket(sock, server_hostname=host) as tls:
        tls.sendall(request)
        got = b""
        while chunk := tls.recv(65536):
            got += chunk
    return answer + got


def to_bound_host(setup: Setup, *headers: str, path: str = "/call", body: bytes = b""):
    """(what the sandbox side got, what the upstream got) for one request to the host
    with the secrets bound."""
    seen = len(setup.echo.received)
    got = exchange(
        setup.port,
        "allowed.test",
        setup.echo.port,
        request("allowed.test", *headers, path=path, body=body),
        setup.bundle,
    )
    return got, setup.echo.received[seen:]


def request(host: str, *headers: str, path: str = "/call", body: bytes = b"") -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", *headers]
    if body:
        lines.append(f"Content-Length: {len(body)}")
    return "\r\n".join(lines).encode() + b"\r\n\r\n" + body


def test_bound_host_gets_the_value_and_the_sandbox_never_sees_it(setup):
    got, upstream = to_bound_host(setup, f"Authorization: Bearer {setup.binding.placeholder}")
    assert len(upstream) == 1 and f"authorization: Bearer {VALUE}".encode() in upstream[0]
    assert setup.binding.placeholder.encode() not in upstream[0]
    # The upstream echoed the value in a header and in the body: masked on the way back.
    assert b"200 OK" in got and VALUE.encode() not in got
    assert got.count(b"*" * len(VALUE)) == 2


def test_a_header_binding_and_case_of_the_bearer_word(setup):
    _, (upstream,) = to_bound_host(
        setup,
        f"authorization: bearer {setup.binding.placeholder}",
        f"X-API-Key: {setup.key_binding.placeholder}",
    )
    assert f"authorization: bearer {VALUE}".encode() in upstream
    assert f"x-api-key: {KEY_VALUE}".encode() in upstream


def test_placeholder_anywhere_else_goes_out_unchanged(setup):
    """Only the bound header carries the value: not the URL, the body, another header, nor
    the bound header with other text around the placeholder."""
    p = setup.binding.placeholder
    _, (upstream,) = to_bound_host(
        setup,
        f"X-Other: Bearer {p}",
        f"Authorization: Basic {p}",
        f"Authorization: Bearer {p} trailing",
        f"Cookie: t={p}",
        path=f"/call?token={p}",
        body=f'{{"key": "{p}"}}'.encode(),
    )
    assert VALUE.encode() not in upstream and upstream.count(p.encode()) == 6


def test_another_host_gets_the_placeholder_through_an_untouched_tunnel(setup):
    """other.test has no secret: the proxy does not terminate TLS (the client must trust
    the upstream's own certificate, not the CA) and the placeholder goes as written."""
    seen = len(setup.echo.received)
    got = exchange(
        setup.port,
        "other.test",
        setup.echo.port,
        request("other.test", f"Authorization: Bearer {setup.binding.placeholder}"),
        setup.echo.cert,
    )
    (upstream,) = setup.echo.received[seen:]
    assert setup.binding.placeholder.encode() in upstream and VALUE.encode() not in upstream
    assert b"200 OK" in got
    with pytest.raises(ssl.SSLCertVerificationError):
        exchange(setup.port, "other.test", setup.echo.port, request("other.test"), setup.bundle)


def test_plain_http_never_carries_the_value(setup):
    seen = len(setup.echo.received)
    sock = socket.create_connection(("127.0.0.1", setup.port), timeout=10)
    with sock:
        sock.sendall(
            f"GET http://allowed.test:{setup.echo.plain_port}/ HTTP/1.1\r\n"
            f"Authorization: Bearer {setup.binding.placeholder}\r\n\r\n".encode()
        )
        while sock.recv(65536):
            pass
    (upstream,) = setup.echo.received[seen:]
    assert setup.binding.placeholder.encode() in upstream and VALUE.encode() not in upstream


def test_a_redirect_is_relayed_not_followed(setup):
    got, upstream = to_bound_host(
        setup, f"Authorization: Bearer {setup.binding.placeholder}", path="/redirect"
    )
    assert b"302 Found" in got and b"Location: https://other.test:" in got
    assert len(upstream) == 1  # the proxy went nowhere else


def test_the_upstream_certificate_is_verified(loop_thread, echo, setup, tmp_path):
    """A proxy trusting another CA for upstreams refuses the CONNECT: nothing is sent."""
    other_ca, _ = self_signed(tmp_path, ["allowed.test"])
    policy = EgressPolicy((Rule.make("allowed.test", ports=[echo.port]),), (setup.binding,))
    server = start_proxy(loop_thread, echo, setup.ca, str(other_ca), lambda s: policy)
    try:
        seen = len(echo.received)
        sock, answer = connect(server.sockets[0].getsockname()[1], "allowed.test", echo.port)
        sock.close()
        assert answer.startswith(b"HTTP/1.1 502 Egress refused: the certificate of allowed.test")
        assert len(echo.received) == seen
    finally:
        loop_thread.close(server)


def test_another_sni_inside_an_intercepted_tunnel_is_refused(setup):
    """The leaf's sni_callback refuses the handshake (asyncio closes without flushing the
    alert, so the client sees EOF): no request is read, nothing reaches the upstream."""
    seen = len(setup.echo.received)
    sock, answer = connect(setup.port, "allowed.test", setup.echo.port)
    assert answer.startswith(b"HTTP/1.1 200")
    ctx = ssl.create_default_context(cafile=setup.bundle)
    ctx.check_hostname = False
    with pytest.raises(ssl.SSLError):
        ctx.wrap_socket(sock, server_hostname="other.test")
    sock.close()
    assert len(setup.echo.received) == seen


@pytest.mark.parametrize(
    ("session", "binding"),
    [("s1", "absent"), ("s2", "api")],  # s2 binds "api" too, but s1's value is not its own
)
def test_a_missing_value_refuses_instead_of_sending_the_placeholder(
    loop_thread, echo, setup, session, binding
):
    policy = EgressPolicy(
        (Rule.make("allowed.test", ports=[echo.port]),),
        (SecretBinding.make(binding, "allowed.test"),),
    )
    server = start_proxy(loop_thread, echo, setup.ca, echo.cert, lambda s: policy, session)
    try:
        seen = len(echo.received)
        got = exchange(
            server.sockets[0].getsockname()[1],
            "allowed.test",
            echo.port,
            request("allowed.test", f"Authorization: Bearer {policy.secrets[0].placeholder}"),
            setup.bundle,
        )
        assert f"502 Egress refused: secret '{binding}' has no value".encode() in got
        assert len(echo.received) == seen
    finally:
        loop_thread.close(server)


@pytest.mark.parametrize(
    "head",
    [
        b"POST /x HTTP/1.1\r\nHost: allowed.test\nHost: evil.test\r\n\r\n",
        b"POST /x HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
        b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"GET http://evil.test/ HTTP/1.1\r\n\r\n",
        b"CONNECT /evil.test:443 HTTP/1.1\r\n\r\n",
        b"GET /x HTTP/1.1\r\n X-Folded: yes\r\n\r\n",
    ],
)
def test_hostile_heads_inside_an_intercepted_tunnel_are_refused(setup, head):
    seen = len(setup.echo.received)
    got = exchange(setup.port, "allowed.test", setup.echo.port, head, setup.bundle)
    assert b"Egress refused" in got.split(b"\r\n\r\n", 1)[1]
    assert len(setup.echo.received) == seen


def test_the_ca_key_is_not_in_what_the_sandbox_gets(setup, ca_dir):
    bundle = Path(setup.bundle).read_bytes()
    assert setup.ca.cert_pem in bundle and b"PRIVATE KEY" not in bundle
    assert set(trust_env(setup.bundle).values()) == {setup.bundle}
    key_file = ca_dir / "ca-key.pem"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(ca_dir.stat().st_mode) == 0o700
    # Generated once: loading again gives the same CA.
    assert InterceptCA.load_or_create(ca_dir).cert_pem == setup.ca.cert_pem


def test_placeholders_are_random_and_bindings_validated():
    a, b = SecretBinding.make("api", "x.test"), SecretBinding.make("api", "x.test")
    assert a.placeholder != b.placeholder and a.placeholder.startswith("sbw-secret-api-")
    for bad in (
        lambda: SecretBinding.make("API key", "x.test"),
        lambda: SecretBinding.make("api", "*.x.test"),
        lambda: SecretBinding.make("api", "10.0.0.1"),
        lambda: SecretBinding.make("api", "x.test", header="Host"),
        lambda: SecretBinding.make("api", "x.test", placeholder="short"),
    ):
        with pytest.raises(PolicyError):
            bad()


def test_scrubber_masks_a_value_split_across_pieces():
    scrub = Scrubber([b"secret-value"])
    pieces = [b"aa secr", b"et-val", b"ue bb secret-", b"value"]
    out = b"".join(scrub.feed(p) for p in pieces) + scrub.flush()
    assert out == b"aa ************ bb ************"


def test_a_client_configured_only_by_trust_env_calls_the_bound_host(setup):
    """A real client in its own process, given only what a sandbox gets (the proxy
    address, the placeholder and trust_env's variables), calls the bound host."""
    code = (
        "import os, urllib.request as u\n"
        f"r = u.Request('https://allowed.test:{setup.echo.port}/sdk', headers="
        "{'Authorization': 'Bearer ' + os.environ['API_KEY']})\n"
        "print(u.urlopen(r, timeout=10).read().decode())\n"
    )
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HTTPS_PROXY": f"http://127.0.0.1:{setup.port}",
        "API_KEY": setup.binding.placeholder,
        **trust_env(setup.bundle),
    }
    seen = len(setup.echo.received)
    out = subprocess.run(
        [sys.executable, "-I", "-c", code], env=env, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    (upstream,) = setup.echo.received[seen:]
    assert f"Bearer {VALUE}".encode() in upstream
    assert "GET /sdk" in out.stdout and VALUE not in out.stdout and "*" * len(VALUE) in out.stdout


def test_a_bound_host_on_a_proxy_without_a_ca_is_refused_not_tunnelled(loop_thread, echo, setup):
    """No CA, no injection: the CONNECT is refused with the reason rather than tunnelled
    with the placeholder (which would fail later at the host, with no word why)."""
    policy = EgressPolicy((Rule.make("allowed.test", ports=[echo.port]),), (setup.binding,))
    server = start_proxy(loop_thread, echo, None, echo.cert, lambda s: policy)
    try:
        sock, answer = connect(server.sockets[0].getsockname()[1], "allowed.test", echo.port)
        sock.close()
        assert answer.startswith(b"HTTP/1.1 503 Egress refused: allowed.test has a secret")
    finally:
        loop_thread.close(server)
