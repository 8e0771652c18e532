"""``RecordsBackend``: seed 003's file records on the embedded default (the local backend
without an object store), where the sandbox's workspace holds the files themselves.

A decorator of the ``Backend`` protocol, as ``StoreBackend`` is, so routes never branch:
the same metadata documents (``store.metadata``: one per conversation, changed by
compare-and-swap) are kept in a directory store beside the sessions
(``{data_dir}/records``), and no file's bytes are copied anywhere. The rules are the
store mode's (file_id per path, version +1 on a change, ``user_upload`` / ``ai_created`` /
``ai_modified``, ``is_presented``, ``workspace_enabled``); what differs follows from the
cache being the truth:

- A conversation gets records the first time a seed 003 route touches it (``records``,
  an upload by file, ``PATCH``): conversations no seed 003 client uses cost nothing.
- ``conversation_written`` (after an upload, an execution, a tool call) *syncs* a
  conversation that has records: each new or changed file is recorded — an upload's digest
  is the runtime's, a file code changed is hashed through the runtime (an output whose
  size and mtime are what the last sync saw is not read again) — and a record whose file
  is gone from the workspace is marked deleted (a deletion by code is a deletion: there is
  no other copy to bring back).
- ``conversation_opened`` refuses writes while the workspace is disabled.
- Deleting a conversation or a session deletes its records.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from functools import partial

import httpx

from sandbox_workspace.store import ObjectStore
from sandbox_workspace.store.layout import Layout, Scope
from sandbox_workspace.store.metadata import FileRecord, Manifest, Metadata, Written

from ..runtime_client import RuntimeClient
from .base import Backend, Session
from .store_backend import MetadataDecorator
from .store_cache import OUTPUTS, UPLOADS, Hashing, drop_cached, listings
from .store_errors import translated


class RecordsBackend(MetadataDecorator):
    def __init__(self, inner: Backend, http: httpx.AsyncClient, store: ObjectStore) -> None:
        self.inner = inner
        self.http = http
        self.store = translated(store)  # the API's edge: store errors become API errors
        self.layout = Layout()
        self.meta = translated(Metadata(store, self.layout))
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._seen: dict[tuple[str, str, str], tuple[int, str]] = {}  # output → size, mtime

    def _lock(self, session: Session, cid: str) -> asyncio.Lock:
        return self._locks.setdefault((session.session_id, cid), asyncio.Lock())

    # -- the hooks ------------------------------------------------------------------

    async def conversation_opened(self, session: Session, conversation_id: str) -> None:
        await self.inner.conversation_opened(session, conversation_id)
        await self.refuse_disabled(session, conversation_id)

    async def conversation_written(self, session: Session, conversation_id: str) -> None:
        await self.inner.conversation_written(session, conversation_id)
        if await self.meta.get(self.scope(session), conversation_id) is not None:
            await self.sync(session, conversation_id)

    async def delete_conversation(self, session: Session, conversation_id: str) -> bool:
        done = await self.inner.delete_conversation(session, conversation_id)
        async with self._lock(session, conversation_id):
            prefix = self.layout.conversation(self.scope(session), conversation_id)
            await self.store.delete_prefix(prefix)
        self._forget(session.session_id, conversation_id)
        return done

    async def delete_session(self, session_id: str) -> bool:
        existed = await self.inner.delete_session(session_id)
        scope = self.scope(session_id)
        await self.store.delete_prefix(self.layout.session(scope.tenant, session_id))
        self._forget(session_id, None)
        return existed

    def _forget(self, session_id: str, cid: str | None) -> None:
        for k in [k for k in self._seen if k[0] == session_id and cid in (None, k[1])]:
            del self._seen[k]

    # -- records ----------------------------------------------------------------------

    async def records(self, session: Session, cid: str) -> Manifest:
        """The conversation's records, made and brought up to date with its workspace."""
        await self.inner.conversation_opened(session, cid)
        return await self.sync(session, cid)

    async def sync(self, session: Session, cid: str) -> Manifest:
        """Record every new or changed file of the workspace, mark those gone deleted."""
        scope = self.scope(session)
        client = RuntimeClient(self.http, session.endpoint)
        async with self._lock(session, cid):
            manifest = await self.meta.get(scope, cid) or Manifest(cid)
            uploads, outputs = await listings(client, cid)
            for name, f in uploads.items():
                path, old = UPLOADS + name, manifest.active(UPLOADS + name)
                if f.modified:  # changed by code: its bytes now, hashed
                    opener = partial(client.open_download, cid, name)
                    await self._record(scope, cid, path, opener, f.mime_type, old)
                elif old is None or old.checksum != f.sha256:
                    written = Written(path, f.size, f.sha256, f.mime_type, "")
                    await self.meta.record_write(scope, cid, written, uploaded=True)
            for rel, f in outputs.items():
                path = OUTPUTS + rel
                seen = (session.session_id, cid, path)
                stamp = (f.size, f.modified_at.isoformat())
                if self._seen.get(seen) == stamp and manifest.active(path):
                    continue
                opener = partial(client.open_output, cid, rel.split("/"))
                await self._record(scope, cid, path, opener, f.mime_type, manifest.active(path))
                self._seen[seen] = stamp
            present = {UPLOADS + n for n in uploads} | {OUTPUTS + r for r in outputs}
            for record in manifest.files:
                if record.active and record.file_path not in present:
                    await self.meta.mark_deleted(scope, cid, file_id=record.file_id)
                    self._seen.pop((session.session_id, cid, record.file_path), None)
            presented = [UPLOADS + n for n, f in uploads.items() if f.presented] + [
                OUTPUTS + r for r, f in outputs.items() if f.presented
            ]
            if presented:
                await self.meta.mark_presented(scope, cid, presented)
            return await self.meta.get(scope, cid) or await self._made(scope, cid)

    async def _made(self, scope: Scope, cid: str) -> Manifest:
        """An empty conversation's first document (it now has records)."""
        return (await self.meta.update(scope, cid, lambda m: None))[0]

    async def _record(self, scope: Scope, cid: str, path: str, opener, mime_type: str,
                      old: FileRecord | None) -> None:  # fmt: skip
        response = await opener()
        body = Hashing(response.aiter_raw())
        try:
            async for _ in body:
                pass
        finally:
            await response.aclose()
        digest = body.digest.hexdigest()
        if old is None or old.checksum != digest:
            written = Written(path, body.size, digest, mime_type, "")
            await self.meta.record_write(scope, cid, written, uploaded=False)

    async def described(
        self, session: Session, cid: str, name: str, original_name: str | None,
        description: str | None,
    ) -> FileRecord:  # fmt: skip
        """After an upload by seed 003's route: its record, with what the form said."""
        await self.sync(session, cid)
        path = UPLOADS + name

        def change(m: Manifest) -> FileRecord:
            record = m.active(path)
            assert record is not None, "synced after its upload"
            new = replace(
                record,
                description=record.description if description is None else description,
                original_name=original_name or record.original_name,
            )
            if new != record:
                m.replace(record, new)
            return new

        async with self._lock(session, cid):
            return (await self.meta.update(self.scope(session), cid, change))[1]

    async def by_id(self, session: Session, cid: str, file_id: str) -> FileRecord | None:
        manifest = await self.sync(session, cid)
        record = manifest.by_id(file_id)
        return record if record is not None and record.active else None

    async def delete(self, session: Session, cid: str, record: FileRecord) -> FileRecord | None:
        """Remove the file from the workspace and mark its record deleted, together (a
        sync in between would find it gone first); None when it was deleted meanwhile."""
        async with self._lock(session, cid):
            await drop_cached(RuntimeClient(self.http, session.endpoint), cid, record.file_path)
            self._seen.pop((session.session_id, cid, record.file_path), None)
            return await self.meta.mark_deleted(self.scope(session), cid, file_id=record.file_id)

    async def set_enabled(self, session: Session, cid: str, enabled: bool) -> None:
        await self.inner.conversation_opened(session, cid)
        async with self._lock(session, cid):
            await self.meta.set_enabled(self.scope(session), cid, enabled)
