"""Seed 003's file metadata, kept in the store beside the files it describes.

One document per conversation, ``{conversation prefix}.sbw/files.json`` (see ``layout``):

    {"conversation_id", "workspace_enabled", "workspace_created_at",
     "files": [FileRecord…]}

Why one document, changed by compare-and-swap: every change reads the document with its
ETag, applies itself, and writes it back with ``If-Match`` (``If-None-Match: *`` for the
first), retrying from a fresh read when another writer won. Two API processes writing the
same conversation therefore serialise on the document: no version is lost and no path gets
two file_ids, without a lock service or a database. SeaweedFS (4.48, tested) and S3 honour
both preconditions; the local directory store does the same under a ``flock``. One
document per conversation keeps a change to one request; conversations hold files by the
hundred, not the million.

Durability: the document lives with the files in the store, so it survives API restarts
and pod loss, and deleting the conversation's prefix deletes it with the files.

Rules (``Metadata.record_write``): a path with no active record gets a new record
(``file_id`` a UUID4, ``version`` 1, ``source`` ``user_upload`` for an upload else
``ai_created``); a changed checksum on an active record is a new version (``user_upload``
again for an upload, ``ai_modified`` when agent code changed it); the same checksum again
changes nothing. Deleting marks the record ``deleted`` (kept, so its file_id stays known);
writing the path again afterwards starts a new record with a new file_id.
"""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import Literal, TypeVar

from .base import ObjectNotFound, ObjectStore, PreconditionFailed, StoreUnavailable
from .layout import Layout, Scope

Source = Literal["user_upload", "ai_created", "ai_modified"]
Status = Literal["active", "deleted"]
_MAX_ATTEMPTS = 64
T = TypeVar("T")


def now() -> str:
    return datetime.now(UTC).isoformat()


@dataclass(frozen=True)
class FileRecord:
    file_id: str
    conversation_id: str
    file_path: str
    original_name: str
    file_size: int
    mime_type: str
    version: int
    source: Source
    is_presented: bool
    checksum: str
    status: Status
    description: str
    created_at: str
    updated_at: str
    etag: str = ""  # of the object holding this version's bytes

    @property
    def active(self) -> bool:
        return self.status == "active"


@dataclass
class Manifest:
    conversation_id: str
    workspace_enabled: bool = True
    workspace_created_at: str = field(default_factory=now)
    files: list[FileRecord] = field(default_factory=list)

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def parse(cls, data: bytes) -> Manifest:
        doc = json.loads(data)
        files = [FileRecord(**f) for f in doc.pop("files", [])]
        return cls(**doc, files=files)

    def active(self, file_path: str) -> FileRecord | None:
        return next((f for f in self.files if f.active and f.file_path == file_path), None)

    def by_id(self, file_id: str) -> FileRecord | None:
        return next((f for f in self.files if f.file_id == file_id), None)

    def replace(self, old: FileRecord, new: FileRecord) -> None:
        self.files[self.files.index(old)] = new


@dataclass(frozen=True)
class Written:
    """What one write did to a file: the file's size, checksum, type and bytes' ETag."""

    file_path: str
    file_size: int
    checksum: str
    mime_type: str
    etag: str = ""


class Metadata:
    """The metadata documents of every conversation in ``store`` under ``layout``."""

    def __init__(self, store: ObjectStore, layout: Layout) -> None:
        self.store = store
        self.layout = layout

    async def get(self, scope: Scope, conversation_id: str) -> Manifest | None:
        try:
            data, _ = await self.store.read(self.layout.manifest(scope, conversation_id))
        except ObjectNotFound:
            return None
        return Manifest.parse(data)

    async def update(
        self, scope: Scope, conversation_id: str, change: Callable[[Manifest], T]
    ) -> tuple[Manifest, T]:
        """Apply ``change`` to the conversation's document (made when absent) and write it
        back by compare-and-swap, again from a fresh read whenever another writer won."""
        key = self.layout.manifest(scope, conversation_id)
        for attempt in range(_MAX_ATTEMPTS):
            try:
                data, etag = await self.store.read(key)
                manifest: Manifest = Manifest.parse(data)
            except ObjectNotFound:
                etag, manifest = None, Manifest(conversation_id)
            result = change(manifest)
            try:
                if etag is None:
                    await self.store.put(key, manifest.to_bytes(), if_absent=True)
                else:
                    await self.store.put(key, manifest.to_bytes(), if_match=etag)
                return manifest, result
            except PreconditionFailed:
                # Another writer won the race: back off a little (jittered), read again.
                await asyncio.sleep(random.uniform(0, 0.005 * min(attempt + 1, 20)))
        raise StoreUnavailable(
            f"metadata of conversation {conversation_id!r} kept changing; try again"
        )

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
        """Record one write of ``written.file_path`` (rules in the module docstring)."""

        def change(m: Manifest) -> FileRecord:
            stamp = now()
            old = m.active(written.file_path)
            if old is None:
                record = FileRecord(
                    file_id=str(uuid.uuid4()),
                    conversation_id=conversation_id,
                    file_path=written.file_path,
                    original_name=original_name or written.file_path.rsplit("/", 1)[-1],
                    file_size=written.file_size,
                    mime_type=written.mime_type,
                    version=1,
                    source="user_upload" if uploaded else "ai_created",
                    is_presented=False,
                    checksum=written.checksum,
                    status="active",
                    description=description or "",
                    created_at=stamp,
                    updated_at=stamp,
                    etag=written.etag,
                )
                m.files.append(record)
                return record
            if old.checksum == written.checksum and not uploaded:
                return old
            record = replace(
                old,
                file_size=written.file_size,
                mime_type=written.mime_type,
                version=old.version + 1,
                source="user_upload" if uploaded else "ai_modified",
                checksum=written.checksum,
                original_name=original_name or old.original_name,
                description=old.description if description is None else description,
                updated_at=stamp,
                etag=written.etag,
            )
            m.replace(old, record)
            return record

        return (await self.update(scope, conversation_id, change))[1]

    async def mark_deleted(
        self, scope: Scope, conversation_id: str, *, file_id: str | None = None,
        file_path: str | None = None,
    ) -> FileRecord | None:  # fmt: skip
        """Mark the active record (by id or path) deleted; None when there was none."""

        def change(m: Manifest) -> FileRecord | None:
            old = m.by_id(file_id) if file_id is not None else m.active(file_path or "")
            if old is None or not old.active:
                return None
            record = replace(old, status="deleted", updated_at=now())
            m.replace(old, record)
            return record

        return (await self.update(scope, conversation_id, change))[1]

    async def mark_presented(
        self, scope: Scope, conversation_id: str, file_paths: list[str]
    ) -> list[FileRecord]:
        def change(m: Manifest) -> list[FileRecord]:
            marked = []
            for path in file_paths:
                old = m.active(path)
                if old is not None and not old.is_presented:
                    new = replace(old, is_presented=True, updated_at=now())
                    m.replace(old, new)
                    marked.append(new)
            return marked

        return (await self.update(scope, conversation_id, change))[1]

    async def set_enabled(self, scope: Scope, conversation_id: str, enabled: bool) -> Manifest:
        def change(m: Manifest) -> None:
            m.workspace_enabled = enabled

        return (await self.update(scope, conversation_id, change))[0]
