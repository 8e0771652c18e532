"""Seed 003's file metadata of one conversation, in memory: the records, the rules that
change them, and the documents they are stored as. Pure (no I/O): ``metadata`` reads and
writes the documents.

Stored as one small *head* and up to ``SHARDS`` immutable *shards* (see ``metadata``):

    head   {"format": 2, "conversation_id", "workspace_enabled", "workspace_created_at",
            "shard_count", "shards": {"07": ".sbw/shards/07-<uuid>.json", …}}
    shard  {"files": [FileRecord…]}   the records whose ``file_path`` hashes to it

A record lives in the shard of its path (``shard_of``), tombstones included, so a change
to some paths rewrites only their shards. A head of format 1 (``{"files": […]}``, one
document holding every record) is read as it is and rewritten sharded by the next change.

Rules (``record_write``): a path with no active record gets a new record (``file_id`` a
UUID4, ``version`` 1, ``source`` ``user_upload`` for an upload else ``ai_created``); a
changed checksum on an active record is a new version (``user_upload`` again for an
upload, ``ai_modified`` when agent code changed it); the same checksum again changes
nothing. Deleting marks the record ``deleted`` — a tombstone, kept so its file_id stays
known and a refill (which fills active records only) never brings the file back; writing
the path again afterwards starts a new record with a new file_id.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import Literal

Source = Literal["user_upload", "ai_created", "ai_modified"]
Status = Literal["active", "deleted"]
FORMAT = 2
SHARDS = 64  # ~30 records a shard at 2,000 files; ~300 (≈120 kB) at 20,000


def now() -> str:
    return datetime.now(UTC).isoformat()


def _dumps(doc: dict) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def shard_of(file_path: str, shard_count: int = SHARDS) -> str:
    """The shard holding ``file_path``'s records: stable, spread by SHA-256."""
    digest = hashlib.sha256(file_path.encode()).digest()
    return f"{int.from_bytes(digest[:4], 'big') % shard_count:02x}"


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


@dataclass(frozen=True)
class Written:
    """What one write did to a file: the file's size, checksum, type and bytes' ETag."""

    file_path: str
    file_size: int
    checksum: str
    mime_type: str
    etag: str = ""


@dataclass
class Manifest:
    """Every record of a conversation (by file_id, in creation order), indexed by active
    path, and which shards a change touched (``dirty``)."""

    conversation_id: str
    workspace_enabled: bool = True
    workspace_created_at: str = field(default_factory=now)
    shard_count: int = SHARDS
    shards: dict[str, str] = field(default_factory=dict)  # shard → its object (relative)
    _records: dict[str, FileRecord] = field(default_factory=dict, repr=False)
    _active: dict[str, FileRecord] = field(default_factory=dict, repr=False)
    dirty: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, conversation_id: str, records: list[FileRecord], **head) -> Manifest:
        m = cls(conversation_id, **head)
        for r in sorted(records, key=lambda r: (r.created_at, r.file_path)):
            m._records[r.file_id] = r
            if r.active:
                m._active[r.file_path] = r
        return m

    @property
    def files(self) -> list[FileRecord]:
        return list(self._records.values())

    def active(self, file_path: str) -> FileRecord | None:
        return self._active.get(file_path)

    def by_id(self, file_id: str) -> FileRecord | None:
        return self._records.get(file_id)

    def add(self, record: FileRecord) -> None:
        self._records[record.file_id] = record
        self._active[record.file_path] = record
        self.dirty.add(shard_of(record.file_path, self.shard_count))

    def replace(self, old: FileRecord, new: FileRecord) -> None:
        self._records[old.file_id] = new  # same file_id: keeps its place
        if self._active.get(old.file_path) is old:
            del self._active[old.file_path]
        if new.active:
            self._active[new.file_path] = new
        self.dirty.add(shard_of(new.file_path, self.shard_count))

    def reset(self, records: list[FileRecord]) -> None:
        """Every record becomes ``records`` (a restore, a fork's first document): every
        shard is rewritten, those left empty included."""
        self.dirty |= set(self.shards) | {shard_of(r.file_path, self.shard_count)
                                          for r in self._records.values()}  # fmt: skip
        self._records.clear()
        self._active.clear()
        for r in sorted(records, key=lambda r: (r.created_at, r.file_path)):
            self.add(r)

    def head_fields(self) -> tuple[bool, str]:
        return self.workspace_enabled, self.workspace_created_at

    # -- documents ----------------------------------------------------------------------

    def dirty_shards(self) -> dict[str, tuple[bytes, list[FileRecord]]]:
        """The touched shards' documents and records (CPU-bound: run it off the loop)."""
        grouped: dict[str, list[FileRecord]] = {shard: [] for shard in self.dirty}
        for r in self._records.values():
            records = grouped.get(shard_of(r.file_path, self.shard_count))
            if records is not None:
                records.append(r)
        return {s: (_dumps({"files": [asdict(r) for r in rs]}), rs)
                for s, rs in grouped.items()}  # fmt: skip

    def head_bytes(self) -> bytes:
        doc = {
            "format": FORMAT,
            "conversation_id": self.conversation_id,
            "workspace_enabled": self.workspace_enabled,
            "workspace_created_at": self.workspace_created_at,
            "shard_count": self.shard_count,
            "shards": dict(sorted(self.shards.items())),
        }
        return _dumps(doc)


