"""Loopback fixtures for the egress proxy: a TLS upstream with a certificate for
``allowed.test`` (and ``other.test``), a plain HTTP upstream, and the proxy itself running
on its own event loop in a thread, so tests drive it with ordinary blocking clients.

Names are resolved by a table the test owns (``RESOLVE``), never by the machine's DNS;
loopback is taken off the forbidden list so the upstreams on 127.0.0.1 are reachable."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import re
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from sandbox_workspace.egress.policy import DEFAULT_FORBIDDEN, EgressPolicy
from sandbox_workspace.egress.proxy import EgressProxy, ProxyConfig

LOOPBACK = ipaddress.ip_network("127.0.0.0/8")
RESOLVE = {
    "allowed.test": ["127.0.0.1"],
    "other.test": ["127.0.0.1"],
    "plain.test": ["127.0.0.1"],
    "rebind.test": ["169.254.169.254"],
    "mixed.test": ["127.0.0.1", "10.0.0.7"],
    "v6.test": ["::ffff:169.254.169.254"],
}


def self_signed(directory: Path, names: list[str]) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@dataclass
class Loop:
    """An event loop in a daemon thread; ``run(coro)`` waits for its result."""

    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self, server: asyncio.Server) -> None:
        """Close ``server`` on its own loop (asyncio objects are not thread-safe)."""

        async def close() -> None:
            server.close()

        self.run(close())

    def stop(self) -> None:
        async def cancel_others() -> None:
            me = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not me]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self.run(cancel_others())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@dataclass
class Upstreams:
    tls_port: int
    http_port: int
    ca_file: Path
    received: list[bytes]  # every request head an upstream got, in order


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, received) -> None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
        writer.close()
        return
    received.append(head)
    length = re.search(rb"(?im)^content-length: *(\d+)", head)
    if length:
        # Read the body before closing: a close with unread bytes is a reset, which can
        # overtake the answer on its way to the proxy.
        await reader.readexactly(int(length.group(1)))
    body = b"upstream saw: " + head.split(b"\r\n")[0]
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
    )
    await writer.drain()
    writer.close()


@pytest.fixture(scope="session")
def loop_thread() -> Iterator[Loop]:
    loop = Loop()
    yield loop
    loop.stop()


@pytest.fixture(scope="session")
def upstreams(loop_thread, tmp_path_factory) -> Iterator[Upstreams]:
    cert, key = self_signed(tmp_path_factory.mktemp("tls"), ["allowed.test", "other.test"])
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)
    received: list[bytes] = []

    async def start():
        def handler(r, w):
            return _answer(r, w, received)

        tls = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=server_ctx)
        plain = await asyncio.start_server(handler, "127.0.0.1", 0)
        return tls, plain

    tls, plain = loop_thread.run(start())
    yield Upstreams(
        tls.sockets[0].getsockname()[1], plain.sockets[0].getsockname()[1], cert, received
    )
    for server in (tls, plain):
        loop_thread.close(server)


async def table_resolve(host: str, port: int):
    if host not in RESOLVE:
        raise OSError(f"{host}: no such name")
    return [ipaddress.ip_address(a) for a in RESOLVE[host]]


@dataclass
class RunningProxy:
    port: int
    policies: dict[str, EgressPolicy]
    proxy: EgressProxy


@pytest.fixture
def egress_proxy(loop_thread) -> Iterator[RunningProxy]:
    """A proxy on 127.0.0.1 whose every client is session ``s1`` (the TCP listener's
    identify function; the Unix-socket listener is tested on its own)."""
    policies: dict[str, EgressPolicy] = {}
    config = ProxyConfig(
        forbidden=tuple(n for n in DEFAULT_FORBIDDEN if n != LOOPBACK), client_timeout=5
    )
    proxy = EgressProxy(policies.get, resolve=table_resolve, config=config)
    server = loop_thread.run(proxy.serve_tcp("127.0.0.1", 0, lambda peer: "s1"))
    yield RunningProxy(server.sockets[0].getsockname()[1], policies, proxy)
    loop_thread.close(server)
