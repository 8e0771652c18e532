"""RuntimeClient never holds more than MAX_ANSWER_BYTES of an execution's answer: a
runtime (broken, or taken over by the code it runs) that sends more is refused with 502,
after reading at most the cap, in the plain and the streamed form."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from sandbox_workspace.runtime import client as client_module
from sandbox_workspace.runtime.client import RuntimeBadAnswer, RuntimeClient
from sandbox_workspace.runtime.schemas import ExecuteRequest

CAP = 1 << 20


class Endless(httpx.AsyncByteStream):
    """An answer that never ends; counts what was taken from it."""

    def __init__(self, line: bytes) -> None:
        self.line = line
        self.sent = 0

    async def __aiter__(self):
        while True:
            self.sent += len(self.line)
            yield self.line


def client(stream: Endless) -> RuntimeClient:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=stream)

    http = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    return RuntimeClient(http, "http://runtime", "token")


@pytest.fixture(autouse=True)
def small_cap(monkeypatch):
    monkeypatch.setattr(client_module, "MAX_ANSWER_BYTES", CAP)


def test_an_oversized_answer_is_refused_after_the_cap():
    stream = Endless(b"x" * 65536)
    with pytest.raises(RuntimeBadAnswer, match="more than"):
        asyncio.run(client(stream).execute_raw("c", ExecuteRequest(language="python", code="1")))
    assert stream.sent <= CAP + 65536


def test_an_oversized_stream_line_is_refused_after_the_cap():
    stream = Endless(b"y" * 65536)  # one line that never ends

    async def drain():
        async for _ in client(stream).execute_stream(
            "c", ExecuteRequest(language="python", code="1")
        ):
            pass

    with pytest.raises(RuntimeBadAnswer, match="more than"):
        asyncio.run(drain())
    assert stream.sent <= CAP + 65536


def test_many_small_stream_lines_pass():
    line = b'{"type": "stdout", "text": "a"}\n'
    taken = []

    async def some():
        async for event in client(Endless(line * 1000)).execute_stream(
            "c", ExecuteRequest(language="python", code="1")
        ):
            taken.append(event)
            if len(taken) == 5000:
                return

    asyncio.run(some())
    assert taken[-1] == {"type": "stdout", "text": "a"}
