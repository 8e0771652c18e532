"""``StoreBackend``: any backend, with an object store as the source of truth of its files
(``SANDBOX_WORKSPACE_STORE=s3``). The sandbox's workspace becomes a cache.

A decorator of the ``Backend`` protocol, so routes never branch on the store mode: the
hooks every route already calls around writes carry the synchronisation.

- ``conversation_opened`` (before anything of a conversation is written, executed or
  uploaded): the first time per runtime incarnation, the conversation is *filled* from the
  store — every active file of its metadata that the cache lacks is written back at its
  path (uploads through the runtime's upload route, so the runtime knows them as uploads;
  outputs through its output route, which stages them and never follows a link) — on
  any backend, since the runtime is reached over HTTP.
  A deleted data directory, or a new runtime, therefore gets every file back on first use.
- ``conversation_written`` (after an upload, an execution, a tool call): *write-back* —
  the runtime's listings of uploads and outputs are compared with the metadata; every new
  or changed file is streamed runtime → store (flat memory, SHA-256 computed on the way)
  and recorded: a new upload is ``user_upload``; an upload replaced by the user is a new
  ``user_upload`` version; one changed by code (the runtime's ``modified``) is
  ``ai_modified``; a new output is ``ai_created``, a changed one ``ai_modified``. An
  output whose size and mtime are what the last write-back saw is not read again. Files
  a run presented (``present_file``, kept as the runtime's marks) become
  ``is_presented``. Chat runs write back after every tool call and after the run's marks.
- ``delete_conversation`` / ``delete_session`` delete the store prefix too, and count a
  deletion complete only when nothing is left under it.
- Every write to a conversation's prefix (an upload's object, a write-back, a file's
  deletion, the metadata) is *fenced* (``_fenced``, the inner backend's
  ``store_writing``): refused once the conversation is being deleted, and while it runs
  a deletion does not look for the prefix to be empty — on kubernetes the writer is
  announced on the ConversationWorkspace and the operator's finalizer waits for it; on
  the local backend this process's lock per conversation orders writers and deletion.
  A writer whose hold outlived its lease while the conversation went (``late``) removes
  the prefix itself and is refused: no object outlives its conversation's deletion.

The runtime stays store-free: the API moves the bytes, the sandbox holds no credential.
Not synchronised: files code writes outside ``uploads/temparea`` and ``outputs`` (the
conversation directory's top level), and deletions made by code (a file the cache lacks
is filled back, since a lost cache and a deleted file look the same).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from functools import partial
from typing import Any

import httpx

from sandbox_workspace.contract.errors import Conflict, ConversationDeleting, NotFoundError
from sandbox_workspace.operator import naming
from sandbox_workspace.runtime.raw_upload import FEATURE as RAW_UPLOAD
from sandbox_workspace.runtime.schemas import UploadResult
from sandbox_workspace.store import Download, ObjectStore
from sandbox_workspace.store.layout import DEFAULT_TENANT, Layout, Scope
from sandbox_workspace.store.metadata import FileRecord, Manifest, Metadata, Written, now
from sandbox_workspace.store.snapshots import StoreCopies

from ..keyed_locks import KeyedLocks
from ..runtime_client import RuntimeClient, RuntimeRefused
from ..upload_guard import GuardedBody
from .base import Backend, ConversationPhase, Session
from .store_cache import OUTPUTS, UPLOADS, drop_cached, fill_upload, listings
from .store_errors import StoreFailure, translated
from .store_upload import TeeUpload
from .store_writeback import Copy, copy_all

# How long after this process made a conversation its next open takes the metadata as
# absent (``StoreBackend.conversation_opened``): the E2B create and its first command.
MADE_SECONDS = 2.0
_MADE_MAX = 10_000

log = logging.getLogger(__name__)


class WorkspaceDisabled(Conflict):
    """The conversation's workspace is disabled (seed 003's workspace_enabled=false)."""

    code = "workspace_disabled"

    def __init__(self, conversation_id: str) -> None:
        super().__init__(
            f"the workspace of conversation '{conversation_id}' is disabled "
            "(workspace_enabled=false): uploads, executions and file tools are refused; "
            "enable it with PATCH …/workspace/{conversation_id}"
        )


class UploadOvertaken(Conflict):
    """The upload's file was deleted or replaced in the cache while this upload was in
    flight (after the runtime committed it, before it was recorded): the later operation
    wins, nothing of this upload is kept."""

    code = "upload_overtaken"

    def __init__(self, name: str) -> None:
        super().__init__(
            f"'{name}' was deleted or replaced while this upload was in flight; nothing of "
            "this upload was kept: upload it again if it is still wanted"
        )


_FILL_CONCURRENCY = 8
_MAX_RUNTIMES_KNOWN = 10_000  # runtimes whose raw-upload answer is kept
_NAMING_HEADERS = ("content-disposition", "x-sandbox-path")


class StoredResponse:
    """A store download dressed as the runtime's answer (headers, ``aiter_raw``)."""

    def __init__(self, record: FileRecord, download: Download, naming: dict[str, str]) -> None:
        self.download = download
        self.headers = {
            **naming,
            "content-type": record.mime_type,
            "content-length": str(record.file_size),
            "x-content-sha256": record.checksum,
        }

    def aiter_raw(self) -> AsyncIterator[bytes]:
        return aiter(self.download)

    async def aclose(self) -> None:
        await self.download.aclose()