@dataclass(frozen=True)
class Head:
    """A parsed head: its fields, its shards' objects — or, for format 1, every record."""

    conversation_id: str
    fields: dict
    shards: dict[str, str]
    legacy: list[FileRecord] | None = None

    @classmethod
    def parse(cls, data: bytes) -> Head:
        doc = json.loads(data)
        fields = {k: doc[k] for k in ("workspace_enabled", "workspace_created_at") if k in doc}
        fields["shard_count"] = doc.get("shard_count", SHARDS)
        if doc.get("format", 1) == 1:
            legacy = [FileRecord(**f) for f in doc.get("files", [])]
            return cls(doc["conversation_id"], fields, {}, legacy)
        return cls(doc["conversation_id"], fields, dict(doc["shards"]))

    def manifest(self, shard_records: list[list[FileRecord]]) -> Manifest:
        if self.legacy is not None:  # every shard is new: the next change writes them all
            m = Manifest.of(self.conversation_id, self.legacy, **self.fields)
            m.dirty = {shard_of(r.file_path, m.shard_count) for r in self.legacy}
            return m
        records = [r for rs in shard_records for r in rs]
        return Manifest.of(self.conversation_id, records, shards=dict(self.shards),
                           **self.fields)  # fmt: skip


def parse_shard(data: bytes) -> list[FileRecord]:
    return [FileRecord(**f) for f in json.loads(data)["files"]]


def new_shard_key(shard: str) -> str:
    """A fresh object for a shard's new version (relative to the conversation): shards
    are never overwritten, so a reader holding an older head reads a consistent set."""
    return f"shards/{shard}-{uuid.uuid4().hex}.json"


def record_write(
    m: Manifest,
    written: Written,
    *,
    uploaded: bool,
    original_name: str | None = None,
    description: str | None = None,
) -> FileRecord:
    """Apply one write of ``written.file_path`` to ``m`` (rules in the module docstring)."""
    stamp = now()
    old = m.active(written.file_path)
    if old is None:
        record = FileRecord(
            file_id=str(uuid.uuid4()),
            conversation_id=m.conversation_id,
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
        m.add(record)
        return record
    if old.checksum == written.checksum and not uploaded:
        if old.etag != written.etag and written.etag:  # same bytes, a new object: follow it
            new = replace(old, etag=written.etag)
            m.replace(old, new)
            return new
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


def mark_deleted(m: Manifest, file_id: str | None, file_path: str | None) -> FileRecord | None:
    """Turn the active record (by id or path) into a tombstone; None when there was none."""
    old = m.by_id(file_id) if file_id is not None else m.active(file_path or "")
    if old is None or not old.active:
        return None
    record = replace(old, status="deleted", updated_at=now())
    m.replace(old, record)
    return record


def mark_presented(m: Manifest, file_paths: list[str]) -> list[FileRecord]:
    marked = []
    for path in file_paths:
        old = m.active(path)
        if old is not None and not old.is_presented:
            new = replace(old, is_presented=True, updated_at=now())
            m.replace(old, new)
            marked.append(new)
    return marked
