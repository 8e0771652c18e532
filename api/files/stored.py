"""``StoredFiles``: the file service when the object store is the files' source of truth
(``SANDBOX_WORKSPACE_STORE=s3``); the sandbox's workspace is its cache.

Contract (see ``files.base``; the synchronisation itself is ``StoreBackend``'s):
- an upload goes to the cache and the store in one pass, and is recorded;
- a listing or a download of a conversation the store holds fills the cache first (once
  per runtime), so a read never misses a file the store has; a download serves the
  cache's copy only when its digest is the one recorded, else the recorded version from
  the store — never bytes the store does not hold;
- a deletion, by name or path (v1) or by ``file_id`` (seed 003), removes the object and
  the cache's copy and marks the record deleted, under the conversation's fence; a fill
  writes back only active records, so a deleted file never comes back, on any route,
  after any refill (resume, new pod, API restart, another replica). A file the cache holds
  but the store never recorded (a write-back that has not happened) is removed from the
  cache alone;
- seed 003's records are the store's metadata.
"""

from __future__ import annotations

from sandbox_workspace.runtime.schemas import UPLOAD_SUBDIR, UploadList, UploadResult
from sandbox_workspace.store.metadata import FileRecord

from ..backends.base import Session
from ..backends.store_backend import StoreBackend, conversation_exists
from ..file_refs import FileRef
from .base import Opened, Records, RuntimeFiles, Upload
from .copies import StoredCopies


def _path(ref: FileRef) -> str:
    """The file's path in the conversation, as its record names it."""
    if ref.area == "outputs":
        return "outputs/" + "/".join(ref.parts)
    return f"uploads/{UPLOAD_SUBDIR}/{ref.name}"


class StoredFiles(StoredCopies, RuntimeFiles):
    top_level_kept = False  # the store keeps uploads/temparea and outputs/ only
    backend: StoreBackend  # (given by app.create_app)

    async def upload(self, session: Session, upload: Upload) -> UploadResult:
        given = await self.precheck(session, upload)
        result, _ = await self.backend.upload(
            session, upload.body, upload.content_type, upload.params, given
        )
        return result

    async def upload_record(self, session: Session, cid: str, upload: Upload) -> FileRecord:
        upload = Upload(upload.body, upload.content_type, upload.declared_length,
                        {**upload.params, "conversation_id": cid})  # fmt: skip
        await self.precheck(session, upload)
        _, record = await self.backend.upload(
            session, upload.body, upload.content_type, upload.params, cid
        )
        return record

    async def listing(self, session: Session, cid: str) -> UploadList:
        await self.backend.filled_for_reading(session, cid)
        return await super().listing(session, cid)

    async def open(self, session: Session, ref: FileRef) -> Opened:
        await self.backend.filled_for_reading(session, ref.conversation_id)
        cached = await self.open_cached(session, ref)
        return await self.backend.verified(session, ref.conversation_id, _path(ref), cached)

    async def delete(self, session: Session, ref: FileRef) -> None:
        await self.backend.delete_path(session, ref.conversation_id, _path(ref))

    # -- seed 003 ----------------------------------------------------------------------

    async def records(self, session: Session, cid: str) -> Records:
        backend = self.backend
        # A read creates nothing: a conversation with no resource and no record is
        # answered empty (one user reading random ids must not fill the cluster).
        if await conversation_exists(backend, session, cid):
            await backend.ensure_filled(session, cid)
        scope = backend.scope(session)
        manifest = await backend.meta.get(scope, cid)
        info = await self.client(session).conversation_info(cid)
        return Records(
            enabled=manifest.workspace_enabled if manifest else True,
            created_at=manifest.workspace_created_at if manifest else None,
            files=[f for f in (manifest.files if manifest else []) if f.active],
            store_prefix=backend.layout.conversation(scope, cid),
            path=info.path,
        )

    async def open_record(self, session: Session, cid: str, file_id: str):
        return await self.backend.open_file(session, cid, file_id)

    async def delete_record(self, session: Session, cid: str, file_id: str) -> FileRecord:
        return await self.backend.delete_file(session, cid, file_id)

    async def set_enabled(self, session: Session, cid: str, enabled: bool) -> None:
        await self.backend.set_enabled(session, cid, enabled)
