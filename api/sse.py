"""Server-Sent Events framing: ``id``, ``event`` and a one-line JSON ``data`` per event.

Contract: ``encode_event`` never emits a raw newline inside ``data`` (JSON escapes them),
so every event is exactly one frame; ``with_keepalive`` interleaves ``: keep-alive``
comments whenever the source is silent for ``interval`` seconds, so proxies and browsers
keep long, quiet streams open.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

KEEPALIVE = b": keep-alive\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def encode_event(event_id: int | str, kind: str, data: Any) -> bytes:
    payload = json.dumps(data, separators=(",", ":"), ensure_ascii=False, default=str)
    return f"id: {event_id}\nevent: {kind}\ndata: {payload}\n\n".encode()


async def with_keepalive(source: AsyncIterator[bytes], interval: float) -> AsyncIterator[bytes]:
    iterator = aiter(source)
    pending: asyncio.Task | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(iterator))
            done, _ = await asyncio.wait({pending}, timeout=interval)
            if not done:
                yield KEEPALIVE
                continue
            task, pending = pending, None
            try:
                yield task.result()
            except StopAsyncIteration:
                return
    finally:
        if pending is not None:
            pending.cancel()
