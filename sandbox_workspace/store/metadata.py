"""Seed 003's file metadata of every conversation, kept in the store beside the files it
describes (records and rules: ``manifest``).

Objects, under the conversation's prefix (``layout``): the *head* ``.sbw/files.json`` and
its *shards* ``.sbw/shards/{shard}-{uuid}.json``, each holding the records of the paths
that hash to it (``manifest.shard_of``, 64 shards).

A change is a copy-on-write commit:
1. read the head with its ETag, and the shards it names (each process keeps parsed shards
   by key: a shard object is never rewritten, so a cached one needs no revalidation);
2. apply the change in memory;
3. write every shard the change touched as a *new* object, then the head with
   ``If-Match`` (``If-None-Match: *`` for the first): the head is the commit point. When
   another writer won, the new shard objects are deleted and the change starts again
   from a fresh read (jittered back-off);
4. after the commit, delete the objects of the shards it replaced. A reader that read the
   older head and finds one of its shards gone reads the head again.

Two API processes writing the same conversation therefore serialise on the head: no
version is lost and no path gets two file_ids, without a lock service or a database.
SeaweedFS (4.48, tested) and S3 honour both preconditions; the local directory store does
the same under a ``flock``.

Cost: a change of k files touches at most min(k, 64) shards — one head GET, the GETs of
shards this process has not parsed yet, that many shard PUTs and DELETEs, one head PUT —
and a batch (one write-back, ``record_writes``) is one change however many files it
records. Parsing and serialising run in worker threads (``asyncio.to_thread``), never on
the event loop. The head stays small (64 short keys) however large the conversation
grows, and a shard holds about 1/64 of its records.

Immutable shards named by a head are also what a snapshot or a fork builds on (docs/
architecture.md, "Metadata"): a copy of the head is a consistent point-in-time copy of
every record.

Crash safety: a writer that dies between its shard PUTs and its head PUT leaves shard
objects no head names — never read, removed with the conversation's prefix. Durability:
the metadata lives with the files in the store, so it survives API restarts and pod loss,
and deleting the conversation's prefix deletes it with the files.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import OrderedDict
from collections.abc import Callable, Sequence
from functools import partial
from typing import TypeVar

from .base import ObjectNotFound, ObjectStore, PreconditionFailed, StoreError, StoreUnavailable
from .layout import Layout, Scope
from .manifest import FileRecord, Head, Manifest, Written, new_shard_key, now, parse_shard
from .manifest import mark_deleted as _mark_deleted
from .manifest import mark_presented as _mark_presented
from .manifest import record_write as _record_write

log = logging.getLogger(__name__)
_MAX_ATTEMPTS = 64
_IO_CONCURRENCY = 16  # shard GETs/PUTs/DELETEs in flight for one change
_CACHED_SHARDS = 4096  # parsed shards kept per process (least recently used dropped)
T = TypeVar("T")

__all__ = ["FileRecord", "Manifest", "Metadata", "Written", "now"]


class _ShardCache:
    """Parsed shards by object key; immutable objects, so never stale, only evicted."""

    def __init__(self, size: int = _CACHED_SHARDS) -> None:
        self.size = size
        self._items: OrderedDict[str, list[FileRecord]] = OrderedDict()

    def get(self, key: str) -> list[FileRecord] | None:
        records = self._items.get(key)
        if records is not None:
            self._items.move_to_end(key)
        return records

    def put(self, key: str, records: list[FileRecord]) -> None:
        self._items[key] = records
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)


async def _bounded(calls: Sequence[Callable[[], object]]) -> list:
    gate = asyncio.Semaphore(_IO_CONCURRENCY)

    async def one(call):
        async with gate:
            return await call()

    return await asyncio.gather(*(one(c) for c in calls))


class Metadata:
    """The metadata of every conversation in ``store`` under ``layout``."""

    def __init__(self, store: ObjectStore, layout: Layout) -> None:
        self.store = store
        self.layout = layout
        self._cache = _ShardCache()

    async def get(self, scope: Scope, conversation_id: str) -> Manifest | None:
        return (await self._load(scope, conversation_id))[0]

    async def _load(self, scope: Scope, cid: str) -> tuple[Manifest | None, str | None]:
        key = self.layout.manifest(scope, cid)
        for _ in range(_MAX_ATTEMPTS):
            try:
                data, etag = await self.store.read(key)
            except ObjectNotFound:
                return None, None
            head = await asyncio.to_thread(Head.parse, data)
            try:
                shards = await self._shards(scope, cid, head)
            except ObjectNotFound:
                continue  # a newer commit replaced one of its shards: read the head again
            return await asyncio.to_thread(head.manifest, shards), etag
        raise StoreUnavailable(f"metadata of conversation {cid!r} kept changing; try again")

    async def _shards(self, scope: Scope, cid: str, head: Head) -> list[list[FileRecord]]:
        keys = [self.layout.metadata(scope, cid, rel) for rel in head.shards.values()]
        missing = [k for k in keys if self._cache.get(k) is None]
        if missing:
            datas = await _bounded([partial(self.store.read, k) for k in missing])
            parsed = await asyncio.to_thread(lambda: [parse_shard(d) for d, _ in datas])
            for k, records in zip(missing, parsed, strict=True):
                self._cache.put(k, records)
        out = []
        for k in keys:
            records = self._cache.get(k)
            if records is None:  # evicted meanwhile by a very busy process: read it again
                records = parse_shard((await self.store.read(k))[0])
            out.append(records)
        return out

    async def update(
        self, scope: Scope, conversation_id: str, change: Callable[[Manifest], T]
    ) -> tuple[Manifest, T]:
        """Apply ``change`` to the conversation's metadata (made when absent) and commit
        it (the module docstring), again from a fresh read whenever another writer won.
        A change that changes nothing writes nothing."""
        cid = conversation_id
        head_key = self.layout.manifest(scope, cid)
        for attempt in range(_MAX_ATTEMPTS):
            manifest, etag = await self._load(scope, cid)
            if manifest is None:
                manifest = Manifest(cid)
            before = manifest.head_fields()
            result = change(manifest)
            if etag is not None and not manifest.dirty and manifest.head_fields() == before:
                return manifest, result
            docs = await asyncio.to_thread(manifest.dirty_shards)
            replaced = [manifest.shards[s] for s in docs if s in manifest.shards]
            fresh = {s: new_shard_key(s) for s in docs}
            keys = {s: self.layout.metadata(scope, cid, rel) for s, rel in fresh.items()}
            puts = [(keys[s], data) for s, (data, _) in docs.items()]
            await _bounded([partial(self.store.put, k, data) for k, data in puts])
            manifest.shards.update(fresh)
            try:
                if etag is None:
                    await self.store.put(head_key, manifest.head_bytes(), if_absent=True)
                else:
                    await self.store.put(head_key, manifest.head_bytes(), if_match=etag)
            except PreconditionFailed:
                # Another writer won the race: drop what we wrote, back off, read again.
                await self._delete_quietly(list(keys.values()))
                await asyncio.sleep(random.uniform(0, 0.005 * min(attempt + 1, 20)))
                continue
            for s, (_, records) in docs.items():
                self._cache.put(keys[s], records)
            manifest.dirty.clear()
            await self._delete_quietly([self.layout.metadata(scope, cid, r) for r in replaced])
            return manifest, result
        raise StoreUnavailable(f"metadata of conversation {cid!r} kept changing; try again")

    async def _delete_quietly(self, keys: list[str]) -> None:
        """Objects no head names any more: a failure leaves garbage (removed with the
        conversation), never a wrong answer, so it is logged and not raised."""
        try:
            await _bounded([partial(self.store.delete, k) for k in keys])
        except StoreError as e:
            log.warning("could not delete replaced metadata shards: %s", e)

    async def record_writes(
        self,
        scope: Scope,
        conversation_id: str,
        writes: Sequence[tuple[Written, bool]],
        presented: Sequence[str] = (),
    ) -> list[FileRecord]:
        """Record a batch of writes (each with whether it was an upload) and mark
        ``presented`` paths, in one change; answer the records written or marked."""

        def change(m: Manifest) -> list[FileRecord]:
            done = [_record_write(m, w, uploaded=up) for w, up in writes]
            return done + _mark_presented(m, list(presented))

        return (await self.update(scope, conversation_id, change))[1]

    async def record_write(
        self,
        scope: Scope,
        conversation_id: str,
        written: Written,
        *,
        uploaded: bool,
        original_name: str | None = None,
        description: str | None = None,
    ) -> FileRecord:
        """Record one write of ``written.file_path`` (rules in ``manifest``)."""

        def change(m: Manifest) -> FileRecord:
            return _record_write(
                m, written, uploaded=uploaded, original_name=original_name,
                description=description,
            )  # fmt: skip

        return (await self.update(scope, conversation_id, change))[1]

    async def mark_deleted(
        self, scope: Scope, conversation_id: str, *, file_id: str | None = None,
        file_path: str | None = None,
    ) -> FileRecord | None:  # fmt: skip
        """Mark the active record (by id or path) deleted — a tombstone; None when there
        was none."""

        def change(m: Manifest) -> FileRecord | None:
            return _mark_deleted(m, file_id, file_path)

        return (await self.update(scope, conversation_id, change))[1]

    async def mark_presented(
        self, scope: Scope, conversation_id: str, file_paths: list[str]
    ) -> list[FileRecord]:
        return await self.record_writes(scope, conversation_id, [], file_paths)

    async def set_enabled(self, scope: Scope, conversation_id: str, enabled: bool) -> Manifest:
        def change(m: Manifest) -> None:
            m.workspace_enabled = enabled

        return (await self.update(scope, conversation_id, change))[0]
