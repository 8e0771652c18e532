"""The event-stream response (api/event_stream.py) spoken to over ASGI: what it writes,
and that the run's iterator is closed however the stream ends."""

from __future__ import annotations

import asyncio

import pytest

from sandbox_workspace.api.event_stream import EventStream
from sandbox_workspace.api.sse import KEEPALIVE


class Source:
    """Batches to stream; then waits forever. Records whether it was closed."""

    def __init__(self, *batches: list[bytes]) -> None:
        self.batches = batches
        self.closed = False

    async def __call__(self):
        try:
            for batch in self.batches:
                yield batch
            await asyncio.Event().wait()
        finally:
            self.closed = True


async def _call(response: EventStream, disconnect: asyncio.Event, fail_on: int = -1):
    sent: list[dict] = []

    async def receive():
        await disconnect.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        if len(sent) == fail_on:
            raise OSError("connection reset")
        sent.append(message)
        if len(sent) == 4:  # start + three batches: the client goes away
            disconnect.set()

    await asyncio.wait_for(response({"type": "http"}, receive, send), 5)
    return sent


def test_batches_go_out_joined_and_an_empty_batch_is_a_keepalive():
    source = Source([b"a", b"b"], [], [b"c"])

    async def go():
        return await _call(EventStream(source(), {"X-Run-Id": "r"}), asyncio.Event())

    sent = asyncio.run(go())
    assert sent[0]["status"] == 200
    assert (b"content-type", b"text/event-stream; charset=utf-8") in sent[0]["headers"]
    assert (b"x-run-id", b"r") in sent[0]["headers"]
    assert [m["body"] for m in sent[1:]] == [b"ab", KEEPALIVE, b"c"]
    assert source.closed, "the client went away: the run's iterator must be closed"


def test_a_finished_iterator_ends_the_body():
    async def three():
        for i in range(3):
            yield [b"%d" % i]

    async def go():
        disconnect = asyncio.Event()
        sent = await _call(EventStream(three()), disconnect)
        return sent

    sent = asyncio.run(go())
    assert [m["body"] for m in sent[1:]] == [b"0", b"1", b"2", b""]
    assert sent[-1]["more_body"] is False


def test_a_failed_write_closes_the_iterator_and_is_raised():
    source = Source([b"a"], [b"b"])

    async def go():
        await _call(EventStream(source()), asyncio.Event(), fail_on=2)

    with pytest.raises(OSError):
        asyncio.run(go())
    assert source.closed


def test_a_transform_rewrites_each_batch_and_its_last_batch_ends_the_body():
    """A translated stream: each batch through ``transform``, which says when its segment
    ended — then ``tail``, the end of the body, and the run's iterator closed although
    it would go on."""
    source = Source([b"a", b"b"], [b"c"], [b"end"], [b"never"])

    def transform(batch: list[bytes]) -> tuple[list[bytes], bool]:
        return [frame.upper() for frame in batch], b"end" in batch

    async def go():
        response = EventStream(source(), transform=transform, tail=b"[DONE]")
        return await _call(response, asyncio.Event())

    sent = asyncio.run(go())
    assert [m["body"] for m in sent[1:]] == [b"AB", b"C", b"END", b"[DONE]", b""]
    assert sent[-1]["more_body"] is False
    assert source.closed
