"""Scratch roots: where conversations' ``$HOME`` = ``$TMPDIR`` live, and what a runtime
killed before its ``aclose`` left of them.

Every runtime makes one scratch root, ``{tempdir}/sbw-scratch-XXXXXXXX``
(``tempfile.mkdtemp``: a fresh ``mkdir`` of a random name, mode 0700, ours — a name
another local user made first is skipped, never adopted), with a directory per
conversation beneath it. A clean stop removes it; a runtime SIGKILLed (the OOM killer, a
crash) cannot, and the next one makes another. So each root is recorded, with its
identity (device, inode), in ``{root}/.runtime/scratch`` before any code runs — the
runtime's state, which code cannot reach (Landlock) — and a recorded root no runtime
uses any more is removed:

- by the next runtime of the workspace, at its start (``ScratchRecords.create``), before
  it makes its own;
- by the local backend when a conversation of a session whose runtime is down is deleted
  (``ScratchRecords.remove_leftovers``: no runtime runs, so every recorded root is a dead
  one's) and when the session is deleted (``remove_recorded``, before its directory goes).

A record is trusted as far as it names the very directory we made, nothing more: its
path absolute and normal, named ``sbw-scratch-``, in a parent only we or root can rename
entries of (owned by one of us, and not writable by others or sticky, as ``/tmp`` is);
the entry there a real directory (a symlink is never followed), owned by us, with the
recorded device and inode. Anything else (a record edited while code ran unconfined, a
root some cleaner removed and a stranger's directory of that name since) is left alone
and the record dropped. Removal is ``tree.remove_tree``: iterative, any depth or count,
never following a symlink. A root that could not be removed stays recorded for the next
try. A runtime's own root is released (removed, forgotten) by its ``aclose``.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
import tempfile
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from . import tree
from .metastore import read_document
from .state import STATE, StateDir, write_atomically

log = logging.getLogger(__name__)

PREFIX = "sbw-scratch-"
RECORD = "scratch"  # beneath .runtime
_MAX_RECORD_BYTES = 64 * 1024
_NOTHING_THERE = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)


class ScratchLeft(OSError):
    """A recorded scratch root of a runtime no longer running could not be removed."""


@dataclass(frozen=True)
class Root:
    path: str
    dev: int
    ino: int

    @classmethod
    def parse(cls, doc: object) -> Root | None:
        if not isinstance(doc, dict):
            return None
        path, dev, ino = doc.get("path"), doc.get("dev"), doc.get("ino")
        if not (isinstance(path, str) and isinstance(dev, int) and isinstance(ino, int)):
            return None
        return cls(path, dev, ino)


def make_root() -> Root:
    """A new scratch root in the temporary directory (mode 0700, a name nobody had)."""
    path = tempfile.mkdtemp(prefix=PREFIX)
    st = os.stat(path, follow_symlinks=False)
    # mkdtemp made it; what is there now is still ours unless the temporary directory lets
    # others swap entries (not sticky): then code would write into a stranger's directory.
    if not (stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077):
        raise OSError(f"scratch root {path} is not the private directory just made")
    return Root(path, st.st_dev, st.st_ino)


def remove_root(root: Root) -> None:
    """Remove ``root`` if it is still the directory we made (module contract); what is
    there otherwise is left alone. Raises ``OSError`` when it is ours and stays."""
    parent, name = os.path.split(root.path)
    if not _well_formed(root.path):
        log.warning("ignoring a malformed scratch root record", extra={"path": root.path})
        return
    try:
        pfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return  # its temporary directory is gone (a private /tmp: bubblewrap's, a pod's)
    try:
        if not _safe_parent(os.fstat(pfd)):
            log.warning("not removing a scratch root others could swap", extra={"path": parent})
            return
        try:
            st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if not _is_ours(st, root):
            log.warning("not removing a scratch root that is not ours", extra={"path": root.path})
            return
        tree.remove_tree(pfd, name)
    finally:
        os.close(pfd)


def _well_formed(path: str) -> bool:
    name = os.path.basename(path)
    return os.path.isabs(path) and os.path.normpath(path) == path and name.startswith(PREFIX)


def _safe_parent(st: os.stat_result) -> bool:
    """Only we or root can rename entries of it: what we checked is what we remove."""
    owner_ok = st.st_uid in (0, os.geteuid())
    return owner_ok and (not st.st_mode & 0o022 or bool(st.st_mode & stat.S_ISVTX))


def _is_ours(st: os.stat_result, root: Root) -> bool:
    ident_ok = (st.st_dev, st.st_ino) == (root.dev, root.ino)
    return stat.S_ISDIR(st.st_mode) and ident_ok and st.st_uid == os.geteuid()


def _parse(data: bytes) -> list[Root]:
    try:
        docs = json.loads(data)
    except ValueError:
        docs = None
    if not isinstance(docs, list):
        log.warning("ignoring an unreadable scratch root record")
        return []
    return [r for r in map(Root.parse, docs) if r is not None]


def _read(state_fd: int) -> list[Root]:
    found = read_document(state_fd, RECORD, _MAX_RECORD_BYTES)
    return _parse(found[0]) if found is not None else []


def _remove_all(roots: list[Root]) -> list[Root]:
    """Remove each root; those still there (the removal failed) are returned."""
    left = []
    for root in roots:
        try:
            remove_root(root)
        except OSError as e:
            log.warning("scratch root not removed: %s", e, extra={"path": root.path})
            left.append(root)
    return left


class ScratchRecords:
    """The scratch roots this workspace's runtimes made, recorded in ``.runtime/scratch``."""

    def __init__(self, state: StateDir) -> None:
        self.state = state
        self._lock = threading.Lock()
        self._roots: list[Root] = []  # what the record holds (rewritten after a rebuild)

    def create(self) -> str:
        """Remove the roots runtimes before us left, make ours and record it; returns its
        path. At start, before any code runs (the record must exist before code can write)."""
        with self._lock:
            with self.state.directory() as fd:
                self._roots = _remove_all(_read(fd))
            root = make_root()
            self._roots.append(root)
            self._write()
        return root.path

    def remove_leftovers(self) -> None:
        """Remove every recorded root: call it only when no runtime runs on the workspace.
        Raises ``ScratchLeft`` when one stays."""
        with self._lock:
            with self.state.directory() as fd:
                self._roots = _remove_all(_read(fd))
            self._write()
            if self._roots:
                raise ScratchLeft(f"{len(self._roots)} scratch root(s) could not be removed")

    def release(self, path: str) -> None:
        """Our own root, at a clean stop: removed, then forgotten."""
        with self._lock:
            mine = [r for r in self._roots if r.path == path]
            for root in mine:
                remove_root(root)
            self._roots = [r for r in self._roots if r.path != path]
            self._write()

    def rewrite_all(self) -> None:
        """After ``.runtime`` was rebuilt: write back what memory holds."""
        with self._lock:
            self._write()

    def _write(self) -> None:
        data = json.dumps([asdict(r) for r in self._roots]).encode()
        with self.state.directory() as fd:
            write_atomically(fd, RECORD, data)


def recorded(root: str | os.PathLike[str]) -> list[Root]:
    """The scratch roots recorded under the workspace ``root`` (none when it has no
    state). Reads only: never repairs or creates anything, follows no link."""
    try:
        rfd = os.open(Path(root), tree.DIR_FLAGS)
    except OSError as e:
        if e.errno in _NOTHING_THERE:
            return []
        raise
    try:
        try:
            sfd = os.open(STATE, tree.DIR_FLAGS, dir_fd=rfd)
        except OSError as e:
            if e.errno in _NOTHING_THERE:  # a link in its place is never followed
                return []
            raise
        try:
            return _read(sfd)
        finally:
            os.close(sfd)
    finally:
        os.close(rfd)


def remove_recorded(root: str | os.PathLike[str]) -> None:
    """Remove every scratch root recorded under ``root`` (a workspace no runtime runs on,
    about to be deleted whole). Raises ``ScratchLeft`` when a root stays."""
    left = _remove_all(recorded(root))
    if left:
        raise ScratchLeft(f"{len(left)} scratch root(s) could not be removed")
