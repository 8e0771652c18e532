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


class Stalled(httpx.AsyncByteStream):
    """A process stream that sends its start, then nothing, ever (a hung runtime)."""

    async def __aiter__(self):
        yield b'{"type": "start", "pid": 7}\n{"type": "keepalive"}\n'
        await asyncio.Event().wait()


def _process_client(headers: dict[str, str]) -> RuntimeClient:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers=headers, stream=Stalled())

    return RuntimeClient(httpx.AsyncClient(transport=httpx.MockTransport(answer)), "http://r", "t")


def test_a_process_stream_that_promised_keepalives_and_went_silent_is_given_up():
    """Its pooled connection is freed after SILENT_KEEPALIVES intervals, not held for the
    process's life; keepalives never reach the caller."""
    from sandbox_workspace.runtime.client import RuntimeUnavailable
    from sandbox_workspace.runtime.schemas import KEEPALIVE_HEADER

    seen = []

    async def follow(runtime: RuntimeClient):
        async for event in runtime.process_events("c", 7):
            seen.append(event["type"])

    async def main():
        promised = _process_client({KEEPALIVE_HEADER: "0.05"})
        with pytest.raises(RuntimeUnavailable, match=r"sent nothing for 0\.2 s"):
            await asyncio.wait_for(follow(promised), 5)
        assert seen == ["start"]
        # A runtime that promises nothing (an older one) keeps the old contract: no
        # deadline — a quiet process may be quiet for long.
        quiet = asyncio.create_task(follow(_process_client({})))
        await asyncio.sleep(0.5)
        assert not quiet.done()
        quiet.cancel()

    asyncio.run(main())
