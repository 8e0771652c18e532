"""A raw HTTP/1.1 server on loopback whose every byte and pause a test scripts (test
support): the model clients' transport tests (tests/unit/test_llm_client.py,
tests/unit/test_anthropic_client.py) use it where a framework would hide what they test —
a status line with ``retry-after``, a stream cut inside a chunk, a pause mid-stream."""

from __future__ import annotations

import asyncio

OK_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


def chunk(payload: bytes) -> bytes:
    """``payload`` as one chunk of a chunked body."""
    return b"%x\r\n%b\r\n" % (len(payload), payload)


LAST_CHUNK = b"0\r\n\r\n"


class Script:
    """Answers the n-th request with ``answers[n]`` (the last one again after that): a list
    of bytes to write or floats to pause for. Keeps each request's head and body."""

    def __init__(self, *answers: list[bytes | float]) -> None:
        self.answers = list(answers)
        self.requests = 0
        self.heads: list[bytes] = []
        self.bodies: list[bytes] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        self.heads.append(head)
        self.bodies.append(await reader.readexactly(length))
        steps = self.answers[min(self.requests, len(self.answers) - 1)]
        self.requests += 1
        try:
            for step in steps:
                if isinstance(step, float):
                    await asyncio.sleep(step)
                else:
                    writer.write(step)
                    await writer.drain()
        finally:
            writer.close()


async def serve(script: Script) -> tuple[asyncio.AbstractServer, str]:
    """Start serving ``script`` on 127.0.0.1; the server and its base URL (``…/v1``)."""
    server = await asyncio.start_server(script.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/v1"
