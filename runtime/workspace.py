"""The workspace on disk: conversation directories, user uploads and their metadata.

Layout beneath the root (``/workspace`` in a pod)::

    {conversation_id}/uploads/temparea/{file}   user uploads — the path agent code opens
    {conversation_id}/uploads/.meta/{hash}.json  upload metadata (what makes a file an upload)
    {conversation_id}/outputs/                   agent outputs, never listed as uploads
    .runtime/staging/                            partial uploads, renamed into place when whole

Contract: every access goes through ``pathsafe.SafeRoot`` (no symlink is ever followed);
a file counts as a user upload only while its metadata exists, so files that code writes
into temparea are not listed; uploads become visible atomically (rename) or not at all;
conversation ids starting with "." are refused because the runtime keeps its own state in
dot-directories.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mimetypes
import os
import stat
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from . import pathsafe
from .errors import BadRequest, NotFoundError
from .schemas import (
    UPLOAD_SUBDIR,
    ConversationDeleted,
    ConversationInfo,
    UploadedFile,
    UploadResult,
)

_STAGING = (".runtime", "staging")


def guess_mime(name: str) -> str:
    return mimetypes.guess_type(name, strict=False)[0] or "application/octet-stream"


def _meta_name(file_name: str) -> str:
    # Hash, not the name itself: "{name}.json" could exceed the 255-byte limit.
    return hashlib.sha256(file_name.encode()).hexdigest()[:40] + ".json"


@dataclass(frozen=True)
class OpenedUpload:
    """An upload opened for streaming; the caller owns ``fd``."""

    fd: int
    size: int
    info: UploadedFile


class Workspace:
    """File operations on one workspace root; safe against hostile names and symlinks."""

    def __init__(self, root: Path, visible_root: str) -> None:
        self.root = pathsafe.SafeRoot(root)
        self.visible_root = visible_root.rstrip("/") or "/"
        self._reset_staging()

    def close(self) -> None:
        self.root.close()

    # -- names ------------------------------------------------------------------------

    @staticmethod
    def check_conversation_id(conversation_id: str) -> str:
        try:
            cid = pathsafe.check_name(conversation_id, what="conversation_id")
        except pathsafe.UnsafePath as e:
            raise BadRequest(str(e), code="invalid_conversation_id") from e
        if cid.startswith("."):
            raise BadRequest(
                "conversation_id must not start with '.'", code="invalid_conversation_id"
            )
        return cid

    @staticmethod
    def check_file_name(name: str) -> str:
        try:
            return pathsafe.check_name(name, what="file name")
        except pathsafe.UnsafePath as e:
            raise BadRequest(str(e), code="invalid_file_name") from e

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
    def _uploads(cid: str) -> list[str]:
        return [cid, "uploads", UPLOAD_SUBDIR]

    @staticmethod
    def _meta(cid: str) -> list[str]:
        return [cid, "uploads", ".meta"]

    # -- conversations ----------------------------------------------------------------

    def ensure_conversation(self, conversation_id: str) -> ConversationInfo:
        cid = self.ensure_layout(conversation_id)
        return self.conversation_info(cid)

    def is_deleting(self, cid: str) -> bool:
        """Whether the conversation is being deleted (provisional: the deletion gate
        arrives with the disk work; until then nothing is ever marked)."""
        return False

    def ensure_layout(self, conversation_id: str) -> str:
        """Create the conversation's directories if missing; returns the checked id."""
        cid = self.check_conversation_id(conversation_id)
        for parts in (self._uploads(cid), self._meta(cid), [cid, "outputs"]):
            with self._directory(parts, create=True):
                pass
        return cid

    def conversation_info(self, conversation_id: str) -> ConversationInfo:
        cid = self.check_conversation_id(conversation_id)
        count = total = 0
        exists = self.root.exists_dir([cid])
        if exists:
            for _, st in self.walk_files([cid]):
                count += 1
                total += st.st_size
        return ConversationInfo(
            conversation_id=cid,
            exists=exists,
            path=self.visible(cid),
            uploads_path=self.visible(*self._uploads(cid)),
            outputs_path=self.visible(cid, "outputs"),
            file_count=count,
            total_bytes=total,
        )

    def conversation_ids(self) -> list[str]:
        with self.root.directory([]) as fd:
            return sorted(n for n in os.listdir(fd) if not n.startswith("."))

    def delete_conversation(self, conversation_id: str) -> ConversationDeleted:
        cid = self.check_conversation_id(conversation_id)
        with self.root.directory([]) as fd:
            # Whatever is there — a directory, or a symlink planted by code (removed, never
            # followed) — goes.
            existed = _entry_exists(fd, cid)
            pathsafe.remove_tree(fd, cid)
            gone = not _entry_exists(fd, cid)
        if not gone:  # pragma: no cover - would mean a concurrent writer raced us
            raise OSError(f"conversation {cid} still exists after deletion")
        return ConversationDeleted(conversation_id=cid, deleted=existed, exists=False)

    def walk_files(
        self, parts: list[str], _rel: tuple[str, ...] = ()
    ) -> Iterator[tuple[tuple[str, ...], os.stat_result]]:
        """(path relative to ``parts``, stat) of every regular file beneath ``parts``,
        never following a symlink, skipping upload metadata."""
        try:
            with self.root.directory([*parts, *_rel]) as fd:
                entries = sorted(os.listdir(fd))
                for name in entries:
                    try:
                        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    if stat.S_ISREG(st.st_mode):
                        yield (*_rel, name), st
                    elif stat.S_ISDIR(st.st_mode) and name != ".meta":
                        yield from self.walk_files(parts, (*_rel, name))
        except (pathsafe.NotFound, pathsafe.UnsafePath):
            return

    # -- uploads ----------------------------------------------------------------------

    def list_uploads(self, conversation_id: str) -> list[UploadedFile]:
        cid = self.check_conversation_id(conversation_id)
        files = []
        for meta in self._read_all_meta(cid):
            try:
                st = self.root.lstat([*self._uploads(cid), meta["name"]])
            except (pathsafe.NotFound, pathsafe.UnsafePath):
                continue
            if stat.S_ISREG(st.st_mode):
                files.append(self._upload_info(cid, meta, st.st_size))
        files.sort(key=lambda f: (f.uploaded_at, f.name))
        return files

    def count_uploads(self, cid: str) -> int:
        return len(self.list_uploads(cid))

    def has_upload(self, cid: str, name: str) -> bool:
        return self._read_meta(cid, name) is not None

    def open_upload(self, conversation_id: str, name: str) -> OpenedUpload:
        cid = self.check_conversation_id(conversation_id)
        fname = self.check_file_name(name)
        meta = self._read_meta(cid, fname)
        if meta is None:
            raise NotFoundError(f"no uploaded file '{fname}' in conversation '{cid}'")
        try:
            fd = self.root.open_file([*self._uploads(cid), fname])
        except pathsafe.NotFound as e:
            raise NotFoundError(f"no uploaded file '{fname}' in conversation '{cid}'") from e
        except pathsafe.UnsafePath as e:
            raise BadRequest(str(e), code="unsafe_path") from e
        size = os.fstat(fd).st_size
        return OpenedUpload(fd=fd, size=size, info=self._upload_info(cid, meta, size))

    def delete_upload(self, conversation_id: str, name: str) -> None:
        cid = self.check_conversation_id(conversation_id)
        fname = self.check_file_name(name)
        if self._read_meta(cid, fname) is None:
            raise NotFoundError(f"no uploaded file '{fname}' in conversation '{cid}'")
        with self._directory(self._uploads(cid)) as fd, contextlib.suppress(FileNotFoundError):
            os.unlink(fname, dir_fd=fd)
        with self._directory(self._meta(cid)) as fd, contextlib.suppress(FileNotFoundError):
            os.unlink(_meta_name(fname), dir_fd=fd)

    # -- staging and commit ----------------------------------------------------------

    def _reset_staging(self) -> None:
        # Partial uploads left by a crash are garbage: nobody can resume them.
        with self.root.directory([".runtime"], create=True) as fd:
            pathsafe.remove_tree(fd, "staging")
        with self.root.directory(list(_STAGING), create=True):
            pass

    def new_staging_file(self) -> tuple[str, int]:
        name = f"upload-{uuid.uuid4().hex}.part"
        if not self.root.exists_dir(list(_STAGING)):
            self._reset_staging()  # removed or replaced by a symlink: rebuild, never follow
        with self.root.directory(list(_STAGING)) as fd:
            wfd = os.open(
                name,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW,
                0o644,
                dir_fd=fd,
            )
        return name, wfd

    def discard_staging_file(self, name: str) -> None:
        with self.root.directory(list(_STAGING)) as fd, contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=fd)

    def commit_upload(
        self, staging_name: str, cid: str, name: str, size: int, sha256: str
    ) -> UploadResult:
        """Move a complete staged file into temparea and record it; caller holds the lock."""
        self.ensure_layout(cid)
        replaced = self.has_upload(cid, name)
        now = datetime.now(UTC)
        meta = {
            "name": name,
            "size": size,
            "sha256": sha256,
            "mime_type": guess_mime(name),
            "uploaded_at": now.isoformat(),
        }
        with (
            self.root.directory(list(_STAGING)) as sfd,
            self._directory(self._uploads(cid), create=True) as ufd,
        ):
            _refuse_directory_target(ufd, name)
            os.rename(staging_name, name, src_dir_fd=sfd, dst_dir_fd=ufd)
        self._write_meta(cid, name, meta)
        info = self._upload_info(cid, meta, size)
        return UploadResult(**info.model_dump(), replaced=replaced)

    # -- metadata ---------------------------------------------------------------------

    def _upload_info(self, cid: str, meta: dict, size: int) -> UploadedFile:
        name = meta["name"]
        return UploadedFile(
            name=name,
            path=self.visible(*self._uploads(cid), name),
            size=size,
            sha256=meta["sha256"],
            mime_type=meta.get("mime_type") or guess_mime(name),
            uploaded_at=meta["uploaded_at"],
            conversation_id=cid,
        )

    def _write_meta(self, cid: str, name: str, meta: dict) -> None:
        data = json.dumps(meta).encode()
        target = _meta_name(name)
        tmp = f".{target}.{uuid.uuid4().hex}.tmp"
        with self._directory(self._meta(cid), create=True) as fd:
            wfd = os.open(
                tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=fd
            )
            try:
                os.write(wfd, data)
            finally:
                os.close(wfd)
            os.rename(tmp, target, src_dir_fd=fd, dst_dir_fd=fd)

    def _read_meta(self, cid: str, name: str) -> dict | None:
        try:
            fd = self.root.open_file([*self._meta(cid), _meta_name(name)])
        except (pathsafe.NotFound, pathsafe.UnsafePath):
            return None
        with os.fdopen(fd, "rb") as f:
            meta = _parse_meta(f.read())
        return meta if meta and meta["name"] == name else None

    def _read_all_meta(self, cid: str) -> list[dict]:
        metas = []
        try:
            with self.root.directory(self._meta(cid)) as fd:
                names = [n for n in os.listdir(fd) if n.endswith(".json")]
        except (pathsafe.NotFound, pathsafe.UnsafePath):
            return []
        for n in names:
            try:
                mfd = self.root.open_file([*self._meta(cid), n])
            except (pathsafe.NotFound, pathsafe.UnsafePath):
                continue
            with os.fdopen(mfd, "rb") as f:
                meta = _parse_meta(f.read())
            if meta and _meta_name(meta["name"]) == n:
                metas.append(meta)
        return metas

    @contextlib.contextmanager
    def _directory(self, parts: list[str], *, create: bool = False) -> Iterator[int]:
        try:
            with self.root.directory(parts, create=create) as fd:
                yield fd
        except pathsafe.NotFound as e:
            raise NotFoundError(f"'{'/'.join(parts[:1])}' has no such directory") from e
        except pathsafe.UnsafePath as e:
            raise BadRequest(str(e), code="unsafe_path") from e
        except NotADirectoryError as e:
            raise BadRequest(f"'{'/'.join(parts)}' is not a directory", code="unsafe_path") from e


def _parse_meta(data: bytes) -> dict | None:
    try:
        meta = json.loads(data)
    except ValueError:
        return None
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        return None
    if not {"sha256", "uploaded_at"} <= meta.keys():
        return None
    return meta


def _entry_exists(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _refuse_directory_target(dir_fd: int, name: str) -> None:
    # rename() over a symlink replaces the link itself (safe); over a directory it fails
    # with a confusing errno, so say it plainly.
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        raise BadRequest(f"'{name}' exists as a directory in temparea", code="invalid_file_name")
