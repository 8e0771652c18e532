"""A raw HTTP/1.1 server on loopback whose every byte and pause a test scripts (test
support): the model clients' transport tests (tests/unit/test_llm_client.py,
tests/unit/test_anthropic_client.py) use it where a framework would hide what they test —
a status line with ``retry-after``, a stream cut inside a chunk, a pause mid-stream."""

from __future__ import annotations

import asyncio
import time

import pytest

from sandbox_workspace.api.chat.llm import LlmError

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


def stream_until_error(script: Script, make_client, messages: list[dict]):
    """Serve ``script``, stream from ``make_client(url)`` until it raises ``LlmError``:
    the texts yielded before, the error, and the seconds it took."""

    async def go():
        server, url = await serve(script)
        async with server:
            client = make_client(url)
            texts: list[str] = []
            started = time.monotonic()
            with pytest.raises(LlmError) as caught:
                async for item in client.stream(messages, []):
                    texts.append(item)
            await client.aclose()
            return texts, caught.value, time.monotonic() - started

    return asyncio.run(go())


async def collect(client, messages: list[dict], tools: list[dict] | None = None):
    """Stream one reply from ``client`` (then close it): the texts and the completion."""
    texts: list[str] = []
    try:
        async for item in client.stream(messages, tools or []):
            if isinstance(item, str):
                texts.append(item)
            else:
                return texts, item
    finally:
        await client.aclose()
    raise AssertionError("no completion")
