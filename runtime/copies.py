"""Copies of a conversation on the runtime's own volume: snapshots, restores and forks in
``SANDBOX_WORKSPACE_STORE=local`` mode, where the workspace holds the only copy of the
files (in ``s3`` mode the store copies them: ``sandbox_workspace.store.snapshots``).

Layout, beneath the state directory (``.runtime``, out of code's reach)::

    snapshots/{cid}/{snapshot_id}/files/…          the conversation directory's files
    snapshots/{cid}/{snapshot_id}/snapshot.json    what they are (written last: the
                                                   commit point; a directory without it
                                                   is an interrupted copy, never listed)

Contract:
- Every copy is a new inode: a reflink (``FICLONE``: copy-on-write, no bytes moved) where
  the filesystem has it, else ``copy_file_range``/a plain copy — never a hard link, so a
  later write through any name (in place, through a hard link, after a rename) in one
  copy never shows in another. Regular files and their directories are copied; links,
  FIFOs and devices code made are not (nothing is ever followed).
- Uploads stay uploads: the upload metadata (``metastore``) of each copied upload is
  recorded again for the copy's new inode; one code had changed in place stays
  ``modified`` (its recorded times no longer match).
- ``restore`` makes the conversation directory exactly the snapshot's (what was written
  after it is gone, its uploads' metadata with it) and ``fork`` fills an empty
  conversation from another or from a snapshot. Both are called with the conversation's
  processes stopped (the caller's job: the kernel's state is not in a snapshot).
- Deleting a conversation deletes its snapshots (``drop``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime

from sandbox_workspace.contract.errors import Conflict, NotFoundError

from . import tree
from .metastore import UploadMeta
from .schemas import UPLOAD_SUBDIR
from .state import write_atomically

SNAPSHOTS = "snapshots"
_FILES = "files"
_DOC = "snapshot.json"
_FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class Copied:
    files: int
    bytes: int
    reflinked: int  # of ``files``: shared extents (copy-on-write), no bytes written


def _open_dirs(fd: int, parts: tuple[str, ...], *, create: bool) -> int:
    """The directory ``parts`` beneath ``fd`` (made when asked), never through a link."""
    cur = os.dup(fd)
    try:
        for part in parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=cur)
            nxt = os.open(part, _DIR, dir_fd=cur)
            os.close(cur)
            cur = nxt
        return cur
    except BaseException:
        os.close(cur)
        raise


def _copy_fd(src: int, dst: int, size: int) -> bool:
    """Copy ``src`` into the empty ``dst``; True when reflinked (no bytes written)."""
    try:
        fcntl.ioctl(dst, _FICLONE, src)
        return True
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL,
                           errno.ENOSYS, errno.EPERM):  # fmt: skip
            raise
    left = size
    try:
        while left > 0:
            n = os.copy_file_range(src, dst, left)
            if n == 0:
                break
            left -= n
        return False
    except OSError:
        os.lseek(src, 0, os.SEEK_SET)
        os.lseek(dst, 0, os.SEEK_SET)
        os.ftruncate(dst, 0)
    while chunk := os.read(src, 1024 * 1024):
        os.write(dst, chunk)
    return False


def copy_tree(src_fd: int, dst_fd: int) -> tuple[Copied, dict[tuple[str, ...], int]]:
    """Every regular file beneath ``src_fd`` to the same place beneath ``dst_fd`` (which
    holds none of them); the counts, and each copy's inode by its relative parts."""
    files = total = reflinked = 0
    inodes: dict[tuple[str, ...], int] = {}
    for parts, st in tree.walk_files(src_fd):
        *dirs, name = parts
        sdir = _open_dirs(src_fd, tuple(dirs), create=False)
        ddir = _open_dirs(dst_fd, tuple(dirs), create=True)
        try:
            try:
                src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                              dir_fd=sdir)  # fmt: skip
            except FileNotFoundError:
                continue  # removed while we walked
            try:
                if not stat.S_ISREG(os.fstat(src).st_mode):
                    continue
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                dst = os.open(name, flags, stat.S_IMODE(st.st_mode) | 0o600, dir_fd=ddir)
                try:
                    reflinked += _copy_fd(src, dst, st.st_size)
                    inodes[parts] = os.fstat(dst).st_ino
                finally:
                    os.close(dst)
            finally:
                os.close(src)
        finally:
            os.close(sdir)
            os.close(ddir)
        files += 1
        total += st.st_size
    return Copied(files, total, reflinked), inodes


