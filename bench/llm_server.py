"""A minimal OpenAI-compatible streaming model for benchmarks (run as its own process).

Every completion streams ``TOKENS`` content chunks, each carrying the server's
``time.monotonic_ns()`` at the moment it is written (CLOCK_MONOTONIC is shared by all
processes on the machine), ``INTERVAL`` seconds apart, then ``finish_reason`` and
``[DONE]``. Receivers compute per-event latency from those stamps.

It is measurement apparatus, not product: a bare asyncio protocol speaking just enough
HTTP/1.1 (chunked responses, keep-alive), with one timer callback per token instead of a
task and a web framework — so the model side of a 10,000-events-per-second benchmark
costs a few microseconds per token and leaves the CPU to the API being measured. In
production the model runs on other machines.

    python -m bench.llm_server PORT_FILE TOKENS INTERVAL
"""

from __future__ import annotations

import asyncio
import gc
import sys
import time
from pathlib import Path

from sandbox_workspace.server import bind, write_port_file

_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
)
_FINISH = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _token() -> bytes:
    stamp = time.monotonic_ns()
    return _chunk(b'data: {"choices":[{"index":0,"delta":{"content":"%d;"}}]}\n\n' % stamp)


class _Completion(asyncio.Protocol):
    """One connection: each complete request (headers + content-length body) gets one
    streamed completion; requests on a kept-alive connection are answered in turn."""

    def __init__(self, tokens: int, interval: float) -> None:
        self.tokens, self.interval = tokens, interval
        self.buffer = b""
        self.streaming = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self._next_request()

    def _next_request(self) -> None:
        if self.streaming:
            return
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        length = 0
        for line in self.buffer[:end].split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if len(self.buffer) < end + 4 + length:
            return
        self.buffer = self.buffer[end + 4 + length :]
        self.streaming = True
        self.transport.write(_HEAD)
        self._send(self.tokens, asyncio.get_running_loop().time())

    def _send(self, left: int, due: float) -> None:
        if self.transport is None:
            return
        if left == 0:
            self.transport.write(_chunk(_FINISH) + b"0\r\n\r\n")
            self.streaming = False
            self._next_request()
            return
        self.transport.write(_token())
        due += self.interval
        asyncio.get_running_loop().call_at(due, self._send, left - 1, due)


async def _serve(port_file: Path, tokens: int, interval: float) -> None:
    sock = bind("127.0.0.1", 0)
    write_port_file(port_file, sock.getsockname()[1])
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Completion(tokens, interval), sock=sock)
    async with server:
        await server.serve_forever()


def main() -> None:
    port_file, tokens, interval = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    # Apparatus: its garbage is acyclic (freed at once), so no collector pauses in the
    # timestamps it writes.
    gc.disable()
    try:
        import uvloop

        uvloop.run(_serve(port_file, tokens, interval))
    except ImportError:
        asyncio.run(_serve(port_file, tokens, interval))


if __name__ == "__main__":
    main()