_UNREAD = object()  # no manifest read yet (``refuse_disabled``, ``ensure_filled``)


class MetadataDecorator:
    """What the decorators that keep seed 003's metadata share (``StoreBackend`` here,
    ``cache_records.RecordsBackend``): the inner backend for everything else, the store
    checked at start and closed at the end, a disabled workspace refused."""

    inner: Backend
    store: ObjectStore
    meta: Metadata

    def __getattr__(self, name: str) -> Any:  # everything else is the inner backend's
        return getattr(self.inner, name)

    @staticmethod
    def scope(session: Session | str) -> Scope:
        """The session's keys: its tenant (read from its id) and the session."""
        sid = session if isinstance(session, str) else session.session_id
        return Scope(naming.tenant_of(sid) or DEFAULT_TENANT, sid)

    async def start(self) -> None:
        await self.store.check()
        await self.inner.start()

    async def aclose(self) -> None:
        await self.inner.aclose()
        await self.store.aclose()

    async def refuse_disabled(
        self, session: Session, conversation_id: str, manifest: Any = _UNREAD
    ) -> None:
        """``manifest``: the conversation's metadata when the caller has just read it (the
        fill did), so it is not read twice."""
        if manifest is _UNREAD:
            manifest = await self.meta.get(self.scope(session), conversation_id)
        if manifest is not None and not manifest.workspace_enabled:
            raise WorkspaceDisabled(conversation_id)


