"""``CacheFiles``: the file service when the sandbox's workspace holds the files
(``SANDBOX_WORKSPACE_STORE=local``, the embedded default).

Contract (see ``files.base``): an upload streams through to the runtime, its last chunk
held until the conversation is tracked (``GuardedBody``), and the backend is told after the
commit (``conversation_written``); downloads and deletions are the runtime's. Nothing else
keeps a copy, so a deletion here is final. Seed 003's records (file ids, versions,
descriptions) live with the object store: without one they answer 503
``store_not_configured``.
"""

from __future__ import annotations

from sandbox_workspace.runtime.schemas import UploadResult

from ..backends.base import Session
from ..file_refs import FileRef
from ..upload_guard import GuardedBody
from .base import Opened, RuntimeFiles, StoreNotConfigured, Upload


def _needs_store() -> StoreNotConfigured:
    return StoreNotConfigured(
        "the workspace API needs the object store: set SANDBOX_WORKSPACE_STORE=s3 "
        "and SANDBOX_WORKSPACE_S3__BUCKET"
    )


class CacheFiles(RuntimeFiles):
    top_level_kept = True  # the session's volume holds the whole conversation

    async def upload(self, session: Session, upload: Upload) -> UploadResult:
        given = await self.precheck(session, upload)
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
            if body.error is not None:  # the guard cut the body short: say why
                raise body.error from None
            raise
        await self.backend.conversation_written(session, result.conversation_id)
        return result

    async def open(self, session: Session, ref: FileRef) -> Opened:
        return await self.open_cached(session, ref)

    async def delete(self, session: Session, ref: FileRef) -> None:
        await self.client(session).delete_upload(ref.conversation_id, ref.name)

    # -- seed 003: needs the store ---------------------------------------------------------

    async def upload_record(self, session, cid, upload):
        raise _needs_store()

    async def records(self, session, cid):
        raise _needs_store()

    async def open_record(self, session, cid, file_id):
        raise _needs_store()

    async def delete_record(self, session, cid, file_id):
        raise _needs_store()

    async def set_enabled(self, session, cid, enabled):
        raise _needs_store()
