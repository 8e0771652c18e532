"""A conversation's uploads as files: list, open, delete and commit them (``Workspace``'s
upload operations, mixed into it).

Contract: a file is an upload only while its record exists (``metastore``) *and* it is
still the very file we stored — same inode, a regular file: a file code put in an upload's
place (a new file, a hard link, a symlink, a FIFO) is never listed, served or counted. An
upload code changed in place stays listed with its current size and ``modified: true``.
Opening checks identity on the open descriptor (no race to win). Committing renames a
complete staged file into temparea (visible whole or not at all) and records it; it
refuses while the conversation is being deleted. Uses the workspace's ``root``, ``meta``,
``marks``, ``staging`` and naming helpers.
"""

from __future__ import annotations

import contextlib
import mimetypes
import os
import stat
from dataclasses import dataclass
from datetime import UTC, datetime

from sandbox_workspace.contract.errors import BadRequest, NotFoundError

from . import pathsafe
from .metastore import UploadMeta
from .schemas import UploadedFile


def guess_mime(name: str) -> str:
    return mimetypes.guess_type(name, strict=False)[0] or "application/octet-stream"


@dataclass(frozen=True)
class OpenedUpload:
    """An upload opened for streaming; the caller owns ``fd``."""

    fd: int
    size: int
    info: UploadedFile


class UploadFiles:
    """Mixed into ``workspace.Workspace``: the upload operations over its state."""

    def list_uploads(self, conversation_id: str) -> list[UploadedFile]:
        cid = self.check_conversation_id(conversation_id)
        self.check_state()
        self.meta.check(cid)
        presented = self.marks.get(cid).presented
        files = [
            self._upload_info(cid, meta, st, presented)
            for meta, st in self.current_uploads(cid)
            if st
        ]
        files.sort(key=lambda f: (f.uploaded_at, f.name))
        return files

    def count_uploads(self, cid: str) -> int:
        return sum(1 for _, st in self.current_uploads(cid) if st)

    def has_upload(self, cid: str, name: str) -> bool:
        return self._current(cid, name) is not None

    def open_upload(self, conversation_id: str, name: str) -> OpenedUpload:
        cid = self.check_conversation_id(conversation_id)
        fname = self.check_file_name(name)
        missing = NotFoundError(f"no uploaded file '{fname}' in conversation '{cid}'")
        meta = self.meta.get(cid, fname)
        if meta is None:
            raise missing
        try:
            fd = self.root.open_file([*self.uploads_parts(cid), fname])
        except (pathsafe.NotFound, pathsafe.UnsafePath, NotADirectoryError, PermissionError) as e:
            raise missing from e
        st = os.fstat(fd)
        if not meta.same_file(st):  # checked on the open descriptor: no race to win
            os.close(fd)
            raise missing
        info = self._upload_info(cid, meta, st, self.marks.get(cid).presented)
        return OpenedUpload(fd=fd, size=st.st_size, info=info)

    def delete_upload(self, conversation_id: str, name: str) -> None:
        cid = self.check_conversation_id(conversation_id)
        fname = self.check_file_name(name)
        current = self._current(cid, fname)
        if self.meta.get(cid, fname) is not None:
            self.meta.remove(cid, fname)
        if current is None:
            raise NotFoundError(f"no uploaded file '{fname}' in conversation '{cid}'")
        with self.directory(self.uploads_parts(cid)) as fd, contextlib.suppress(FileNotFoundError):
            os.unlink(fname, dir_fd=fd)

    def commit_upload(
        self, staged_name: str, staged_fd: int, cid: str, name: str, size: int, sha256: str
    ) -> UploadedFile:
        """Move a complete staged file into temparea and record it; caller holds the lock."""
        self.ensure_layout(cid)  # refuses while the conversation is being deleted
        with self.directory(self.uploads_parts(cid), create=True) as ufd:
            _refuse_directory_target(ufd, name)
            identity = self.staging.move_into(staged_name, staged_fd, ufd, name)
        now = datetime.now(UTC).isoformat()
        meta = UploadMeta.of(
            identity,
            name=name,
            size=size,
            sha256=sha256,
            mime_type=guess_mime(name),
            uploaded_at=now,
        )
        self.meta.put(cid, meta)
        return self._upload_info(cid, meta, identity)

    def current_uploads(
        self, cid: str, *, any_file: bool = False
    ) -> list[tuple[UploadMeta, os.stat_result | None]]:
        """Each recorded upload with the stat of what temparea holds under its name —
        None unless that is the stored file (``any_file``: any regular file)."""
        metas = self.meta.entries(cid)
        if not metas:
            return []
        try:
            fd = self.root.open_dir(self.uploads_parts(cid))
        except (pathsafe.NotFound, pathsafe.UnsafePath, NotADirectoryError, PermissionError):
            return [(m, None) for m in metas]
        result = []
        try:
            for meta in metas:
                try:
                    st = os.stat(meta.name, dir_fd=fd, follow_symlinks=False)
                except OSError:
                    st = None
                keep = st is not None and stat.S_ISREG(st.st_mode)
                keep = keep and (any_file or meta.same_file(st))
                result.append((meta, st if keep else None))
        finally:
            os.close(fd)
        return result

    def upload_blocks(self, cid: str, name: str) -> int:
        """Disk bytes of the upload ``name`` (0 when there is none): what replacing it frees."""
        if self._current(cid, name) is None:
            return 0
        try:
            return self.root.lstat([*self.uploads_parts(cid), name]).st_blocks * 512
        except (pathsafe.NotFound, pathsafe.UnsafePath, NotADirectoryError, PermissionError):
            return 0

    def _current(self, cid: str, name: str) -> UploadMeta | None:
        meta = self.meta.get(cid, name)
        if meta is None:
            return None
        try:
            st = self.root.lstat([*self.uploads_parts(cid), name])
        except (pathsafe.NotFound, pathsafe.UnsafePath, NotADirectoryError, PermissionError):
            return None
        return meta if meta.same_file(st) else None

    def _upload_info(
        self, cid: str, meta: UploadMeta, st: os.stat_result, presented: dict | None = None
    ) -> UploadedFile:
        path = self.visible(*self.uploads_parts(cid), meta.name)
        return UploadedFile(
            name=meta.name,
            path=path,
            size=st.st_size,
            sha256=meta.sha256,
            mime_type=meta.mime_type or guess_mime(meta.name),
            uploaded_at=meta.uploaded_at,
            conversation_id=cid,
            modified=not meta.unchanged(st),
            presented=presented is not None and path in presented,
        )


def _refuse_directory_target(dir_fd: int, name: str) -> None:
    # rename() over a symlink replaces the link itself (safe); over a directory it fails
    # with a confusing errno, so say it plainly.
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        raise BadRequest(f"'{name}' exists as a directory in temparea", code="invalid_file_name")
