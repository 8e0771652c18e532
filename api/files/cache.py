"""``CacheFiles``: the file service when the sandbox's workspace holds the files
(``SANDBOX_WORKSPACE_STORE=local``, the embedded default).

Contract (see ``files.base``): an upload streams through to the runtime, its last chunk
held until the conversation is tracked (``GuardedBody``), and the backend is told after the
commit (``conversation_written``); downloads and deletions are the runtime's. Nothing else
keeps a copy of the bytes, so a deletion here is final.

Seed 003's records (file ids, versions, descriptions, ``workspace_enabled``) are kept by
``RecordsBackend`` where the backend has a place for them (the local backend: beside its
sessions), with the store mode's contract; files by ``file_id`` are served from the
workspace. A backend without one (kubernetes with no object store) answers seed 003's
routes 503 ``store_not_configured``.
"""

from __future__ import annotations

import httpx

from sandbox_workspace.contract.errors import NotFoundError
from sandbox_workspace.runtime.schemas import UploadResult
from sandbox_workspace.store.metadata import FileRecord

from ..backends.base import Backend, Session
from ..backends.cache_records import RecordsBackend
from ..backends.store_cache import OUTPUTS, UPLOADS
from ..backends.store_upload import TeeUpload
from ..file_refs import FileRef
from ..upload_guard import GuardedBody
from .base import Opened, Records, RuntimeFiles, StoreNotConfigured, Upload
from .copies import CacheCopies


class CacheFiles(CacheCopies, RuntimeFiles):
    top_level_kept = True  # the session's volume holds the whole conversation

    def __init__(
        self, backend: Backend, http: httpx.AsyncClient, records: RecordsBackend | None = None
    ) -> None:
        super().__init__(backend, http)
        self._records = records

    async def upload(self, session: Session, upload: Upload) -> UploadResult:
        return await self._upload(session, upload, await self.precheck(session, upload))

    async def _upload(
        self, session: Session, upload: Upload, given: str | None, form: TeeUpload | None = None
    ) -> UploadResult:
        body = GuardedBody(
            upload.body,
            upload.content_type,
            given,
            lambda cid: self.backend.conversation_opened(session, cid),
        )
        try:
            result = await self.client(session).upload(
                aiter(body), upload.content_type, upload.params
            )
        except Exception:
            # The guard, or the form's reader, cut the body short: say why.
            if (error := body.error or (form and form.error)) is not None:
                raise error from None
            raise
        await self.backend.conversation_written(session, result.conversation_id)
        return result

    async def open(self, session: Session, ref: FileRef) -> Opened:
        return await self.open_cached(session, ref)

    async def delete(self, session: Session, ref: FileRef) -> None:
        await self.client(session).delete_upload(ref.conversation_id, ref.name)

    # -- seed 003 ----------------------------------------------------------------------

    def records_kept(self) -> RecordsBackend:
        if self._records is None:
            raise StoreNotConfigured(
                "seed 003's file records need the object store on this backend: set "
                "SANDBOX_WORKSPACE_STORE=s3 and SANDBOX_WORKSPACE_S3__BUCKET"
            )
        return self._records

    async def upload_record(self, session: Session, cid: str, upload: Upload) -> FileRecord:
        records = self.records_kept()
        upload = Upload(upload.body, upload.content_type, upload.declared_length,
                        {**upload.params, "conversation_id": cid})  # fmt: skip
        await self.precheck(session, upload)
        await records.records(session, cid)  # the conversation keeps records from now on
        # The form read as the store mode reads it (``path``, ``description``); no put.
        form = TeeUpload(records.store, lambda *_: "", upload.body, upload.content_type, cid,
                         raw=False)  # fmt: skip
        params = {**upload.params, **await form.open()}
        result = await self._upload(
            session, Upload(form.body(), upload.content_type, None, params), cid, form
        )
        return await records.described(
            session, cid, result.name, form.original_name(), form.description()
        )

    async def records(self, session: Session, cid: str) -> Records:
        manifest = await self.records_kept().records(session, cid)
        info = await self.client(session).conversation_info(cid)
        return Records(
            enabled=manifest.workspace_enabled,
            created_at=manifest.workspace_created_at,
            files=[f for f in manifest.files if f.active],
            store_prefix="",  # no bucket: the files are the workspace's
            path=info.path,
        )

    async def _record(self, session: Session, cid: str, file_id: str) -> FileRecord:
        record = await self.records_kept().by_id(session, cid, file_id)
        if record is None:
            raise NotFoundError(f"no file '{file_id}' in conversation '{cid}'")
        return record

    async def open_record(self, session: Session, cid: str, file_id: str):
        record = await self._record(session, cid, file_id)
        if record.file_path.startswith(OUTPUTS):
            ref = FileRef(cid, "outputs", tuple(record.file_path[len(OUTPUTS) :].split("/")))
        else:
            ref = FileRef(cid, "uploads", (record.file_path[len(UPLOADS) :],))
        response = await self.open_cached(session, ref)
        return record, _Body(response)

    async def delete_record(self, session: Session, cid: str, file_id: str) -> FileRecord:
        record = await self._record(session, cid, file_id)
        gone = await self.records_kept().delete(session, cid, record)
        if gone is None:  # deleted meanwhile by another request
            raise NotFoundError(f"no file '{file_id}' in conversation '{cid}'")
        return gone

    async def set_enabled(self, session: Session, cid: str, enabled: bool) -> None:
        await self.records_kept().set_enabled(session, cid, enabled)


class _Body:
    """A runtime download as the store's ``Download`` reads (iterate, then ``aclose``)."""

    def __init__(self, response) -> None:
        self.response = response

    def __aiter__(self):
        return aiter(self.response.aiter_raw())

    async def aclose(self) -> None:
        await self.response.aclose()
