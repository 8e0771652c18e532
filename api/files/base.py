"""The file service: the one way every file route reaches a session's files.

Contract: the v1 file routes (``/api/v1/sessions/{sid}/files…``), seed 003's workspace
and tenant routes and ``/sandboxes`` call a ``FileService``; ``app.create_app`` picks its
implementation once, from ``SANDBOX_WORKSPACE_STORE``:
- ``CacheFiles`` (``local``): the sandbox's workspace holds the files; there is nothing
  else to keep in step;
- ``StoredFiles`` (``s3``): the object store is the source of truth, the workspace its
  cache; an upload goes to both in one pass, a download serves only what the store holds,
  a deletion removes the object and marks its record deleted, so no later fill (resume,
  new pod, API restart, another replica) brings the file back.
Routes never branch on the mode; they parse the protocol, find the session and call the
service. Errors are the API's (``contract.errors``): 400 for a malformed request, 404 for
a file that is not there, 409 while a conversation is being deleted, 413 for a body over
the session's limit.

The shared parts live here: the upload pre-checks (``precheck``: the declared size, the
conversation opened before a byte is sent — written once for every upload route), the
resolution of a bare file name within a session, and the reads every mode makes of the
cache (listings, conversations).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import httpx

from sandbox_workspace.contract import ids
from sandbox_workspace.contract.errors import Conflict, NotConfigured, NotFoundError, TooLarge
from sandbox_workspace.runtime.schemas import UploadedFile, UploadList, UploadResult
from sandbox_workspace.store import Download
from sandbox_workspace.store.metadata import FileRecord

from ..backends.base import Backend, Session
from ..file_refs import FileRef, parse_file_ref
from ..runtime_client import RuntimeClient

if TYPE_CHECKING:
    from .copies import Forked, SnapshotView

# Multipart framing around the file: boundaries, part headers, small form fields.
MULTIPART_OVERHEAD = 64 * 1024


@dataclass(frozen=True)
class Upload:
    """One upload as a route received it: the streamed multipart body and what was given
    outside the form (query or headers: ``conversation_id``, ``subdir``)."""

    body: AsyncIterator[bytes]
    content_type: str
    declared_length: str | None = None
    params: dict[str, str] = field(default_factory=dict)

    @property
    def conversation_id(self) -> str | None:
        """The conversation given outside the form, checked; None when the form says."""
        given = self.params.get("conversation_id")
        return None if given is None else ids.conversation_id_or_400(given)


class Opened(Protocol):
    """A file being downloaded: its headers and bytes (stream, then ``aclose``)."""

    headers: Mapping[str, str]

    def aiter_raw(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class Records:
    """Seed 003's view of a conversation: its setting and its active files' records."""

    enabled: bool
    created_at: str | None
    files: list[FileRecord]
    store_prefix: str
    path: str  # the conversation directory as code opens it


class FileService(Protocol):
    # The conversation's top level (outside uploads/temparea and outputs/) survives a
    # refill of the cache; /sandboxes mirrors its files under outputs/ when it does not.
    top_level_kept: bool

    async def upload(self, session: Session, upload: Upload) -> UploadResult: ...

    async def listing(self, session: Session, cid: str) -> UploadList: ...

    async def session_listing(self, session: Session) -> list[UploadedFile]: ...

    async def resolve(
        self, session: Session, ref: str, cid: str | None, *, outputs: bool
    ) -> FileRef: ...

    async def open(self, session: Session, ref: FileRef) -> Opened: ...

    async def delete(self, session: Session, ref: FileRef) -> None: ...

    # -- seed 003: files by file_id, with their records ---------------------------------

    async def upload_record(self, session: Session, cid: str, upload: Upload) -> FileRecord: ...

    async def records(self, session: Session, cid: str) -> Records: ...

    async def open_record(
        self, session: Session, cid: str, file_id: str
    ) -> tuple[FileRecord, Download]: ...

    async def delete_record(self, session: Session, cid: str, file_id: str) -> FileRecord: ...

    async def set_enabled(self, session: Session, cid: str, enabled: bool) -> None: ...

    # -- snapshots and forks (``files.copies``) ------------------------------------------

    async def snapshot(self, session: Session, cid: str, name: str, quota: int) -> SnapshotView: ...

    async def snapshots(self, session: Session, cid: str) -> list[SnapshotView]: ...

    async def snapshot_info(self, session: Session, cid: str, sid: str) -> SnapshotView: ...

    async def delete_snapshot(self, session: Session, cid: str, sid: str) -> None: ...

    async def restore(self, session: Session, cid: str, sid: str) -> SnapshotView: ...

    async def fork(self, session: Session, cid: str, to: str, sid: str | None) -> Forked: ...

    async def snapshot_bytes(self, session: Session) -> int: ...


class StoreNotConfigured(NotConfigured):
    """Seed 003's records need the object store (or the embedded default's records);
    no retry cures that, so no ``Retry-After``."""

    code = "store_not_configured"


class RuntimeFiles:
    """What every mode shares: the runtime client, the pre-checks, the cache's reads."""

    def __init__(self, backend: Backend, http: httpx.AsyncClient) -> None:
        self.backend = backend
        self.http = http

    def client(self, session: Session) -> RuntimeClient:
        assert session.endpoint is not None, "the session runs (ensure_running)"
        return RuntimeClient(self.http, session.endpoint)

    async def precheck(self, session: Session, upload: Upload) -> str | None:
        """Before a byte of the body is sent: a declared length over the session's limit
        is 413, and a conversation known up front is opened (refused while it is being
        deleted or its workspace is disabled). Answers that conversation, if known."""
        limit = session.spec.file_upload.max_file_size_bytes
        declared = upload.declared_length
        if declared and declared.isdigit() and int(declared) > limit + MULTIPART_OVERHEAD:
            raise TooLarge(f"file is larger than the limit of {limit} bytes")
        given = upload.conversation_id
        if given is not None:
            await self.backend.conversation_opened(session, given)
        return given

    async def listing(self, session: Session, cid: str) -> UploadList:
        return await self.client(session).list_uploads(cid)

    async def session_listing(self, session: Session) -> list[UploadedFile]:
        client = self.client(session)
        ids = await client.list_conversations()
        listings = await asyncio.gather(*(client.list_uploads(c) for c in ids))
        return [f for listing in listings for f in listing.files]

    async def resolve(
        self, session: Session, ref: str, cid: str | None, *, outputs: bool
    ) -> FileRef:
        """A file reference; a bare name without conversation is looked up in the
        session: exactly one conversation holds it, else 404 (none) or 409 (several)."""
        if cid is not None or "/" in ref:
            return parse_file_ref(ref, cid, session.workspace_path, allow_outputs=outputs)
        name = ids.file_name_or_400(ref)
        holders = await self.client(session).list_conversations(holding=name)
        if not holders:
            raise NotFoundError(f"no conversation of this session has an upload named '{name}'")
        if len(holders) > 1:
            raise Conflict(
                f"'{name}' exists in several conversations ({', '.join(holders)}); "
                "name one with conversation_id",
                code="ambiguous_file_name",
            )
        return FileRef(holders[0], "uploads", (name,))

    async def open_cached(self, session: Session, ref: FileRef) -> httpx.Response:
        client = self.client(session)
        if ref.area == "outputs":
            return await client.open_output(ref.conversation_id, list(ref.parts))
        return await client.open_download(ref.conversation_id, ref.name)
