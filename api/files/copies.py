"""Snapshots, restores and forks of a conversation: the file service's part (mixed into
``StoredFiles`` as ``StoredCopies`` and into ``CacheFiles`` as ``CacheCopies``), so the
routes stay mode-blind and go through the file service like every file route.

Contract, both modes:
- ``snapshot`` copies the conversation's files (uploads and outputs; in ``local`` mode
  the whole conversation directory) into an immutable snapshot, refused with 413
  ``snapshot_quota_exceeded`` — before anything is copied — when the user's snapshots
  would then hold more than ``quota`` bytes; 404 for a conversation that does not exist.
  ``SnapshotView.state`` says which files it holds: ``last_write_back`` in ``s3`` mode
  (the store's files as last written back; taken after any write-back in progress, so
  what a running execution has not written back yet is not in it), ``live`` in ``local``
  mode (the workspace's files at that instant).
- ``restore`` makes the files exactly the snapshot's and stops the conversation's
  processes: the Python state is not in a snapshot, the next execution starts a new
  kernel (``Restored.kernel_restarted``).
- ``fork`` makes ``to`` a new conversation of the same session (tracked by the backend as
  any new conversation: its ConversationWorkspace and finalizer on kubernetes, counted
  against the user's conversation cap) holding copies of the files of ``cid`` or of one
  of its snapshots — never a shared object or inode. 409 when ``to`` exists; whatever
  fails, nothing of ``to`` is left (it is deleted as a conversation is). In ``s3`` mode
  the same fork asked again (same ``cid``, snapshot and ``to``) is idempotent: one that
  completed answers as its conversation now is; one a crash cut off at any point (the API
  killed mid-fork) is completed, or deleted when its source is gone.

How a fork cut off is told from any other conversation — two records, each written by
the API only (never where code in a sandbox can write):
- the store's mark (``StoreCopies.fork_mark``), from before the first copy until done;
- before it, the origin the backend recorded in the step that created the conversation
  (``Backend.fork_opened``: the ConversationWorkspace's annotation on kubernetes, a record
  in the API's data directory locally). It counts only while the conversation has no
  records in the store (the mark comes before any): a conversation written to since —
  by anyone — is not claimed by the fork asked again (409).
Why the creation itself carries it: the resource must come first (no object of the fork
may exist untracked), so no record in the store can precede it; an origin written in
another step would leave a window in which the retry meets a conversation with neither.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from sandbox_workspace.contract.errors import ApiError, ConversationDeleting, NotFoundError
from sandbox_workspace.store.snapshots import ForkMark, Snapshot, StoreCopies, new_id

from ..backends.base import ConversationExists, ConversationPhase, ForkOrigin, Session
from ..backends.store_backend import StoreBackend, conversation_exists
from ..keyed_locks import KeyedLocks
from ..quotas import QuotaExceeded

KERNEL_NOTE = (
    "the files are the snapshot's; the Python state (variables, imports) is not in a "
    "snapshot: the conversation's processes were stopped and the next execution starts a "
    "new interpreter"
)


class SnapshotQuotaExceeded(ApiError):
    status, code = 413, "snapshot_quota_exceeded"


class ForkQuotaExceeded(ApiError):
    """A fork over the user's conversation cap: 429, as the issue's limits ask; waiting
    does not help, deleting conversations does (so no ``Retry-After``)."""

    status, code = 429, "quota_exceeded"
    transient = False


SnapshotView = Snapshot  # in ``local`` mode with no records (the workspace holds them)
# A snapshot's quota check and its copies under one lock per session (= per user): two
# snapshots of two conversations at once both read the bytes held before either was
# made, and both passed (found in session 13). Per process: two replicas can
# still both pass by one snapshot (docs/security.md).
_QUOTA = KeyedLocks()


@dataclass(frozen=True)
class Forked:
    conversation_id: str
    file_count: int
    bytes: int


def _over(used: int, adding: int, quota: int) -> None:
    if used + adding > quota:
        raise SnapshotQuotaExceeded(
            f"this snapshot ({adding} bytes) would bring your snapshots to {used + adding} "
            f"bytes, over the quota of {quota} (SANDBOX_WORKSPACE_QUOTAS__SNAPSHOT_BYTES_PER_"
            "USER); delete snapshots first"
        )


async def _undo_fork(backend, session: Session, to: str) -> None:
    await asyncio.shield(backend.delete_conversation(session, to))


class StoredCopies:
    """``s3`` mode: server-side copies in the store (``store.snapshots``)."""

    backend: StoreBackend

    def _copies(self) -> StoreCopies:
        return self.backend.copies  # its errors are the API's (``store_errors``)

    async def _existing(self, session: Session, cid: str) -> None:
        """404 unless the conversation exists; checked again inside ``writing``, where
        no deletion of this process can go past it: a write to the prefix of a
        conversation already deleted would outlive it (a leaked snapshot, found by
        tests/api/test_snapshots.py's racing test)."""
        if not await conversation_exists(self.backend, session, cid):
            raise NotFoundError(f"conversation '{cid}' not found")

    async def snapshot(self, session: Session, cid: str, name: str, quota: int) -> SnapshotView:
        await self._existing(session, cid)
        b = self.backend
        scope = b.scope(session)
        async with b.writing(session, cid):  # after a write-back in progress
            await self._existing(session, cid)  # again: a deletion may have gone first
            manifest = await b.meta.get(scope, cid)
            size = sum(r.file_size for r in (manifest.files if manifest else []) if r.active)
            copies = self._copies()
            async with _QUOTA.hold((scope.tenant, scope.session_id)):
                held = await copies.stored_bytes(b.layout.session(scope.tenant, scope.session_id))
                _over(held, size, quota)
                return await copies.create(scope, cid, name)

    async def snapshots(self, session: Session, cid: str) -> list[SnapshotView]:
        await self._existing(session, cid)
        return await self._copies().list(self.backend.scope(session), cid)

    async def snapshot_info(self, session: Session, cid: str, sid: str) -> SnapshotView:
        await self._existing(session, cid)
        return await self._copies().get(self.backend.scope(session), cid, sid)

    async def delete_snapshot(self, session: Session, cid: str, sid: str) -> None:
        await self._existing(session, cid)
        async with self.backend.writing(session, cid):
            await self._existing(session, cid)
            await self._copies().delete(self.backend.scope(session), cid, sid)

    async def restore(self, session: Session, cid: str, sid: str) -> SnapshotView:
        await self._existing(session, cid)
        b = self.backend
        async with b.writing(session, cid):
            await self._existing(session, cid)
            snap = await self._copies().restore(b.scope(session), cid, sid)
            # The cache goes whole (its processes first: the runtime's deletion), and is
            # filled again from the store, now the snapshot's files.
            await self.client(session).delete_conversation(cid)
            b.forget(session, cid)
        await b.ensure_filled(session, cid)
        return snap

    async def _fork_state(self, session: Session, to: str) -> ForkMark | None:
        """How far the fork that made the existing ``to`` went (None: no fork made it):
        its store mark, else — cut off before the mark — the origin recorded with its
        creation, while nothing is recorded in it (module docstring)."""
        b = self.backend
        scope = b.scope(session)
        mark = await self._copies().fork_mark(scope, to)
        if mark is not None:
            return mark
        origin = await b.inner.fork_origin(session, to)
        if origin is None or await b.meta.get(scope, to) is not None:
            return None
        return ForkMark(origin.conversation_id, origin.snapshot_id, done=False)

    async def fork(self, session: Session, cid: str, to: str, sid: str | None) -> Forked:
        b = self.backend
        scope = b.scope(session)
        again = None
        if await conversation_exists(b, session, to):
            if await b.conversation_phase(session, to) == ConversationPhase.DELETING:
                raise ConversationDeleting(to)  # never answered as made while it goes
            again = await self._fork_state(session, to)
            if again is None or (again.forked_from, again.snapshot_id) != (cid, sid):
                raise ConversationExists(f"conversation '{to}' exists already")
        try:
            await self._existing(session, cid)
            if sid is not None:
                await self._copies().get(scope, cid, sid)  # 404 before anything
        except NotFoundError:
            if again is not None and not again.done:  # cut off, and now never completed
                await _undo_fork(b, session, to)
            raise
        if again is not None and again.done:
            # The same fork asked again (a client whose answer was lost): answered as
            # the conversation it made now is.
            manifest = await b.meta.get(scope, to)
            records = [r for r in (manifest.files if manifest else []) if r.active]
            return Forked(to, len(records), sum(r.file_size for r in records))
        # New, or the same fork cut off by a crash (copies made, no records): made whole.
        try:
            # Tracked as any new conversation (cap, ConversationWorkspace); not filled:
            # the first use fills it from what the fork writes. A new one is created with
            # its origin (refused when made otherwise meanwhile).
            if again is None:
                await b.inner.fork_opened(session, to, ForkOrigin(cid, sid))
            else:
                await b.inner.conversation_opened(session, to)
        except QuotaExceeded as e:
            raise ForkQuotaExceeded(e.message) from e
        try:
            async with b.writing(session, to):
                if again is not None:  # its cache may hold what it had: none of the files
                    await self.client(session).delete_conversation(to)
                    b.forget(session, to)
                # Its (empty) cache directory now: where conversations are counted by
                # their directories (the local backend), the fork counts from its creation.
                await self.client(session).ensure_conversation(to)
                records = await self._copies().fork(scope, cid, to, sid)
            # The origin deleted meanwhile: what the fork read may be partial (its records
            # gone before they were read read as an empty conversation), so the fork is
            # undone and answers as one made after the deletion would (racing test).
            await self._existing(session, cid)
        except BaseException:
            await _undo_fork(b, session, to)
            raise
        return Forked(to, len(records), sum(r.file_size for r in records))

    async def snapshot_bytes(self, session: Session) -> int:
        b = self.backend
        scope = b.scope(session)
        return await self._copies().stored_bytes(b.layout.session(scope.tenant, scope.session_id))


def _local_view(doc: dict) -> SnapshotView:
    fields = ("snapshot_id", "conversation_id", "name", "created_at", "file_count", "bytes")
    return Snapshot(**{k: doc[k] for k in fields}, state="live", records=[])


class CacheCopies:
    """``local`` mode: the runtime copies on its own volume (``runtime.copies``)."""

    async def _existing(self, session: Session, cid: str):
        info = await self.client(session).conversation_info(cid)
        if not info.exists:
            raise NotFoundError(f"conversation '{cid}' not found")
        return info

    async def snapshot(self, session: Session, cid: str, name: str, quota: int) -> SnapshotView:
        info = await self._existing(session, cid)
        client = self.client(session)
        async with _QUOTA.hold(session.session_id):
            _over(await client.snapshot_bytes(), info.total_bytes, quota)
            return _local_view(await client.snapshot(cid, new_id(), name))

    async def snapshots(self, session: Session, cid: str) -> list[SnapshotView]:
        await self._existing(session, cid)
        return [_local_view(d) for d in await self.client(session).snapshots(cid)]

    async def snapshot_info(self, session: Session, cid: str, sid: str) -> SnapshotView:
        await self._existing(session, cid)
        return _local_view(await self.client(session).get_snapshot(cid, sid))

    async def delete_snapshot(self, session: Session, cid: str, sid: str) -> None:
        await self._existing(session, cid)
        await self.client(session).delete_snapshot(cid, sid)

    async def restore(self, session: Session, cid: str, sid: str) -> SnapshotView:
        await self._existing(session, cid)
        doc = await self.client(session).restore_snapshot(cid, sid)
        await self.backend.conversation_written(session, cid)  # records follow the files
        return _local_view(doc)

    async def fork(self, session: Session, cid: str, to: str, sid: str | None) -> Forked:
        await self._existing(session, cid)
        client = self.client(session)
        if sid is not None:
            await client.get_snapshot(cid, sid)  # 404 before anything
        phase = await self.backend.conversation_phase(session, to)
        if phase != ConversationPhase.ABSENT or (await client.conversation_info(to)).exists:
            raise ConversationExists(f"conversation '{to}' exists already")
        try:
            await self.backend.conversation_opened(session, to)
        except QuotaExceeded as e:
            raise ForkQuotaExceeded(e.message) from e
        try:
            done = await client.fork(cid, to, sid)
            await self.backend.conversation_written(session, to)
        except BaseException:
            await _undo_fork(self.backend, session, to)
            raise
        return Forked(to, done["file_count"], done["bytes"])

    async def snapshot_bytes(self, session: Session) -> int:
        return await self.client(session).snapshot_bytes()
