"""Snapshots and forks of a conversation in the object store, in O(metadata): no file's
bytes pass through this process (``ObjectStore.copy``: a server-side CopyObject on S3).

Layout, under the conversation's prefix (``layout``), so that deleting the conversation
deletes its snapshots and the finalizer's proof — nothing left under the prefix — covers
them unchanged::

    .sbw/snapshots/{snapshot_id}/files/{file_path}   a copy of each active file
    .sbw/snapshots/{snapshot_id}/snapshot.json       what the snapshot is: its records
                                                     (written last: the commit point)

Why copies, not objects shared by content hash: a copy is an independent object, so the
deletion guarantee stays what it was — a conversation owns every object under its prefix,
deleting a fork or an origin deletes only its own prefix, and no reference count (with
its races between a last delete and a new reference) exists to get wrong. The price is
one CopyObject per file (a request, not the bytes; on stores that deduplicate, not even
the space). See docs/architecture.md, "Snapshots and forks".

Contract:
- ``create`` copies the active files of the conversation's metadata as last committed —
  the last completed write-back — then writes ``snapshot.json`` with ``If-None-Match``.
  A crash before that leaves copies no document names: never listed, removed by
  ``sweep`` (called by every create) or with the conversation.
- ``restore`` makes the conversation's files exactly the snapshot's: its files copied
  back, its records as the metadata (``Manifest.reset``; their ``etag`` cleared, the next
  write-back follows the new objects), then every file object the snapshot lacks deleted.
- ``fork`` copies the active files of a conversation (or of one of its snapshots) to
  another's prefix, and writes that conversation's first metadata: the same files, new
  ``file_id``s, the same versions and sources. Before the first copy it writes the
  fork's mark (``.sbw/fork.json``: its source, ``done: false``), after the metadata the
  same with ``done: true`` — so a fork cut off by a crash (a conversation with some
  copies and no records) is told from any other conversation (``fork_mark``), and the
  same fork asked again completes it (the copies and the metadata are idempotent).
- Snapshot ids are made here (``new_id``: 32 hex digits); any other id is 404 (never a key).
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime, timedelta

from .base import ObjectNotFound, ObjectStore
from .layout import RESERVED, Layout, Scope
from .manifest import FileRecord, Manifest
from .metadata import Metadata

_ID = re.compile(r"[0-9a-f]{32}")
COPY_CONCURRENCY = 32  # CopyObject requests in flight
_DOC = "snapshot.json"
_FORK_MARK = "fork.json"
_SWEEP_AFTER = timedelta(hours=1)  # an uncommitted snapshot this old was cut off


def new_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class Snapshot:
    snapshot_id: str
    conversation_id: str
    name: str
    created_at: str
    file_count: int
    bytes: int
    state: str  # which files: "last_write_back" (s3) or "live" (local)
    records: list[FileRecord]

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def parse(cls, data: bytes) -> Snapshot:
        doc = json.loads(data)
        doc["records"] = [FileRecord(**r) for r in doc["records"]]
        return cls(**doc)


@dataclass(frozen=True)
class ForkMark:
    """What a conversation made by a fork was forked from, and whether it completed."""

    forked_from: str
    snapshot_id: str | None
    done: bool

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()


class SnapshotNotFound(ObjectNotFound):
    """No such snapshot (the API answers it 404, as every missing object)."""


async def _bounded(calls: Sequence) -> None:
    """Every call, at most ``COPY_CONCURRENCY`` at once; the first failure is raised only
    once all have ended — a copy still in flight when its caller undoes the fork (deletes
    the prefix) would land after that deletion, an object nothing deletes."""
    gate = asyncio.Semaphore(COPY_CONCURRENCY)

    async def one(call) -> None:
        async with gate:
            await call

    done = await asyncio.gather(*(one(c) for c in calls), return_exceptions=True)
    failed = [e for e in done if isinstance(e, BaseException)]
    if failed:
        raise failed[0]


class StoreCopies:
    """Snapshots and forks of the conversations in ``store`` under ``layout``."""

    def __init__(self, store: ObjectStore, layout: Layout, meta: Metadata) -> None:
        self.store = store
        self.layout = layout
        self.meta = meta

    def _dir(self, scope: Scope, cid: str, snapshot_id: str) -> str:
        if not _ID.fullmatch(snapshot_id):
            raise SnapshotNotFound(f"no snapshot '{snapshot_id}' of conversation '{cid}'")
        return self.layout.metadata(scope, cid, f"snapshots/{snapshot_id}") + "/"

    def _file(self, scope: Scope, cid: str, snapshot_id: str, path: str) -> str:
        return self._dir(scope, cid, snapshot_id) + "files/" + path

    async def create(self, scope: Scope, cid: str, name: str) -> Snapshot:
        """Copy the active files as last committed; answer the snapshot made."""
        await self.sweep(scope, cid)
        manifest = await self.meta.get(scope, cid)
        records = [r for r in (manifest.files if manifest else []) if r.active]
        sid = new_id()
        live = self.layout.file
        await _bounded([self.store.copy(live(scope, cid, r.file_path),
                                        self._file(scope, cid, sid, r.file_path))
                        for r in records])  # fmt: skip
        snap = Snapshot(
            snapshot_id=sid,
            conversation_id=cid,
            name=name,
            created_at=datetime.now(UTC).isoformat(),
            file_count=len(records),
            bytes=sum(r.file_size for r in records),
            state="last_write_back",
            records=records,
        )
        await self.store.put(self._dir(scope, cid, sid) + _DOC, snap.to_bytes(), if_absent=True)
        return snap

    async def get(self, scope: Scope, cid: str, snapshot_id: str) -> Snapshot:
        try:
            data, _ = await self.store.read(self._dir(scope, cid, snapshot_id) + _DOC)
        except ObjectNotFound as e:
            raise SnapshotNotFound(f"no snapshot '{snapshot_id}' of conversation '{cid}'") from e
        return await asyncio.to_thread(Snapshot.parse, data)

    async def list(self, scope: Scope, cid: str) -> list[Snapshot]:
        base = self.layout.metadata(scope, cid, "snapshots") + "/"
        ids = {i.key[len(base) :].split("/", 1)[0] async for i in self.store.list(base)
               if i.key.endswith("/" + _DOC)}  # fmt: skip
        found = []
        for sid in ids:
            try:
                found.append(await self.get(scope, cid, sid))
            except SnapshotNotFound:
                continue  # deleted meanwhile
        return sorted(found, key=lambda s: (s.created_at, s.snapshot_id))

    async def delete(self, scope: Scope, cid: str, snapshot_id: str) -> None:
        """The document first (no longer listed), then its files; 404 when none."""
        await self.get(scope, cid, snapshot_id)
        prefix = self._dir(scope, cid, snapshot_id)
        await self.store.delete(prefix + _DOC)
        await self.store.delete_prefix(prefix)

    async def sweep(self, scope: Scope, cid: str) -> int:
        """Remove the copies of snapshots a crash cut off before their document (older
        than an hour: a create in progress is never that slow); answer how many."""
        base = self.layout.metadata(scope, cid, "snapshots") + "/"
        seen: dict[str, datetime] = {}
        committed: set[str] = set()
        async for info in self.store.list(base):
            sid = info.key[len(base) :].split("/", 1)[0]
            if info.key.endswith("/" + _DOC):
                committed.add(sid)
            seen[sid] = max(seen.get(sid, info.modified), info.modified)
        cutoff = datetime.now(UTC) - _SWEEP_AFTER
        stale = [s for s, t in seen.items() if s not in committed and t < cutoff]
        for sid in stale:
            await self.store.delete_prefix(base + sid + "/")
        return len(stale)

    async def stored_bytes(self, session_prefix: str) -> int:
        """What every snapshot under a session's prefix holds (the stored-bytes quota)."""
        total = 0
        async for info in self.store.list(session_prefix):
            if "/.sbw/snapshots/" in info.key and "/files/" in info.key:
                total += info.size
        return total

    async def restore(self, scope: Scope, cid: str, snapshot_id: str) -> Snapshot:
        """The conversation's files and records become the snapshot's (module docstring);
        the caller holds the conversation's write fence."""
        snap = await self.get(scope, cid, snapshot_id)
        live = self.layout.file
        await _bounded([self.store.copy(self._file(scope, cid, snapshot_id, r.file_path),
                                        live(scope, cid, r.file_path))
                        for r in snap.records])  # fmt: skip
        records = [replace(r, etag="") for r in snap.records]
        await self.meta.update(scope, cid, lambda m: m.reset(records))
        kept = {live(scope, cid, r.file_path) for r in records}
        prefix = self.layout.conversation(scope, cid)
        reserved = f"{prefix}{RESERVED}/"
        stale = [i.key async for i in self.store.list(prefix)
                 if not i.key.startswith(reserved) and i.key not in kept]  # fmt: skip
        await _bounded([self.store.delete(k) for k in stale])
        return snap

    async def fork(
        self, scope: Scope, src: str, dst: str, snapshot_id: str | None
    ) -> list[FileRecord]:
        """Copy ``src``'s active files (or its snapshot's) to ``dst`` and write ``dst``'s
        first metadata; the caller holds ``dst``'s write fence. Answer ``dst``'s records."""
        if snapshot_id is not None:
            records = (await self.get(scope, src, snapshot_id)).records

            def source(path: str) -> str:
                return self._file(scope, src, snapshot_id, path)
        else:
            manifest = await self.meta.get(scope, src)
            records = [r for r in (manifest.files if manifest else []) if r.active]

            def source(path: str) -> str:
                return self.layout.file(scope, src, path)

        mark = self.layout.metadata(scope, dst, _FORK_MARK)
        await self.store.put(mark, ForkMark(src, snapshot_id, done=False).to_bytes())
        await _bounded([self.store.copy(source(r.file_path),
                                        self.layout.file(scope, dst, r.file_path))
                        for r in records])  # fmt: skip
        forked = [replace(r, file_id=str(uuid.uuid4()), conversation_id=dst, etag="")
                  for r in records]  # fmt: skip

        def first(m: Manifest) -> None:
            m.reset(forked)

        await self.meta.update(scope, dst, first)
        await self.store.put(mark, ForkMark(src, snapshot_id, done=True).to_bytes())
        return forked

    async def fork_mark(self, scope: Scope, cid: str) -> ForkMark | None:
        """The mark of a conversation a fork made (None for any other)."""
        try:
            data, _ = await self.store.read(self.layout.metadata(scope, cid, _FORK_MARK))
        except ObjectNotFound:
            return None
        return ForkMark(**json.loads(data))
