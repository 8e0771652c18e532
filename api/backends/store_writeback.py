"""The copying half of store mode's write-back (``StoreBackend.write_back`` decides what
to copy and records it): cache → store, many files at once, in flat memory.

- Small outputs (listed at most ``output_batch.PER_FILE``) are read from the runtime a
  batch at a time (``RuntimeClient.read_outputs``: up to ``BATCH_PATHS`` files and
  ``BATCH_BYTES`` bytes an answer) and each put whole — one plain PUT, not a multipart
  upload of three requests. Thousands of small files thus cost a few runtime requests
  and one store request each: the per-request cost, not the bytes, made them slow.
- Everything else — uploads, larger outputs, and any file a batch could not hold (it grew
  meanwhile, or the runtime is of a release without the batch route) — is streamed on its
  own (``copy_one``: SHA-256 on the way; read whole first only when small).
- At most ``WRITE_BACK_CONCURRENCY`` puts are in flight, and ``_BATCHES_IN_FLIGHT``
  batch reads: memory stays under about BATCH_BYTES × 2 + CONCURRENCY × SMALL.

``copy_all`` answers, for each copy in order, what was written or the failure: the caller
records every success in one metadata change before it raises the first failure, so no
copied file is left unrecorded.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx

from sandbox_workspace.runtime.client import RuntimeRefused
from sandbox_workspace.runtime.output_batch import PER_FILE
from sandbox_workspace.runtime.output_frames import Frame
from sandbox_workspace.store import ObjectStore
from sandbox_workspace.store.metadata import Written

from ..runtime_client import RuntimeClient
from .store_cache import Hashing, small_or_stream

# Files one write-back puts at a time: enough to keep the store busy with small files,
# few enough that large ones hold at most this many × the store's part buffers.
WRITE_BACK_CONCURRENCY = 16
BATCH_PATHS = 256
BATCH_BYTES = 4 * 1024 * 1024
_BATCHES_IN_FLIGHT = 2


@dataclass(frozen=True)
class Copy:
    """One file to copy: its path in the conversation and object ``key``, how to open it
    from the cache, whether it records as a user's upload, and — for an output — its
    path below outputs/ and listed size."""

    path: str
    key: str
    opener: Callable[[], Awaitable[httpx.Response]]
    mime_type: str
    uploaded: bool = False
    output: str | None = None
    size: int = 0


async def copy_one(store: ObjectStore, copy: Copy) -> Written:
    """Stream one file of the cache to its object; answer what was written."""
    response = await copy.opener()
    body = Hashing(response.aiter_raw())
    try:
        etag = await store.put(copy.key, await small_or_stream(aiter(body)))
    finally:
        await response.aclose()
    return Written(copy.path, body.size, body.digest.hexdigest(), copy.mime_type, etag)


def _batches(copies: list[Copy]) -> list[list[Copy]]:
    batches: list[list[Copy]] = [[]]
    size = 0
    for c in copies:
        if len(batches[-1]) >= BATCH_PATHS or (batches[-1] and size + c.size > BATCH_BYTES):
            batches.append([])
            size = 0
        batches[-1].append(c)
        size += c.size
    return [b for b in batches if b]


async def copy_all(
    store: ObjectStore, client: RuntimeClient, cid: str, copies: list[Copy]
) -> list[Written | BaseException]:
    gate = asyncio.Semaphore(WRITE_BACK_CONCURRENCY)
    reads = asyncio.Semaphore(_BATCHES_IN_FLIGHT)

    async def one(c: Copy) -> Written:
        async with gate:
            return await copy_one(store, c)

    async def put(c: Copy, data: bytes) -> Written:
        async with gate:
            etag = await store.put(c.key, data)
        return Written(c.path, len(data), hashlib.sha256(data).hexdigest(), c.mime_type, etag)

    async def batch(cs: list[Copy]) -> list[Written | BaseException]:
        try:
            async with reads:
                frames = await client.read_outputs(cid, [c.output or "" for c in cs], BATCH_BYTES)
        except RuntimeRefused as e:
            if e.status not in (404, 405):  # 404/405: a runtime without the batch route
                raise
            frames = [Frame(c.output or "", None, "unsupported") for c in cs]
        if [f.path for f in frames] != [c.output for c in cs]:
            raise RuntimeRefused(502, "bad_batch", "the output batch named other paths")
        pairs = zip(cs, frames, strict=True)
        return await asyncio.gather(
            *(put(c, f.data) if f.data is not None else one(c) for c, f in pairs),
            return_exceptions=True,
        )

    is_small = [c.output is not None and c.size <= PER_FILE for c in copies]
    small = [i for i, yes in enumerate(is_small) if yes]
    rest = [i for i, yes in enumerate(is_small) if not yes]
    groups = _batches([copies[i] for i in small])
    results = await asyncio.gather(
        *(batch(g) for g in groups), *(one(copies[i]) for i in rest), return_exceptions=True
    )
    done: list[Written | BaseException] = [RuntimeError("not copied")] * len(copies)
    order = iter(small)
    for g, got in zip(groups, results[: len(groups)], strict=True):
        for k in range(len(g)):
            done[next(order)] = got if isinstance(got, BaseException) else got[k]
    for i, got in zip(rest, results[len(groups) :], strict=True):
        done[i] = got
    return done
