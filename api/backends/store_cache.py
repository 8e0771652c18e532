"""Moving bytes into and out of a sandbox's workspace (the cache of store mode).

The runtime stays store-free: the API writes a file into the cache through the
runtime's upload route (uploads, so the runtime records them as uploads); outputs go
through its output route (``RuntimeClient.put_output``).
``Hashing`` passes a stream through, counting and hashing it (the write-back's SHA-256);
``small_or_stream`` reads a small file whole, so the store gets one plain PUT for it
rather than a multipart upload (three requests: what made small files slow).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
from collections.abc import AsyncIterable, AsyncIterator, Awaitable
from typing import TypeVar

from sandbox_workspace.runtime.client import RuntimeRefused
from sandbox_workspace.runtime.schemas import MAX_OUTPUTS_LISTED, UPLOAD_SUBDIR

from ..runtime_client import RuntimeClient

A, B = TypeVar("A"), TypeVar("B")
log = logging.getLogger(__name__)

UPLOADS = f"uploads/{UPLOAD_SUBDIR}/"
OUTPUTS = "outputs/"


class Hashing:
    """A byte stream passed through, counted and hashed on the way."""

    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        self.chunks = chunks
        self.digest = hashlib.sha256()
        self.size = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.chunks:
            self.digest.update(chunk)
            self.size += len(chunk)
            yield chunk


SMALL = 1024 * 1024  # a file up to this is put whole: ≤ WRITE_BACK_CONCURRENCY MiB held


async def small_or_stream(chunks: AsyncIterator[bytes], limit: int = SMALL):
    """The whole body as ``bytes`` when it is at most ``limit`` bytes, else an iterator
    of the same chunks (the ones read ahead first): memory stays bounded either way."""
    head: list[bytes] = []
    size = 0
    async for chunk in chunks:
        head.append(chunk)
        size += len(chunk)
        if size > limit:
            break
    else:
        return b"".join(head)

    async def rest() -> AsyncIterator[bytes]:
        for chunk in head:
            yield chunk
        async for chunk in chunks:
            yield chunk

    return rest()


async def fill_upload(
    client: RuntimeClient, cid: str, name: str, mime_type: str, data: AsyncIterable[bytes]
) -> None:
    """Put ``data`` into the conversation's temparea as upload ``name`` (a multipart body
    made on the fly: nothing is buffered whole)."""
    boundary = secrets.token_hex(16)
    quoted = name.replace("\\", "\\\\").replace('"', '\\"')
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
        f'filename="{quoted}"\r\nContent-Type: {mime_type}\r\n\r\n'
    ).encode()

    async def body() -> AsyncIterator[bytes]:
        yield head
        async for chunk in data:
            yield chunk
        yield f"\r\n--{boundary}--\r\n".encode()

    await client.upload(
        body(),
        f"multipart/form-data; boundary={boundary}",
        {"conversation_id": cid, "subdir": UPLOAD_SUBDIR},
    )


async def drop_cached(
    client: RuntimeClient, cid: str, file_path: str, *, missing_ok: bool = True
) -> None:
    """Remove a file's cache copy through the runtime (an upload, or an output — on any
    backend: a pod's cache is reached over HTTP too); a missing one is fine unless
    ``missing_ok`` is false (the runtime's 404 is raised)."""
    try:
        if file_path.startswith(UPLOADS):
            await client.delete_upload(cid, file_path[len(UPLOADS) :])
        elif file_path.startswith(OUTPUTS):
            await client.delete_output(cid, file_path[len(OUTPUTS) :].split("/"))
    except RuntimeRefused as e:
        if e.status != 404 or not missing_ok:
            raise


async def listings(client: RuntimeClient, cid: str) -> tuple[dict, dict]:
    """The conversation's uploads by name and outputs by relative path (none when the
    runtime does not know the conversation). Both asked at once: after every command
    (the write-back's look) one round trip to the runtime, not two."""
    try:
        uploaded, listed = await _both(
            client.list_uploads(cid), client.list_outputs(cid, limit=MAX_OUTPUTS_LISTED)
        )
        uploads = {f.name: f for f in uploaded.files}
        if listed.truncated:  # past what one listing holds: said, never silent
            log.warning(
                "conversation has more outputs than one listing holds; those past it are "
                "not written back",
                extra={"conversation_id": cid, "listed": len(listed.files)},
            )
        outputs = {f.relative_path: f for f in listed.files}
    except RuntimeRefused as e:
        if e.status != 404:
            raise
        return {}, {}
    return uploads, outputs


async def _both(first: Awaitable[A], second: Awaitable[B]) -> tuple[A, B]:
    """Both at once; the first error is raised as soon as it comes, the other cancelled
    — and awaited, so nothing is left running. Not held until the other ends, as a
    gather would: a refusal of one listing waited for the other's answer, up to the
    runtime read timeout (300 s) when that one hung, with the write-back's lock held."""
    tasks = (asyncio.ensure_future(first), asyncio.ensure_future(second))
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for task in tasks:
            task.cancel()  # nothing for one that ended
        await asyncio.wait(tasks)
    for task in tasks:
        if not task.cancelled() and (error := task.exception()) is not None:
            raise error
    return tasks[0].result(), tasks[1].result()
