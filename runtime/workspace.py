"""The workspace on disk: conversation directories, user uploads, deletion.

Layout beneath the root (``/workspace`` in a pod)::

    {conversation_id}/uploads/temparea/{file}   user uploads — the path agent code opens
    {conversation_id}/outputs/                   agent outputs, never listed as uploads
    .runtime/                                    the runtime's own state (``state``):
        staging/                                 partial uploads, renamed into place whole
        meta/{conversation_id}/{hash}.json       upload metadata (``metastore``)
        marks/{conversation_id}.json             what runs modified/presented (``marks``)
        scratch                                  the runtimes' scratch roots (``scratch``)

Contract: every access goes through ``pathsafe.SafeRoot`` (no symlink is ever followed);
conversation ids starting with "." are refused (the runtime's state lives there).
Uploads are files only while they are the very files we stored (``upload_files``: same
inode; its ``sha256`` is the uploaded bytes', ``modified: true`` once code changed them).
State damaged anyway is
repaired at start (``migrate`` for old layouts) and on use. While ``deleting(cid)`` is
held, nothing may create or write the conversation: 409 ``conversation_deleting``.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from sandbox_workspace.contract import ids
from sandbox_workspace.contract.errors import ApiError, BadRequest, Conflict, NotFoundError

from . import pathsafe, tree
from .gate import DeletionGate
from .marks import MarksStore
from .metastore import MetaStore
from .migrate import migrate
from .recover import verify_uploads
from .schemas import (
    UPLOAD_SUBDIR,
    ConversationDeleted,
    ConversationInfo,
    Marks,
    MarksReport,
)
from .scratch import ScratchLeft, ScratchRecords
from .staging import Staging
from .state import StateDir
from .upload_files import UploadFiles

log = logging.getLogger(__name__)

# Counting a conversation's files stops here: a tree code made huge costs bounded time.
MAX_COUNTED_ENTRIES = 500_000


class DeletionIncomplete(ApiError):
    """Something of the conversation is still on disk after deleting; retry."""

    status, code = 503, "deletion_incomplete"


class Workspace(UploadFiles):
    """File operations on one workspace root; safe against hostile names and symlinks.
    The upload files' operations are ``upload_files.UploadFiles``'."""

    def __init__(self, root: Path, visible_root: str) -> None:
        self.root = pathsafe.SafeRoot(root)
        self.visible_root = visible_root.rstrip("/") or "/"
        self.state = StateDir(self.root)
        self.meta = MetaStore(self.state)
        self.marks = MarksStore(self.state)
        self.scratch = ScratchRecords(self.state)
        self.state.on_rebuilt = self._restore_state
        self.staging = Staging(self.state)
        self.gate = DeletionGate()
        self.meta.load()
        self.marks.load()
        migrate(self.root, self.meta)
        verify_uploads(self)

    def close(self) -> None:
        self.root.close()

    def _restore_state(self) -> None:
        """``.runtime`` was rebuilt: write back what memory holds."""
        self.meta.rewrite_all()
        self.marks.rewrite_all()
        self.scratch.rewrite_all()

    # -- names ------------------------------------------------------------------------

    # The contract's id rules, as 400s (sandbox_workspace/contract/ids.py).
    check_conversation_id = staticmethod(ids.conversation_id_or_400)
    check_file_name = staticmethod(ids.file_name_or_400)

    @staticmethod
    def check_subdir(subdir: str | None) -> str:
        if subdir in (None, "", UPLOAD_SUBDIR):
            return UPLOAD_SUBDIR
        raise BadRequest(
            f"subdir must be '{UPLOAD_SUBDIR}' (uploads are flat in v1)", code="invalid_subdir"
        )

    def real_path(self, cid: str) -> str:
        """The conversation directory on this machine's disk (for a process's cwd)."""
        return os.path.join(self.root.path, self.check_conversation_id(cid))

    def visible(self, *parts: str) -> str:
        return "/".join([self.visible_root.rstrip("/"), *parts]) if parts else self.visible_root

    @staticmethod
    def uploads_parts(cid: str) -> list[str]:
        return [cid, "uploads", UPLOAD_SUBDIR]

    # -- the deletion gate ------------------------------------------------------------

    def deleting(self, conversation_id: str) -> contextlib.AbstractContextManager[str]:
        """Mark the conversation as being deleted: writes to it answer 409 meanwhile."""
        return self.gate.deleting(self.check_conversation_id(conversation_id))

    def is_deleting(self, cid: str) -> bool:
        return self.gate.is_deleting(cid)

    def refuse_if_deleting(self, cid: str) -> None:
        self.gate.refuse(cid)

    # -- conversations ----------------------------------------------------------------

    def ensure_conversation(self, conversation_id: str) -> ConversationInfo:
        cid = self.ensure_layout(conversation_id)
        return self.conversation_info(cid)

    def ensure_layout(self, conversation_id: str) -> str:
        """Create the conversation's directories if missing; returns the checked id."""
        cid = self.check_conversation_id(conversation_id)
        self.refuse_if_deleting(cid)
        for parts in (self.uploads_parts(cid), [cid, "outputs"]):
            with self.directory(parts, create=True):
                pass
        return cid

    def conversation_info(self, conversation_id: str) -> ConversationInfo:
        cid = self.check_conversation_id(conversation_id)
        count = total = 0
        exists = self.root.exists_dir([cid])
        with self.walk([cid], max_entries=MAX_COUNTED_ENTRIES) as walk:
            for _, st in walk:
                count += 1
                total += st.st_size
        return ConversationInfo(
            conversation_id=cid,
            exists=exists,
            path=self.visible(cid),
            uploads_path=self.visible(*self.uploads_parts(cid)),
            outputs_path=self.visible(cid, "outputs"),
            file_count=count,
            total_bytes=total,
            complete=walk.complete,
        )

    def record_marks(self, conversation_id: str, report: MarksReport) -> Marks:
        """Note what a run modified and presented. Synchronous on purpose: the gate check
        and the write happen with no deletion starting in between."""
        cid = self.check_conversation_id(conversation_id)
        self.refuse_if_deleting(cid)
        if not self.root.exists_dir([cid]):
            raise NotFoundError(f"conversation '{cid}' does not exist")
        prefix = self.visible(cid) + "/"
        paths = [c.path for c in report.changed] + report.presented
        outside = next((p for p in paths if not p.startswith(prefix) or "/../" in p), None)
        if outside is not None:
            raise BadRequest(
                f"marks name files of conversation '{cid}' by full path (starting "
                f"'{prefix}'); {outside!r} is not one",
                code="invalid_marks",
            )
        marks = self.marks.record(
            cid,
            modified=[c.path for c in report.changed if c.status == "modified"],
            created=[c.path for c in report.changed if c.status == "created"],
            presented=report.presented,
        )
        return Marks(conversation_id=cid, modified=[*marks.modified], presented=[*marks.presented])

    def conversation_ids(self) -> list[str]:
        with self.root.directory([]) as fd:
            return sorted(n for n in os.listdir(fd) if not n.startswith("."))

    def delete_conversation(self, conversation_id: str) -> ConversationDeleted:
        """Delete the directory and the conversation's state, then verify both are gone.
        Call it inside ``deleting(cid)``, once no process of the conversation runs."""
        cid = self.check_conversation_id(conversation_id)
        try:
            with self.root.directory([]) as fd:
                # Whatever is there — a directory, or a symlink planted by code (removed,
                # never followed) — goes.
                existed = tree.entry_exists(fd, cid)
                pathsafe.remove_tree(fd, cid)
                gone = not tree.entry_exists(fd, cid)
            state_gone = self.meta.drop(cid) & self.marks.drop(cid)
        except OSError as e:
            raise DeletionIncomplete(
                f"conversation '{cid}' could not be deleted completely ({e}); retry"
            ) from e
        if not (gone and state_gone):
            what = "its directory" if not gone else "its upload metadata or marks"
            raise DeletionIncomplete(f"conversation '{cid}': {what} is still on disk; retry")
        log.info("conversation deleted", extra={"conversation_id": cid, "existed": existed})
        return ConversationDeleted(conversation_id=cid, deleted=existed, exists=False)

    def remove_scratch_leftovers(self) -> None:
        """Every recorded scratch root goes (``scratch``): call it only while no runtime
        runs on this workspace (the local backend, deleting with the session down)."""
        try:
            self.scratch.remove_leftovers()
        except (ScratchLeft, OSError) as e:
            raise DeletionIncomplete(f"scratch space could not be deleted ({e}); retry") from e

    @contextlib.contextmanager
    def walk(self, parts: list[str], *, max_entries: int) -> Iterator[tree.Walk]:
        """Regular files beneath ``parts`` (iterative, bounded, no link followed)."""
        try:
            fd = self.root.open_dir(parts)
        except (pathsafe.NotFound, pathsafe.UnsafePath, NotADirectoryError, PermissionError):
            yield tree.walk_files(-1, max_entries=max_entries)
            return
        try:
            yield tree.walk_files(fd, max_entries=max_entries)
        finally:
            os.close(fd)

    # -- state ------------------------------------------------------------------------

    def check_state(self) -> None:
        """One fstatat; when ``.runtime`` was replaced, rebuild it (metadata is rewritten
        from memory by ``StateDir.on_rebuilt``)."""
        if not self.state.intact():
            self.state.repair()

    @contextlib.contextmanager
    def directory(self, parts: list[str], *, create: bool = False) -> Iterator[int]:
        try:
            with self.root.directory(parts, create=create) as fd:
                yield fd
        except pathsafe.NotFound as e:
            raise NotFoundError(f"'{'/'.join(parts[:1])}' has no such directory") from e
        except pathsafe.UnsafePath as e:
            raise BadRequest(str(e), code="unsafe_path") from e
        except NotADirectoryError as e:
            raise BadRequest(f"'{'/'.join(parts)}' is not a directory", code="unsafe_path") from e
        except PermissionError as e:  # not ours to chmod back (another owner)
            raise Conflict(
                f"'{'/'.join(parts)}' is not accessible to the runtime", code="not_accessible"
            ) from e