def _upload_parts(name: str) -> tuple[str, ...]:
    return ("uploads", UPLOAD_SUBDIR, name)


class Copies:
    """Snapshots, restores and forks of the conversations of one ``Workspace``."""

    def __init__(self, workspace) -> None:
        self.ws = workspace

    @contextlib.contextmanager
    def _snapshots(self, cid: str, *, create: bool = False) -> Iterator[int]:
        with self.ws.state.directory(SNAPSHOTS, create=True) as sfd:
            fd = _open_dirs(sfd, (cid,), create=create)
        try:
            yield fd
        finally:
            os.close(fd)

    def _uploads_kept(self, cid: str) -> list[dict]:
        """The conversation's uploads as a copy must record them again."""
        kept = []
        for meta, st in self.ws.current_uploads(cid):
            if st is not None:
                kept.append({"meta": asdict(meta), "unchanged": meta.unchanged(st)})
        return kept

    def _record_uploads(self, cid: str, kept: list[dict], inodes: dict) -> None:
        for entry in kept:
            meta = UploadMeta(**entry["meta"])
            with self.ws.directory([cid, *_upload_parts(meta.name)[:-1]]) as dfd:
                try:
                    st = os.stat(meta.name, dir_fd=dfd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
            if inodes.get(_upload_parts(meta.name)) != st.st_ino:
                continue  # not the copy we made: never taken for the upload
            copy = meta.with_identity(st)
            if not entry["unchanged"]:  # changed by code before: stays modified
                copy = replace(copy, ctime_ns=0)
            self.ws.meta.put(cid, copy)

    # -- snapshots --------------------------------------------------------------------

    def snapshot(self, cid: str, snapshot_id: str, name: str) -> dict:
        ws = self.ws
        cid = ws.check_conversation_id(cid)
        ws.check_conversation_id(snapshot_id)  # the same rules make it a safe name
        if not ws.root.exists_dir([cid]):
            raise NotFoundError(f"conversation '{cid}' does not exist")
        kept = self._uploads_kept(cid)
        with self._snapshots(cid, create=True) as cfd:
            try:
                os.mkdir(snapshot_id, 0o700, dir_fd=cfd)
            except FileExistsError as e:
                raise Conflict(f"snapshot '{snapshot_id}' exists already",
                               code="snapshot_exists") from e  # fmt: skip
            sfd = _open_dirs(cfd, (snapshot_id, _FILES), create=True)
            try:
                with ws.directory([cid]) as src:
                    copied, _ = copy_tree(src, sfd)
            finally:
                os.close(sfd)
            doc = {
                "snapshot_id": snapshot_id,
                "conversation_id": cid,
                "name": name,
                "created_at": datetime.now(UTC).isoformat(),
                "file_count": copied.files,
                "bytes": copied.bytes,
                "reflinked": copied.reflinked,
                "uploads": kept,
            }
            dfd = _open_dirs(cfd, (snapshot_id,), create=False)
            try:
                write_atomically(dfd, _DOC, json.dumps(doc).encode())
            finally:
                os.close(dfd)
        return doc

    def get(self, cid: str, snapshot_id: str) -> dict:
        cid = self.ws.check_conversation_id(cid)
        try:
            with self._snapshots(cid) as cfd:
                dfd = _open_dirs(cfd, (self.ws.check_conversation_id(snapshot_id),),
                                 create=False)  # fmt: skip
                try:
                    rfd = os.open(_DOC, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
                finally:
                    os.close(dfd)
        except (FileNotFoundError, NotADirectoryError) as e:
            raise NotFoundError(f"no snapshot '{snapshot_id}' of conversation '{cid}'") from e
        with os.fdopen(rfd, "rb") as f:
            return json.loads(f.read())

    def list(self, cid: str) -> list[dict]:
        cid = self.ws.check_conversation_id(cid)
        try:
            with self._snapshots(cid) as cfd:
                names = os.listdir(cfd)
        except FileNotFoundError:
            return []
        docs = []
        for name in names:
            with contextlib.suppress(NotFoundError):
                docs.append(self.get(cid, name))
        return sorted(docs, key=lambda d: (d["created_at"], d["snapshot_id"]))

    def delete(self, cid: str, snapshot_id: str) -> None:
        self.get(cid, snapshot_id)  # 404 when there is none
        with self._snapshots(cid) as cfd:
            tree.remove_tree(cfd, snapshot_id)

    def drop(self, cid: str) -> None:
        """Every snapshot of the conversation (with the conversation itself)."""
        with self.ws.state.directory(SNAPSHOTS, create=True) as sfd:
            tree.remove_tree(sfd, cid)

    def stored_bytes(self) -> int:
        """The bytes every snapshot of this workspace holds (the per-user quota)."""
        total = 0
        with self.ws.state.directory(SNAPSHOTS, create=True) as sfd:
            cids = os.listdir(sfd)
        for cid in cids:
            with contextlib.suppress(Exception):
                total += sum(d["bytes"] for d in self.list(cid))
        return total

    # -- restore and fork ----------------------------------------------------------------

    def _fill(self, cid: str, source: tuple[str, ...] | None, src_cid: str, kept: list[dict]):
        """Copy into the (empty) conversation ``cid`` from a snapshot (``source``: its
        parts beneath the snapshots directory) or from the live ``src_cid``."""
        ws = self.ws
        with ws.directory([cid], create=True) as dst:
            if source is None:
                with ws.directory([src_cid]) as src:
                    copied, inodes = copy_tree(src, dst)
            else:
                with self._snapshots(source[0]) as cfd:
                    src = _open_dirs(cfd, source[1:], create=False)
                try:
                    copied, inodes = copy_tree(src, dst)
                finally:
                    os.close(src)
        for parts in (ws.uploads_parts(cid), [cid, "outputs"]):
            with ws.directory(parts, create=True):
                pass
        self._record_uploads(cid, kept, inodes)
        return copied

    def restore(self, cid: str, snapshot_id: str) -> dict:
        """Within ``deleting(cid)``, processes stopped: the files become the snapshot's."""
        ws = self.ws
        doc = self.get(cid, snapshot_id)
        with ws.root.directory([]) as rfd:
            tree.remove_tree(rfd, cid)
        ws.meta.drop(cid)
        ws.marks.drop(cid)
        self._fill(cid, (cid, snapshot_id, _FILES), cid, doc["uploads"])
        return doc

    def fork(self, src_cid: str, dst_cid: str, snapshot_id: str | None) -> Copied:
        ws = self.ws
        src_cid = ws.check_conversation_id(src_cid)
        dst_cid = ws.check_conversation_id(dst_cid)
        if snapshot_id is not None:
            kept = self.get(src_cid, snapshot_id)["uploads"]
            source: tuple[str, ...] | None = (src_cid, snapshot_id, _FILES)
        else:
            if not ws.root.exists_dir([src_cid]):
                raise NotFoundError(f"conversation '{src_cid}' does not exist")
            kept, source = self._uploads_kept(src_cid), None
        with ws.walk([dst_cid], max_entries=100_000) as walk:  # stops at the first file
            if any(True for _ in walk):
                raise Conflict(f"conversation '{dst_cid}' exists already and holds files",
                               code="conversation_exists")  # fmt: skip
        return self._fill(dst_cid, source, src_cid, kept)
