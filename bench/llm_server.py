"""A minimal streaming model for benchmarks (run as its own process), speaking both
providers' protocols on one port: OpenAI-compatible Chat Completions (any path but
``…/messages``) and Anthropic's Messages (``POST …/messages``).

Every reply streams ``TOKENS`` text pieces, each carrying the server's
``time.monotonic_ns()`` at the moment it is written (CLOCK_MONOTONIC is shared by all
processes on the machine), ``INTERVAL`` seconds apart: Chat Completions content chunks
then ``finish_reason`` and ``[DONE]``; or Messages events (``message_start``, a text
block of ``text_delta`` events, ``message_delta`` with ``end_turn``, ``message_stop``).
Receivers compute per-event latency from those stamps.

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
# Anthropic Messages: the events around the text deltas.
_MESSAGE_START = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_bench",'
    b'"type":"message","role":"assistant","content":[],"model":"bench","stop_reason":null,'
    b'"stop_sequence":null,"usage":{"input_tokens":1,"output_tokens":1}}}\n\n'
    b'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
    b'"content_block":{"type":"text","text":""}}\n\n'
)
_MESSAGE_FINISH = (
    b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
    b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn",'
    b'"stop_sequence":null},"usage":{"output_tokens":1}}\n\n'
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
)


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _token() -> bytes:
    stamp = time.monotonic_ns()
    return _chunk(b'data: {"choices":[{"index":0,"delta":{"content":"%d;"}}]}\n\n' % stamp)


def _message_token() -> bytes:
    stamp = time.monotonic_ns()
    return _chunk(
        b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
        b'"delta":{"type":"text_delta","text":"%d;"}}\n\n' % stamp
    )


class _Completion(asyncio.Protocol):
    """One connection: each complete request (headers + content-length body) gets one
    streamed completion; requests on a kept-alive connection are answered in turn."""

    def __init__(self, tokens: int, interval: float) -> None:
        self.tokens, self.interval = tokens, interval
        self.buffer = b""
        self.streaming = False
        self.messages = False  # the request being answered is Anthropic's Messages
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
        request_line, *headers = self.buffer[:end].split(b"\r\n")
        self.messages = request_line.split(b" ")[1].endswith(b"/messages")
        for line in headers:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if len(self.buffer) < end + 4 + length:
            return
        self.buffer = self.buffer[end + 4 + length :]
        self.streaming = True
        self.transport.write(_HEAD + (_chunk(_MESSAGE_START) if self.messages else b""))
        self._send(self.tokens, asyncio.get_running_loop().time())

    def _send(self, left: int, due: float) -> None:
        if self.transport is None:
            return
        if left == 0:
            finish = _MESSAGE_FINISH if self.messages else _FINISH
            self.transport.write(_chunk(finish) + b"0\r\n\r\n")
            self.streaming = False
            self._next_request()
            return
        self.transport.write(_message_token() if self.messages else _token())
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
