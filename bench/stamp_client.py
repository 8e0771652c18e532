"""A lean streaming client for the chat benchmark: POSTs one request over a fresh HTTP/1.1
connection and, as each piece of the chunked response arrives, turns the
``monotonic_ns`` stamps inside it into latencies.

Measurement apparatus, like bench/llm_server.py: an asyncio protocol, no HTTP library,
so that receiving 10,000 events per second costs the client little CPU and the figures
describe the API, not the client. The same client measures both the direct baseline and
the path through the API.

Contract: ``post_and_measure`` returns once the response is complete (the terminating
zero-length chunk), with every stamp it saw appended to ``sink`` as milliseconds of
latency and the number of SSE frames carrying ``data:`` counted (the named events of
``/chat`` and ``/agents``, the unnamed ones of the AI SDK and AG-UI streams alike); a
non-200 status, a connection closed early or a response whose last frame does not begin
with ``expected_last`` (within its first 200 bytes) raises ``RuntimeError``.
"""

from __future__ import annotations

import asyncio
import re
import time

# Stamps travel as the text of a delta: "content" (Chat Completions) or "text" (Messages)
# from the model, "delta" from the API.
_STAMPS = re.compile(rb'"(?:content|text|delta)":"((?:\d+;)+)"')


class _Measure(asyncio.Protocol):
    def __init__(self, sink: list[float]) -> None:
        self.sink = sink
        self.raw = b""  # chunked framing not yet decoded
        self.body = b""  # decoded bytes after the last complete SSE frame
        self.head_done = False
        self.status = 0
        self.events = 0
        self.tail = b""
        self.done: asyncio.Future = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        now = time.monotonic_ns()
        if self.done.done():
            return
        self.raw += data
        if not self.head_done:
            end = self.raw.find(b"\r\n\r\n")
            if end < 0:
                return
            self.status = int(self.raw.split(b" ", 2)[1])
            self.raw, self.head_done = self.raw[end + 4 :], True
            if self.status != 200:
                message = f"answered {self.status}: {self.raw[:300]!r}"
                self.done.set_exception(RuntimeError(message))
                return
        finished = self._dechunk()
        frames_end = self.body.rfind(b"\n\n")
        if frames_end >= 0:
            frames, self.body = self.body[: frames_end + 2], self.body[frames_end + 2 :]
            self.events += frames.count(b"data: ")
            for stamps in _STAMPS.findall(frames):
                for stamp in stamps.split(b";")[:-1]:
                    self.sink.append((now - int(stamp)) / 1e6)
            # The last frame's head: a terminal frame can be long (AG-UI's RUN_FINISHED
            # carries the whole answer), its type comes first.
            start = frames.rfind(b"\n\n", 0, len(frames) - 2)
            self.tail = frames[start + 2 if start >= 0 else 0 :][:200]
        if finished and not self.done.done():
            self.done.set_result(None)

    def _dechunk(self) -> bool:
        while True:
            line_end = self.raw.find(b"\r\n")
            if line_end < 0:
                return False
            size = int(self.raw[:line_end].split(b";")[0], 16)
            if size == 0:
                return True
            start = line_end + 2
            if len(self.raw) < start + size + 2:
                return False
            self.body += self.raw[start : start + size]
            self.raw = self.raw[start + size + 2 :]

    def connection_lost(self, exc) -> None:
        if not self.done.done():
            self.done.set_exception(RuntimeError(f"connection closed early ({exc})"))


async def post_and_measure(
    host: str,
    port: int,
    path: str,
    body: bytes,
    sink: list[float],
    *,
    headers: dict[str, str] | None = None,
    expected_last: bytes = b"",
) -> int:
    """Stream one response; returns the number of SSE events it carried."""
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.create_connection(lambda: _Measure(sink), host, port)
    lines = [
        f"POST {path} HTTP/1.1",
        f"host: {host}:{port}",
        "content-type: application/json",
        "accept: text/event-stream",
        f"content-length: {len(body)}",
        *(f"{k}: {v}" for k, v in (headers or {}).items()),
    ]
    try:
        transport.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        await protocol.done
    finally:
        transport.close()
    if expected_last not in protocol.tail:
        raise RuntimeError(f"{path}: the stream did not end with {expected_last!r}")
    return protocol.events
