"""The runtime's own state directory, ``{root}/.runtime``, kept whole whatever happens to it.

Layout::

    .runtime/staging/           partial uploads (emptied at start: nobody can resume them)
    .runtime/meta/{cid}/*.json  upload metadata (``metastore``)
    .runtime/marks/{cid}.json   what runs modified and presented (``marks``)
    .runtime/layout             "2" once old layouts have been migrated (``migrate``)

Contract: executed code has no access here (Landlock), but a PVC may come from an older
runtime or from a time code ran unconfined, so nothing is assumed. ``repair`` makes
``.runtime``, ``staging``, ``meta`` and ``marks`` real directories of ours: a symlink, file
or FIFO in their place is unlinked (never followed, so a link to a conversation directory leaves
that directory untouched), a directory made unreadable gets its mode back, and a
``.runtime`` that is not the one we made (replaced while we ran) is removed and rebuilt.
After a rebuild it calls ``on_rebuilt`` so the metadata store can write back what it holds.
``intact`` is one ``fstatat`` — cheap enough for every request that touches state.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
from collections.abc import Callable, Iterator

from . import pathsafe, tree

log = logging.getLogger(__name__)

STATE = ".runtime"
STAGING = "staging"
META = "meta"
MARKS = "marks"
LAYOUT = "layout"
LAYOUT_VERSION = b"2"


class StateDir:
    """``{root}/.runtime``: checked on use, rebuilt when damaged."""

    def __init__(self, root: pathsafe.SafeRoot) -> None:
        self.root = root
        self._ident: tuple[int, int] | None = None
        # Called after a rebuild, to write back what the rebuild lost (metadata).
        self.on_rebuilt: Callable[[], None] | None = None
        # Deletions run in worker threads: two repairs at once would undo each other.
        self._repairing = threading.RLock()
        self.repair(reset_staging=True)

    def intact(self) -> bool:
        """True while ``.runtime`` is still the directory ``repair`` last vouched for."""
        with self.root.directory([]) as rfd:
            try:
                st = os.stat(STATE, dir_fd=rfd, follow_symlinks=False)
            except FileNotFoundError:
                return False
        return (st.st_dev, st.st_ino) == self._ident and stat.S_ISDIR(st.st_mode)

    def repair(self, *, reset_staging: bool = False) -> bool:
        """Make the state directories real and ours; True when something was rebuilt."""
        with self._repairing:
            rebuilt = self._repair(reset_staging=reset_staging)
        # Outside the lock: the callback takes the metadata store's lock, and a thread
        # holding that one may be waiting to repair (lock order).
        if rebuilt and self.on_rebuilt is not None:
            self.on_rebuilt()
        return rebuilt

    def _repair(self, *, reset_staging: bool) -> bool:
        rebuilt = False
        with self.root.directory([]) as rfd:
            rebuilt |= self._ensure_dir(rfd, STATE, expected=self._ident)
            fd = tree.open_dir_accessible(rfd, STATE)  # also gives back rwx if taken
            try:
                st = os.fstat(fd)
                self._ident = (st.st_dev, st.st_ino)
                if reset_staging:
                    tree.remove_tree(fd, STAGING)
                rebuilt |= self._ensure_dir(fd, STAGING) and not reset_staging
                rebuilt |= self._ensure_dir(fd, META)
                rebuilt |= self._ensure_dir(fd, MARKS)
                for name in (STAGING, META, MARKS):
                    os.close(tree.open_dir_accessible(fd, name))
            finally:
                os.close(fd)
        if rebuilt:
            log.warning("runtime state directory was damaged and has been rebuilt")
        return rebuilt

    @staticmethod
    def _ensure_dir(parent_fd: int, name: str, *, expected: tuple[int, int] | None = None) -> bool:
        """Create ``name`` as a directory, replacing anything else; True when (re)made."""
        try:
            st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None:
            is_ours = expected is None or (st.st_dev, st.st_ino) == expected
            if stat.S_ISDIR(st.st_mode) and is_ours:
                return False
            log.warning(
                "replacing a damaged runtime state entry",
                extra={"entry": name, "mode": oct(st.st_mode)},
            )
            tree.remove_tree(parent_fd, name)
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=parent_fd)
        return st is not None

    @contextlib.contextmanager
    def directory(self, *parts: str, create: bool = False) -> Iterator[int]:
        """A directory beneath ``.runtime``; when the way there is broken, repair once."""
        try:
            fd = self.root.open_dir([STATE, *parts], create=create)
        except (pathsafe.UnsafePath, NotADirectoryError, PermissionError):
            self.repair()
            fd = self._walk_repairing(parts, create=create)
        except pathsafe.NotFound:
            if not create:
                raise
            self.repair()
            fd = self._walk_repairing(parts, create=create)
        try:
            yield fd
        finally:
            os.close(fd)

    def _walk_repairing(self, parts: tuple[str, ...], *, create: bool) -> int:
        """Second try after ``repair``: a damaged entry below meta/ (a file or symlink in
        place of a conversation's metadata directory) is removed and remade."""
        try:
            return self.root.open_dir([STATE, *parts], create=create)
        except (pathsafe.UnsafePath, NotADirectoryError, PermissionError):
            if not create:
                raise
        fd = self.root.open_dir([STATE])
        try:
            for part in parts:
                self._ensure_dir(fd, part)
                nxt = tree.open_dir_accessible(fd, part)
                os.close(fd)
                fd = nxt
            return fd
        except BaseException:
            os.close(fd)
            raise

    def layout_migrated(self) -> bool:
        with self.directory() as fd:
            try:
                lfd = os.open(LAYOUT, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
            except OSError:
                return False
            try:
                return stat.S_ISREG(os.fstat(lfd).st_mode) and os.read(lfd, 16) == LAYOUT_VERSION
            finally:
                os.close(lfd)

    def mark_layout_migrated(self) -> None:
        with self.directory() as fd:
            write_atomically(fd, LAYOUT, LAYOUT_VERSION)


def write_atomically(dir_fd: int, name: str, data: bytes) -> None:
    """Write ``name`` beneath ``dir_fd`` via a temporary file and rename (never torn)."""
    tmp = f".{name}.{os.getpid()}.{os.urandom(6).hex()}.tmp"
    wfd = os.open(
        tmp,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o600,
        dir_fd=dir_fd,
    )
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(wfd, view) :]
    finally:
        os.close(wfd)
    try:
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except IsADirectoryError:
        tree.remove_tree(dir_fd, name)  # a directory squatting on the name
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