class StoreBackend(MetadataDecorator):
    def __init__(
        self, inner: Backend, http: httpx.AsyncClient, store: ObjectStore, layout: Layout
    ) -> None:
        self.inner = inner
        self.http = http
        self.store = translated(store)  # the API's edge: store errors become API errors
        self.layout = layout
        meta = Metadata(store, layout)
        self.meta = translated(meta)
        self.copies = translated(StoreCopies(store, layout, meta))  # snapshots and forks
        # (session, runtime url, token and incarnation, cid): filled once per runtime.
        self._filled: set[tuple[str, str, str]] = set()
        self._seen: dict[tuple[str, str, str], tuple[int, str]] = {}  # output → size, mtime
        self._locks = KeyedLocks()  # per (session, conversation), only while in use
        self._takes_raw: dict[tuple[str, str], bool] = {}  # runtime → takes raw uploads
        # (session, cid) → when this process made the conversation (``conversation_created``)
        self._made: dict[tuple[str, str], float] = {}

    def _lock(self, session: Session, cid: str) -> contextlib.AbstractAsyncContextManager:
        return self._locks.hold((session.session_id, cid))

    @contextlib.asynccontextmanager
    async def _fenced(self, session: Session, cid: str) -> AsyncIterator[None]:
        """Around a write to the conversation's prefix, with ``_lock`` held (see the
        module docstring): refused (``ConversationDeleting``) when the conversation is
        being deleted; a late writer removes the prefix and is refused."""
        fence = None
        try:
            async with self.inner.store_writing(session, cid) as fence:
                yield
        finally:
            if fence is not None and fence.late:
                log.warning("a store write outlived its lease through a deletion: undone")
                prefix = self.layout.conversation(self.scope(session), cid)
                await asyncio.shield(self.store.delete_prefix(prefix))
                raise ConversationDeleting(cid)

    @contextlib.asynccontextmanager
    async def writing(self, session: Session, cid: str) -> AsyncIterator[None]:
        """Held around a write to the conversation's prefix made outside this class (a
        snapshot, a restore, a fork: ``files.copies``): after this process's write-backs,
        and fenced against the conversation's deletion, as every write here is."""
        async with self._lock(session, cid), self._fenced(session, cid):
            yield

    def forget(self, session: Session, cid: str) -> None:
        """The cache of ``cid`` is gone (a restore cleared it): fill it again on use."""
        self._forget(session.session_id, cid)

    # -- the hooks ------------------------------------------------------------------

    async def conversation_opened(self, session: Session, conversation_id: str) -> None:
        """Before a write: tracked, filled, and refused when the workspace is disabled
        (the first open reads the metadata once, for both). Within ``MADE_SECONDS`` of
        this process making it (an E2B sandbox's create, then its first command), the
        metadata is known to be absent — enabled — and is not read: a disable sent to
        another replica in that moment is the race any disable has with a write."""
        manifest = await self.ensure_filled(session, conversation_id)
        made = self._made.get((session.session_id, conversation_id))
        if manifest is _UNREAD and made is not None and time.monotonic() - made < MADE_SECONDS:
            return
        await self.refuse_disabled(session, conversation_id, manifest)

    async def conversation_created(self, session: Session, conversation_id: str) -> None:
        """A new id (``Backend.conversation_created``): tracked, and filled by
        definition — the store holds nothing of it, so it is not read."""
        await self.inner.conversation_created(session, conversation_id)
        key = self._fill_key(session, conversation_id)
        if key is not None:
            self._filled.add(key)
        if len(self._made) >= _MADE_MAX:
            self._made.clear()
        self._made[(session.session_id, conversation_id)] = time.monotonic()

    def _fill_key(self, session: Session, conversation_id: str) -> tuple[str, str, str] | None:
        ep = session.endpoint
        if ep is None:
            return None
        return (session.session_id, f"{ep.url} {ep.token} {ep.incarnation}", conversation_id)

    async def ensure_filled(self, session: Session, conversation_id: str) -> Any:
        """Tracked, and filled once per runtime; answers the metadata when this call read
        it (the fill), else ``_UNREAD``."""
        await self.inner.conversation_opened(session, conversation_id)
        key = self._fill_key(session, conversation_id)
        if key is None or key in self._filled:
            return _UNREAD
        async with self._lock(session, conversation_id):
            if key in self._filled:
                return _UNREAD
            _, manifest = await self._fill(session, conversation_id)
            self._filled.add(key)
            return manifest

    async def filled_for_reading(self, session: Session, conversation_id: str) -> None:
        """Before a read of the cache (a listing, a download): a conversation the store
        holds is filled first, so a read never misses a file the store has (a new
        runtime, an API restart); one the store does not know, or one being deleted, is
        read as the cache has it — a read creates nothing."""
        key = self._fill_key(session, conversation_id)
        if key is None or key in self._filled:
            return
        if await self.meta.get(self.scope(session), conversation_id) is None:
            return
        with contextlib.suppress(ConversationDeleting):
            await self.ensure_filled(session, conversation_id)

    async def conversation_written(self, session: Session, conversation_id: str) -> None:
        await self.inner.conversation_written(session, conversation_id)
        if session.endpoint is not None:
            async with self._lock(session, conversation_id):
                await self.write_back(session, conversation_id)

    async def delete_conversation(self, session: Session, conversation_id: str) -> bool:
        done = await self.inner.delete_conversation(session, conversation_id)
        self._forget(session.session_id, conversation_id)
        if not done:  # the finalizer clears the prefix once no writer holds it
            return False
        async with self._lock(session, conversation_id):  # after this process's writers
            left = await self.store.delete_prefix(
                self.layout.conversation(self.scope(session), conversation_id)
            )
        return left == 0

    async def delete_session(self, session_id: str) -> bool:
        existed = await self.inner.delete_session(session_id)
        await self.store.delete_prefix(
            self.layout.session(self.scope(session_id).tenant, session_id)
        )
        self._forget(session_id, None)
        return existed

    # -- uploads: one pass to the cache and the store ------------------------------------

    async def upload(
        self,
        session: Session,
        source: AsyncIterator[bytes],
        content_type: str,
        params: dict[str, str],
        conversation_id: str | None,
    ) -> tuple[UploadResult, FileRecord]:
        """Stream one multipart upload to the sandbox's cache and to the store at once
        (``store_upload.TeeUpload``); answer the runtime's result and the file's record.
        The last chunk waits until the conversation is open (``GuardedBody``); the object
        is completed only after the runtime committed the file and the conversation is
        still tracked, and recorded (with the form's ``description``) after that."""
        scope = self.scope(session)
        client = RuntimeClient(self.http, session.endpoint)
        tee = TeeUpload(
            self.store,
            lambda cid, name: self.layout.file(scope, cid, UPLOADS + name),
            source,
            content_type,
            conversation_id,
            raw=await self._takes_raw_uploads(client, session.endpoint.incarnation),
        )
        guarded: GuardedBody | None = None
        try:
            params = {**params, **await tee.open()}
            # In raw mode the body is no form: the guard is told the conversation.
            given = tee.conversation if tee.raw else conversation_id
            opened = partial(self.conversation_opened, session)
            guarded = GuardedBody(tee.body(), content_type, given, opened)
            if tee.raw:
                result = await client.upload_raw(aiter(guarded), params)
            else:
                result = await client.upload(aiter(guarded), content_type, params)
            cid = result.conversation_id
            await self.inner.conversation_written(session, cid)
        except BaseException:
            await asyncio.shield(tee.settle(None))
            if (error := (guarded and guarded.error) or tee.error) is not None:
                raise error from None
            raise
        description = tee.description()
        async with self._lock(session, cid):
            try:
                async with self._fenced(session, cid):
                    # A deletion (or another upload) of the name that came between the
                    # runtime's commit and this lock wins: completing the object now would
                    # record a file the cache no longer holds, and the next fill would
                    # bring it back (issue 33: a deleted file never comes back).
                    if not await _still_cached(client, cid, result):
                        raise UploadOvertaken(result.name)
                    etag = await tee.settle(result)
                    if etag is not None:
                        path, mime = UPLOADS + result.name, result.mime_type
                        written = Written(path, result.size, tee.digest, mime, etag)
                        record = await self.meta.record_write(
                            scope,
                            cid,
                            written,
                            uploaded=True,
                            original_name=tee.original_name(),
                            description=description,
                        )
                        return result, record
            finally:
                await asyncio.shield(tee.settle(None))  # refused: no object (else no-op)
        # No object (the form was not teed): copied from the cache, as code's files are.
        return result, await self.record_upload(session, cid, result.name, description)

    async def _takes_raw_uploads(self, client: RuntimeClient, incarnation: str) -> bool:
        """Whether the runtime takes raw uploads — not one of an older release, running
        on through an upgrade (its uploads go as forms; the store gets the file by the
        write-back). Asked once per runtime (its address and incarnation: a new pod may
        reuse an address); one that does not answer is asked again next time."""
        key = (client.base, incarnation)
        known = self._takes_raw.get(key)
        if known is None:
            features = await client.features()
            if features is None:
                return False
            if len(self._takes_raw) >= _MAX_RUNTIMES_KNOWN:
                self._takes_raw.clear()
            known = self._takes_raw[key] = RAW_UPLOAD in features
        return known

    # -- seed 003's file operations --------------------------------------------------------

    async def record_upload(
        self, session: Session, cid: str, name: str, description: str | None
    ) -> FileRecord:
        """After an upload reached the cache: write it back and answer its record (with
        ``description`` when one was given)."""
        path = UPLOADS + name
        scope = self.scope(session)

        def change(m) -> FileRecord:
            record = m.active(path)
            if record is None:
                raise NotFoundError(f"upload '{name}' vanished before it was recorded")
            if description is not None and description != record.description:
                new = replace(record, description=description, updated_at=now())
                m.replace(record, new)
                return new
            return record

        async with self._lock(session, cid):
            await self.write_back(session, cid)
            if description is None:
                manifest = await self.meta.get(scope, cid)
                return change(manifest) if manifest else change(Manifest(cid))
            async with self._fenced(session, cid):
                return (await self.meta.update(scope, cid, change))[1]

    async def set_enabled(self, session: Session, cid: str, enabled: bool) -> None:
        """Seed 003's ``workspace_enabled``: kept in the conversation's metadata (which
        makes the conversation tracked, as any write does)."""
        self._made.pop((session.session_id, cid), None)  # its metadata is read from now on
        await self.ensure_filled(session, cid)
        async with self._lock(session, cid), self._fenced(session, cid):
            await self.meta.set_enabled(self.scope(session), cid, enabled)

    async def _record(self, session: Session, cid: str, file_id: str) -> FileRecord:
        manifest = await self.meta.get(self.scope(session), cid)
        record = manifest.by_id(file_id) if manifest else None
        if record is None or not record.active:
            raise NotFoundError(f"no file '{file_id}' in conversation '{cid}'")
        return record

    async def open_file(self, session: Session, cid: str, file_id: str):
        """The file's record and its bytes from the store (the version recorded)."""
        record = await self._record(session, cid, file_id)
        download = await self._open(session, cid, record)
        if record.etag and download.info.etag != record.etag:
            await download.aclose()
            raise Conflict(f"file '{file_id}' is being changed; retry", code="file_changing")
        return record, download

    async def verified(
        self, session: Session, cid: str, file_path: str, cached: httpx.Response
    ) -> httpx.Response | StoredResponse:
        """A download of ``file_path``: the cache's copy (``cached``) when its recorded
        digest is the metadata's checksum, else the recorded version from the store (the
        source of truth) — so a download never serves bytes the store does not hold."""
        manifest = await self.meta.get(self.scope(session), cid)
        record = manifest.active(file_path) if manifest else None
        if record is None or cached.headers.get("x-content-sha256") == record.checksum:
            return cached
        await cached.aclose()
        record, download = await self.open_file(session, cid, record.file_id)
        kept = {k: cached.headers[k] for k in _NAMING_HEADERS if k in cached.headers}
        return StoredResponse(record, download, kept)

    async def delete_file(self, session: Session, cid: str, file_id: str) -> FileRecord:
        """Remove the file's object and its cache copy, then mark its record deleted."""
        record = await self._record(session, cid, file_id)
        async with self._lock(session, cid), self._fenced(session, cid):
            gone = await self._delete_record(session, cid, record)
        if gone is None:  # deleted meanwhile by another request
            raise NotFoundError(f"no file '{file_id}' in conversation '{cid}'")
        return gone

    async def delete_path(self, session: Session, cid: str, path: str) -> None:
        """Delete the file at ``path`` (v1's delete by name): its object, cache copy and
        record when the store has it, else the cache's copy alone (a write-back that has
        not happened). Decided under the conversation's lock, so an upload of the same
        name settling meanwhile is either seen (recorded: deleted with its record) or sees
        the deletion (``UploadOvertaken``)."""
        scope = self.scope(session)
        async with self._lock(session, cid):
            manifest = await self.meta.get(scope, cid)
            record = manifest.active(path) if manifest else None
            if record is None:
                client = RuntimeClient(self.http, session.endpoint)
                await drop_cached(client, cid, path, missing_ok=False)
                return
            async with self._fenced(session, cid):
                await self._delete_record(session, cid, record)

    async def _delete_record(self, session: Session, cid: str, record: FileRecord):
        scope = self.scope(session)
        await self.store.delete(self.layout.file(scope, cid, record.file_path))
        await self._drop_cached(session, cid, record.file_path)
        gone = await self.meta.mark_deleted(scope, cid, file_id=record.file_id)
        self._seen.pop((session.session_id, cid, record.file_path), None)
        return gone

    async def _drop_cached(self, session: Session, cid: str, path: str) -> None:
        if session.endpoint is not None:
            await drop_cached(RuntimeClient(self.http, session.endpoint), cid, path)

    def _forget(self, session_id: str, cid: str | None) -> None:
        for k in [k for k in self._filled if k[0] == session_id and cid in (None, k[2])]:
            self._filled.discard(k)
        for k in [k for k in self._seen if k[0] == session_id and cid in (None, k[1])]:
            del self._seen[k]
        for made in [m for m in self._made if m[0] == session_id and cid in (None, m[1])]:
            del self._made[made]

    # -- fill: store → cache ---------------------------------------------------------

    async def fill(self, session: Session, cid: str) -> int:
        """Write every active file the cache lacks back at its path; answer how many."""
        return (await self._fill(session, cid))[0]

    async def _fill(self, session: Session, cid: str) -> tuple[int, Manifest | None]:
        """``fill``, with the metadata it read."""
        manifest = await self.meta.get(self.scope(session), cid)
        if manifest is None:
            return 0, None
        client = RuntimeClient(self.http, session.endpoint)
        uploads, outputs = await listings(client, cid)
        missing = []
        for record in manifest.files:
            path = record.file_path
            if not record.active:
                continue
            if path.startswith(UPLOADS) and path[len(UPLOADS) :] not in uploads:
                missing.append(self._fill_upload(session, client, cid, record))
            elif path.startswith(OUTPUTS) and path[len(OUTPUTS) :] not in outputs:
                missing.append(self._fill_output(session, client, cid, record))
        # A few at a time: each waits on the store and on the runtime's fsync.
        gate = asyncio.Semaphore(_FILL_CONCURRENCY)

        async def one(fill) -> None:
            async with gate:
                try:
                    await fill
                except StoreFailure as e:
                    if e.code != "not_found":
                        raise
                    # Deleted meanwhile by another replica (its lock is not ours): the
                    # record says so by now, and the cache must not get the file back.
                    log.info("a file went from the store while being filled: skipped")

        await asyncio.gather(*(one(f) for f in missing))
        filled = len(missing)
        if filled:
            log.info("filled conversation from the store", extra={"files": filled})
        return filled, manifest

    async def _open(self, session: Session, cid: str, record: FileRecord):
        return await self.store.get(self.layout.file(self.scope(session), cid, record.file_path))

    async def _fill_upload(
        self, session: Session, client: RuntimeClient, cid: str, record: FileRecord
    ) -> None:
        name = record.file_path[len(UPLOADS) :]
        download = await self._open(session, cid, record)
        await fill_upload(client, cid, name, record.mime_type, download)

    async def _fill_output(
        self, session: Session, client: RuntimeClient, cid: str, record: FileRecord
    ) -> None:
        """Through the runtime's output route: any backend, the pod holds no credential."""
        parts = record.file_path[len(OUTPUTS) :].split("/")
        download = await self._open(session, cid, record)
        try:
            written = await client.put_output(cid, parts, aiter(download))
        finally:
            await download.aclose()
        # What the runtime now lists is what the store holds: not read back again.
        stamp = (written.size, written.modified_at.isoformat())
        self._seen[(session.session_id, cid, record.file_path)] = stamp

    # -- write-back: cache → store ----------------------------------------------------

    async def write_back(self, session: Session, cid: str) -> list[FileRecord]:
        """Copy every new or changed file of the cache to the store and record it (with
        ``_lock`` held; fenced when there is anything to write)."""
        scope = self.scope(session)
        client = RuntimeClient(self.http, session.endpoint)
        uploads, outputs = await listings(client, cid)
        if not uploads and not outputs:
            # Nothing to copy or mark: no store round trip (most commands write nothing:
            # bench e2b's `echo hi`, a chat's look at its data).
            return []
        manifest = await self.meta.get(scope, cid)
        copies: list[Copy] = []
        stamps: dict[str, tuple] = {}  # output path → its seen key and stamp
        for name, f in uploads.items():
            path = UPLOADS + name
            old = manifest.active(path) if manifest else None
            if old is not None and not f.modified and old.checksum == f.sha256:
                continue
            opener = partial(client.open_download, cid, name)
            key = self.layout.file(scope, cid, path)
            copies.append(Copy(path, key, opener, f.mime_type, uploaded=not f.modified))
        for rel, f in outputs.items():
            path = OUTPUTS + rel
            seen = ((session.session_id, cid, path), (f.size, f.modified_at.isoformat()))
            if self._seen.get(seen[0]) == seen[1] and manifest and manifest.active(path):
                continue
            opener = partial(client.open_output, cid, rel.split("/"))
            key = self.layout.file(scope, cid, path)
            copies.append(Copy(path, key, opener, f.mime_type, output=rel, size=f.size))
            stamps[path] = seen
        # present_file's marks (kept by the runtime at the end of a run) → is_presented.
        presented = [UPLOADS + n for n, f in uploads.items() if f.presented] + [
            OUTPUTS + r for r, f in outputs.items() if f.presented
        ]
        known = {r.file_path: r.is_presented for r in (manifest.files if manifest else [])
                 if r.active}  # fmt: skip
        known.update({c.path: known.get(c.path, False) for c in copies})
        newly = [p for p in presented if p in known and not known[p]]
        if not copies and not newly:
            return []
        async with self._fenced(session, cid):
            # Copied a batch at a time (``store_writeback``); every success is recorded
            # in one metadata change, so nothing copied is left unrecorded, and the first
            # failure is raised after.
            done = await copy_all(self.store, client, cid, copies)
            writes = [(w, c.uploaded) for c, w in zip(copies, done, strict=True)
                      if isinstance(w, Written)]  # fmt: skip
            recorded = await self.meta.record_writes(scope, cid, writes, newly)
            for w in done:
                if isinstance(w, Written) and w.file_path in stamps:
                    key, stamp = stamps[w.file_path]
                    self._seen[key] = stamp
        failed = [e for e in done if isinstance(e, BaseException)]
        if failed:
            raise failed[0]
        return recorded


async def _still_cached(client: RuntimeClient, cid: str, result: UploadResult) -> bool:
    """Whether the cache still holds the upload ``result`` describes (same digest)."""
    try:
        opened = await client.open_download(cid, result.name)
    except RuntimeRefused as e:
        if e.status == 404:
            return False
        raise
    await opened.aclose()
    return opened.headers.get("x-content-sha256") == result.sha256


async def conversation_exists(backend: Backend, session: Session, cid: str) -> bool:
    """Whether anything of the conversation exists: its resource (or, locally, its
    directory), or in store mode its record — a read of a conversation that does not
    exist answers from that, creating nothing."""
    if await backend.conversation_phase(session, cid) != ConversationPhase.ABSENT:
        return True
    if isinstance(backend, StoreBackend):
        return await backend.meta.get(backend.scope(session), cid) is not None
    return False
