"""relay_streams (splice.py), the zero-copy path of a tunnel and of the in-namespace relay:
real loopback TCP connections, the relayed pair wrapped in asyncio streams as the proxy
and the relay have them; the test holds the two outer ends as plain sockets."""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from sandbox_workspace.egress import splice


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
    for sock in (client, server):
        sock.setblocking(False)
    return client, server


@dataclass
class Relayed:
    client: socket.socket  # the sandbox's end
    upstream: socket.socket  # the far end
    task: asyncio.Task
    writers: tuple[asyncio.StreamWriter, asyncio.StreamWriter]

    async def recv_exactly(self, sock: socket.socket, n: int) -> bytes:
        loop, data = asyncio.get_running_loop(), bytearray()
        while len(data) < n:
            chunk = await asyncio.wait_for(loop.sock_recv(sock, n - len(data)), 10)
            assert chunk, f"closed after {len(data)} of {n} bytes"
            data += chunk
        return bytes(data)

    async def recv_eof(self, sock: socket.socket) -> None:
        chunk = await asyncio.wait_for(asyncio.get_running_loop().sock_recv(sock, 1), 10)
        assert chunk == b""


@pytest.fixture
def splice_calls(monkeypatch) -> list[int]:
    """One entry per os.splice call, those that would block included (proves the splice
    path ran, and how often)."""
    calls: list[int] = []
    real = os.splice

    def counting(*args, **kwargs):
        calls.append(0)
        calls[-1] = real(*args, **kwargs)
        return calls[-1]

    monkeypatch.setattr(os, "splice", counting)
    return calls


async def _relayed(before: bytes = b"") -> Relayed:
    """client ↔ (reader, writer) ⇄ relay_streams ⇄ (reader, writer) ↔ upstream. ``before``
    is sent by the client and partly read by its reader before the relay starts, as the
    proxy reads a CONNECT head and leaves whatever followed in the buffer."""
    client, a = tcp_pair()
    b, upstream = tcp_pair()
    a_reader, a_writer = await asyncio.open_connection(sock=a)
    b_reader, b_writer = await asyncio.open_connection(sock=b)
    if before:
        await asyncio.get_running_loop().sock_sendall(client, before)
        # One small send on loopback lands in one read: the rest stays in the buffer.
        assert await a_reader.readexactly(1) == before[:1]
    task = asyncio.ensure_future(splice.relay_streams(a_reader, a_writer, b_reader, b_writer))
    return Relayed(client, upstream, task, (a_writer, b_writer))


@pytest.fixture
async def relayed() -> AsyncIterator[Relayed]:
    r = await _relayed()
    yield r
    r.task.cancel()
    await asyncio.gather(r.task, return_exceptions=True)
    for w in r.writers:
        w.close()
    r.client.close()
    r.upstream.close()


async def test_bytes_buffered_before_the_relay_come_first_then_the_rest(splice_calls):
    r = await _relayed(before=b"HELLO-and-early-data")
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(r.client, b"|later")
    assert await r.recv_exactly(r.upstream, 25) == b"ELLO-and-early-data|later"
    assert splice_calls, "the splice path did not run"
    r.task.cancel()
    await asyncio.gather(r.task, return_exceptions=True)


async def test_half_close_leaves_the_other_direction_open(relayed, splice_calls):
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(relayed.client, b"request")
    relayed.client.shutdown(socket.SHUT_WR)
    assert await relayed.recv_exactly(relayed.upstream, 7) == b"request"
    await relayed.recv_eof(relayed.upstream)
    # The answer still flows after the client's half-close.
    await loop.sock_sendall(relayed.upstream, b"answer" * 10_000)
    relayed.upstream.shutdown(socket.SHUT_WR)
    assert await relayed.recv_exactly(relayed.client, 60_000) == b"answer" * 10_000
    await relayed.recv_eof(relayed.client)
    await asyncio.wait_for(relayed.task, 10)
    assert splice_calls


async def test_a_large_transfer_arrives_intact_both_ways(relayed):
    loop, data = asyncio.get_running_loop(), os.urandom(8 << 20)
    sent = asyncio.ensure_future(loop.sock_sendall(relayed.upstream, data))
    got = await relayed.recv_exactly(relayed.client, len(data))
    await sent
    assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
    await loop.sock_sendall(relayed.client, data[: 1 << 20])
    assert await relayed.recv_exactly(relayed.upstream, 1 << 20) == data[: 1 << 20]


