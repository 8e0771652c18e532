"""Staging of uploads under ``.runtime/staging``: bytes land here, then move in whole.

Contract: ``new_file`` creates a fresh, exclusively created file (readable and writable
by us: the bytes can be read back). ``move_into`` renames it into temparea — but first
proves the name in staging is still the file we wrote (same inode as our descriptor);
if staging was emptied, replaced or tampered with meanwhile, the upload is staged again
from the descriptor we hold, so damage to the state directory never loses or corrupts
an upload. It answers the stat of the file now in temparea, taken from a descriptor
(never by name: code may already be replacing that name). ``discard`` never raises.
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid

from . import pathsafe
from .state import STAGING, StateDir

log = logging.getLogger(__name__)

_FLAGS = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
_COPY_CHUNK = 1024 * 1024


class Staging:
    def __init__(self, state: StateDir) -> None:
        self.state = state

    def new_file(self) -> tuple[str, int]:
        """(name in staging, read-write descriptor); the caller owns the descriptor."""
        if not self.state.intact():
            self.state.repair()
        name = f"upload-{uuid.uuid4().hex}.part"
        with self.state.directory(STAGING, create=True) as fd:
            return name, os.open(name, _FLAGS, 0o644, dir_fd=fd)

    def discard(self, name: str) -> None:
        with contextlib.suppress(OSError, pathsafe.UnsafePath), self.state.directory(STAGING) as fd:
            os.unlink(name, dir_fd=fd)

    def move_into(self, name: str, fd: int, dst_dir_fd: int, dst_name: str) -> os.stat_result:
        """Rename the staged file ``name`` (written through ``fd``) to ``dst_name``."""
        with self.state.directory(STAGING, create=True) as sfd:
            mine = os.fstat(fd)
            try:
                st = os.stat(name, dir_fd=sfd, follow_symlinks=False)
                ours = (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)
            except FileNotFoundError:
                ours = False
            src_fd = fd
            if not ours:
                log.warning("staged upload vanished or was replaced; staging it again")
                name, src_fd = self._restage(sfd, fd, mine.st_size)
            try:
                os.rename(name, dst_name, src_dir_fd=sfd, dst_dir_fd=dst_dir_fd)
                return os.fstat(src_fd)
            finally:
                if src_fd != fd:
                    os.close(src_fd)

    @staticmethod
    def _restage(sfd: int, fd: int, size: int) -> tuple[str, int]:
        name = f"upload-{uuid.uuid4().hex}.part"
        out = os.open(name, _FLAGS, 0o644, dir_fd=sfd)
        offset = 0
        while offset < size:
            chunk = os.pread(fd, min(_COPY_CHUNK, size - offset), offset)
            if not chunk:
                break
            view = memoryview(chunk)
            while view:
                view = view[os.write(out, view) :]
            offset += len(chunk)
        os.fsync(out)
        return name, out
