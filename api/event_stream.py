"""The response of every run's event stream: batches of SSE frames, written as they come.

Contract: ``EventStream(batches, headers)`` answers 200 ``text/event-stream`` and writes
each batch from ``batches`` (an async iterator of ``list[bytes]``, e.g. ``Run.follow``)
as one body message — its frames joined, or a ``: keep-alive`` comment for an empty
batch — then ends the body when the iterator ends. With ``transform`` (another
protocol's view of the run, ``run_events.translation``) each batch is first passed
through it, which answers the frames to write and whether that was the last batch;
``tail`` is written after the last one. When the stream ends or the client goes away
the iterator is closed (its ``finally`` runs) and the response returns.

Why not Starlette's ``StreamingResponse``: on the one path that carries every token of
every run (10,000 events/s in bench/chat.py), each chunk there passes through an anyio
task wrapper, a partial and the route's own generator that joins the batch; here a
batch goes from the run to ``send`` in one frame. The listener for the client's
disconnect is one plain task beside it, as Starlette's task group had. A translation is
a plain function called here, not an async generator around the run's: one layer less
per event, and the run's iterator is closed here when a segment ends (a generator
around it left it to the garbage collector).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from .sse import KEEPALIVE


class EventStream(Response):
    media_type = "text/event-stream"
    # Called once the stream has ended, however it ended (a follower slot's release).
    on_close: Callable[[], None] | None = None

    def __init__(
        self,
        batches: AsyncIterator[list[bytes]],
        headers: Mapping[str, str] | None = None,
        status_code: int = 200,  # FastAPI's OpenAPI reads the default status from here
        *,
        transform: Callable[[list[bytes]], tuple[list[bytes], bool]] | None = None,
        tail: bytes = b"",
    ) -> None:
        self.batches = batches
        self.transform, self.tail = transform, tail
        self.status_code = status_code
        self.background = None
        self.init_headers(headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        streaming = asyncio.ensure_future(self._stream(send))
        listening = asyncio.ensure_future(_disconnect(receive))
        try:
            await asyncio.wait((streaming, listening), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (streaming, listening):
                task.cancel()
            # The stream's ``finally`` (closing the run's iterator) has run once these end.
            await asyncio.wait((streaming, listening))
            if self.on_close is not None:
                self.on_close()
        if not streaming.cancelled() and streaming.exception() is not None:
            raise streaming.exception()

    async def _stream(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        batches, transform = self.batches, self.transform
        last = False
        try:
            async for batch in batches:
                if transform is not None:
                    batch, last = transform(batch)
                body = b"".join(batch) if batch else KEEPALIVE
                await send({"type": "http.response.body", "body": body, "more_body": True})
                if last:
                    break
            if self.tail:
                await send({"type": "http.response.body", "body": self.tail, "more_body": True})
        finally:  # a failed send leaves the iterator suspended: close it now, not at GC
            aclose = getattr(batches, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