async def test_a_peer_that_stops_reading_bounds_memory_and_spins_nothing(relayed, splice_calls):
    """The upstream reads nothing: the client's sends stall once the kernel buffers and
    one pipe are full; Python holds none of it and the pump waits, not polls."""
    block = os.urandom(1 << 20)
    sent, sent_hash = 0, hashlib.sha256()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            n = relayed.client.send(block)
            sent += n
            sent_hash.update(block[:n])
        except BlockingIOError:
            # Stalled: give the relay a moment to move what it can, and try again.
            calls = len(splice_calls)
            await asyncio.sleep(0.2)
            if len(splice_calls) == calls:
                break
    # Kernel socket buffers of the two hops (loopback autotuning: a few MiB each) plus
    # one pipe; without backpressure the 20 s would have pushed gigabytes.
    assert sent < 48 << 20
    assert all(w.transport.get_write_buffer_size() == 0 for w in relayed.writers)
    calls = len(splice_calls)
    await asyncio.sleep(0.3)  # measuring that nothing happens takes a moment
    assert len(splice_calls) == calls, "the pump kept calling splice on a stalled peer"
    # Once the upstream reads, every byte arrives, in order.
    got = await relayed.recv_exactly(relayed.upstream, sent)
    assert hashlib.sha256(got).digest() == sent_hash.digest()


async def test_a_client_dribbling_bytes_gets_each_through_without_a_busy_loop(
    relayed, splice_calls
):
    """Slowloris through the tunnel: each byte arrives on its own (no batching delay) and
    the pump sleeps between them (a handful of splice calls per byte)."""
    loop = asyncio.get_running_loop()
    for i in range(20):
        await loop.sock_sendall(relayed.client, bytes([i]))
        assert await relayed.recv_exactly(relayed.upstream, 1) == bytes([i])
        await asyncio.sleep(0.01)
    assert len(splice_calls) <= 20 * 4


async def test_a_reset_stops_both_directions(relayed):
    relayed.upstream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
    relayed.upstream.close()
    await asyncio.wait_for(relayed.task, 10)  # the client side sent nothing, yet it ends


async def test_cancelling_the_relay_leaves_no_descriptor_behind():
    before = len(os.listdir("/proc/self/fd"))
    r = await _relayed()
    await asyncio.get_running_loop().sock_sendall(r.client, b"x")
    assert await r.recv_exactly(r.upstream, 1) == b"x"
    r.task.cancel()
    await asyncio.gather(r.task, return_exceptions=True)
    for w in r.writers:
        w.close()
        await w.wait_closed()
    r.client.close()
    r.upstream.close()
    assert len(os.listdir("/proc/self/fd")) == before


async def test_without_splice_it_copies_with_the_same_half_close(monkeypatch):
    monkeypatch.delattr(os, "splice")
    r = await _relayed(before=b"ab")
    loop = asyncio.get_running_loop()
    r.client.shutdown(socket.SHUT_WR)
    assert await r.recv_exactly(r.upstream, 1) == b"b"
    await r.recv_eof(r.upstream)
    await loop.sock_sendall(r.upstream, b"answer")
    r.upstream.close()
    assert await r.recv_exactly(r.client, 6) == b"answer"
    await asyncio.wait_for(r.task, 10)
    r.client.close()


async def test_out_of_descriptors_it_copies_and_closes_what_it_made(monkeypatch):
    """A flood of tunnels that exhausts the proxy's descriptors degrades to copying."""

    def no_pipe(flags: int) -> tuple[int, int]:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(os, "pipe2", no_pipe)
    before = len(os.listdir("/proc/self/fd"))
    r = await _relayed()
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(r.client, b"ping")
    assert await r.recv_exactly(r.upstream, 4) == b"ping"
    r.client.close()
    await r.recv_eof(r.upstream)
    r.upstream.close()  # the other direction ends too
    await asyncio.wait_for(r.task, 10)
    for w in r.writers:
        w.close()
        await w.wait_closed()
    assert len(os.listdir("/proc/self/fd")) == before
