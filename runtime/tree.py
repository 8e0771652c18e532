"""Iterative tree walking and deletion that hostile trees cannot defeat.

Contract:
- Nothing here recurses: depth costs heap (one frame per level, the names still to visit),
  never Python stack, so a tree 100,000 levels deep is walked and deleted like a flat one.
- At most two directory descriptors are open at any time, whatever the depth: we descend
  with ``openat(name, O_NOFOLLOW)`` and climb back with ``openat("..")``, checking that
  ".." is the very directory (device, inode) we came from. If it is not (the tree was
  moved under us), ``TreeChanged`` is raised instead of wandering off.
- A symlink is never followed: it is an entry like a file (unlinked when deleting,
  skipped when walking). FIFOs, sockets and devices are never opened.
- ``remove_tree`` makes directories it must empty accessible as it goes (``chmod u+rwx``,
  on directories only, through an ``O_PATH`` descriptor so the chmod hits the directory
  it looked at, never a link's target), handles any count and any names, is idempotent.
- ``walk_files`` is read-only and bounded by ``max_entries``; unreadable directories are
  skipped; the returned ``Walk`` says whether the walk saw everything.
- ``walk_entries`` is read-only too and yields the ``lstat`` of every entry (directories,
  links, FIFOs… not just files) at any depth, with no bound: it holds the names of the
  directories still to visit, never a directory's whole listing, so a flat directory of
  millions of files costs what one of them does (the conversation's size limit walks
  with it, ``runtime/limits.disk_usage``); with ``reclaim`` it gives the owner r-x back
  on directories code made unreadable, so a mode cannot hide bytes from it. Where a
  climb finds the tree moved or locked under it, it goes back down from the top by name
  (identities checked) and carries on, so code cannot end it early.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ_SEARCH = 0o500  # the owner's bits a walk needs on a directory
# Names read from one directory at a time: a directory of millions of entries costs
# bounded memory (deletion reads it again batch by batch as it empties it).
_BATCH = 10_000
# Removal retries from the top when the tree changed under it (code is stopped before a
# deletion, so this only guards against the unexpected), then gives up loudly.
_REMOVE_ATTEMPTS = 5


class TreeChanged(OSError):
    """A directory was moved while we walked it; ".." is no longer where we came from."""


@dataclass
class _Frame:
    name: str  # the directory's name in its parent ("" for the top)
    ident: tuple[int, int]  # (st_dev, st_ino): what ".." must be when we climb back here
    pending: list[str]  # entries still to visit (popped from the end)


def _names(fd: int, limit: int = _BATCH) -> list[str]:
    """Up to ``limit`` names of the directory ``fd`` (its descriptor is not consumed)."""
    names = []
    with os.scandir(fd) as it:
        for entry in it:
            names.append(entry.name)
            if len(names) >= limit:
                break
    return names


def _ident(st: os.stat_result) -> tuple[int, int]:
    return (st.st_dev, st.st_ino)


def _climb(fd: int, parent: tuple[int, int]) -> int:
    """Open ``fd``'s parent and prove it is ``parent``; closes nothing."""
    up = os.open("..", DIR_FLAGS, dir_fd=fd)
    if _ident(os.fstat(up)) != parent:
        os.close(up)
        raise TreeChanged(errno.ESTALE, "directory moved during the walk")
    return up


# -- walking ------------------------------------------------------------------------------


@dataclass
class Walk:
    """Regular files beneath a directory: iterate for ``(relative parts, stat)``.

    After iteration, ``complete`` is False when the walk stopped at ``max_entries``, met
    an unreadable directory or a directory that moved — then counts are lower bounds.
    """

    dir_fd: int
    max_entries: int
    complete: bool = field(default=True, init=False)

    def __iter__(self) -> Iterator[tuple[tuple[str, ...], os.stat_result]]:
        if self.dir_fd < 0:  # nothing to walk (the directory does not exist)
            return
        fd = os.dup(self.dir_fd)
        try:
            stack = [_Frame("", _ident(os.fstat(fd)), self._list(fd))]
            seen = 0
            while stack:
                top = stack[-1]
                if not top.pending:
                    stack.pop()
                    if stack:
                        try:
                            up = _climb(fd, stack[-1].ident)
                        except OSError:
                            self.complete = False
                            return
                        os.close(fd)
                        fd = up
                    continue
                seen += 1
                if seen > self.max_entries:
                    self.complete = False
                    return
                name = top.pending.pop()
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                except OSError:
                    self.complete = False
                    continue
                if stat.S_ISREG(st.st_mode):
                    yield (*(f.name for f in stack[1:]), name), st
                elif stat.S_ISDIR(st.st_mode):
                    child = self._enter(fd, name)
                    if child is not None:
                        child_fd, frame = child
                        os.close(fd)
                        fd = child_fd
                        stack.append(frame)
        finally:
            os.close(fd)

    def _enter(self, fd: int, name: str) -> tuple[int, _Frame] | None:
        try:
            child = os.open(name, DIR_FLAGS, dir_fd=fd)
        except OSError:  # raced away, replaced by a link, or unreadable
            self.complete = False
            return None
        try:
            entries = self._list(child)
        except OSError:
            os.close(child)
            self.complete = False
            return None
        return child, _Frame(name, _ident(os.fstat(child)), entries)

    def _list(self, fd: int) -> list[str]:
        names = _names(fd, self.max_entries + 1)
        if len(names) > self.max_entries:
            self.complete = False
        return sorted(names, reverse=True)  # popped from the end: visited in name order


def walk_files(dir_fd: int, *, max_entries: int = 1_000_000) -> Walk:
    """Every regular file beneath ``dir_fd`` (see ``Walk``); the caller keeps ``dir_fd``."""
    return Walk(dir_fd, max_entries)


def walk_entries(dir_fd: int, *, reclaim: bool = False) -> Iterator[os.stat_result]:
    """The ``lstat`` of every entry beneath ``dir_fd`` (see the module contract); parts
    that cannot be read or vanish are skipped. With ``reclaim``, a directory of ours that
    code made unreadable or unsearchable (``chmod 300``, ``000``) gets its owner's r-x
    back first, so nothing is hidden from the walk by its mode (``open_dir_accessible``;
    the caller opens ``dir_fd`` so too).

    Code runs while the walk does, so a climb can find ".." is no longer the directory
    it came from (code moved the one the walk was in) or unreadable (code chmodded it):
    the walk then goes back down from ``dir_fd`` by the names it took, checking each
    directory's identity, and carries on with what it still has to visit — ending there
    was a way past the quota (move a directory to and fro; what was not visited yet was
    never counted). Only what lay beneath a directory moved away from its own path is
    left out then. The caller keeps ``dir_fd``."""
    fd = os.dup(dir_fd)
    try:
        stack: list[_Frame] = []
        name = ""
        while True:
            st = os.fstat(fd)
            subdirectories: list[str] = []
            with contextlib.suppress(OSError), os.scandir(fd) as entries:
                for entry in entries:
                    try:
                        st_entry = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    yield st_entry
                    if stat.S_ISDIR(st_entry.st_mode):
                        subdirectories.append(entry.name)
            stack.append(_Frame(name, _ident(st), subdirectories))
            child = None
            while child is None:
                if stack[-1].pending:
                    name = stack[-1].pending.pop()
                    child = _open_for_walk(fd, name, reclaim)
                    continue
                stack.pop()
                if not stack:
                    return
                try:
                    up = _climb(fd, stack[-1].ident)
                except OSError:  # moved or made unreadable under the walk
                    up = _descend_again(dir_fd, stack, reclaim)
                os.close(fd)
                fd = up
            os.close(fd)
            fd = child
    finally:
        os.close(fd)


def _descend_again(top_fd: int, stack: list[_Frame], reclaim: bool) -> int:
    """A descriptor of the deepest directory of ``stack`` still where the walk found it,
    going down from ``top_fd`` by name; the frames beneath it are dropped."""
    fd = os.dup(top_fd)
    for depth in range(1, len(stack)):
        child = _open_for_walk(fd, stack[depth].name, reclaim)
        if child is not None and _ident(os.fstat(child)) == stack[depth].ident:
            os.close(fd)
            fd = child
            continue
        if child is not None:
            os.close(child)
        del stack[depth:]
        break
    return fd


def _open_for_walk(parent_fd: int, name: str, reclaim: bool) -> int | None:
    """The directory ``name``, opened (with ``reclaim``: the owner's r-x given back on it
    and its parent first if code took them — the parent's x since it was listed too), or
    None when it cannot be."""
    try:
        if reclaim:
            return open_dir_accessible(parent_fd, name, want=READ_SEARCH)
        return os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except OSError:
        return None


# -- deletion -----------------------------------------------------------------------------


def grant_owner_access(
    parent_fd: int, name: str, *, want: int = 0o700, parent_want: int = 0o700
) -> None:
    """Give the owner (us) ``want`` bits back on the entry ``name`` and ``parent_want`` on
    ``parent_fd`` (a directory or regular file, never a link's target): code took them
    away with chmod.

    The entry is reached with ``O_PATH | O_NOFOLLOW`` (no permission needed, a symlink is
    the link itself and left alone) and changed through ``/proc/self/fd``, which names
    exactly that inode. Raises ``PermissionError`` when we are not the owner.
    """
    _give_owner(parent_fd, parent_want)  # no search on the parent: the lookup itself fails
    try:
        pfd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
    except FileNotFoundError:
        return
    try:
        st = os.fstat(pfd)
        kind_ok = stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)
        if kind_ok and st.st_mode & want != want:
            os.chmod(f"/proc/self/fd/{pfd}", stat.S_IMODE(st.st_mode) | want)
    finally:
        os.close(pfd)


def open_dir_accessible(parent_fd: int, name: str, *, want: int = 0o700) -> int:
    """Open a directory of ours, granting ourselves ``want`` on it (and on its parent)
    first if it was taken away: rwx to change it (w to unlink, x for lookups), r-x
    (``READ_SEARCH``) to read all of it."""
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except PermissionError:
        grant_owner_access(parent_fd, name, want=want, parent_want=want)
        fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    try:
        _give_owner(fd, want)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _give_owner(fd: int, want: int) -> None:
    """The owner's ``want`` bits on the open ``fd``, if any is missing (``OSError`` when it
    is not ours)."""
    mode = os.fstat(fd).st_mode
    if mode & want != want:
        os.fchmod(fd, stat.S_IMODE(mode) | want)


def _unlink(fd: int, name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=fd)


def _empty_and_remove(parent_fd: int, name: str) -> None:
    parent_ident = _ident(os.fstat(parent_fd))
    fd = open_dir_accessible(parent_fd, name)
    try:
        stack = [_Frame(name, _ident(os.fstat(fd)), _names(fd))]
        while stack:
            top = stack[-1]
            if top.pending:
                entry = top.pending.pop()
                try:
                    st = os.stat(entry, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if not stat.S_ISDIR(st.st_mode):
                    _unlink(fd, entry)  # files, symlinks (never followed), FIFOs, sockets
                    continue
                try:
                    child = open_dir_accessible(fd, entry)
                except FileNotFoundError:
                    continue
                os.close(fd)
                fd = child
                stack.append(_Frame(entry, _ident(os.fstat(fd)), _names(fd)))
                continue
            late = _names(fd)  # the next batch, or anything created while we emptied it
            if late:
                top.pending = late
                continue
            stack.pop()
            up = _climb(fd, stack[-1].ident if stack else parent_ident)
            os.close(fd)
            fd = up
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(top.name, dir_fd=fd)
    finally:
        os.close(fd)


def remove_tree(dir_fd: int, name: str) -> None:
    """Delete ``name`` beneath ``dir_fd`` whatever it is, never following a symlink.

    A symlink is unlinked (its target untouched), so a link planted to ``/`` cannot widen
    the deletion. Missing entries are fine (idempotent).
    """
    for attempt in range(_REMOVE_ATTEMPTS):
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(st.st_mode):
            _unlink(dir_fd, name)
            return
        try:
            _empty_and_remove(dir_fd, name)
        except (TreeChanged, FileNotFoundError):
            if attempt == _REMOVE_ATTEMPTS - 1:
                raise
        except OSError as e:
            if e.errno != errno.ENOTEMPTY or attempt == _REMOVE_ATTEMPTS - 1:
                raise


def entry_exists(dir_fd: int, name: str) -> bool:
    """True when ``name`` exists beneath ``dir_fd`` as anything (a link is not followed)."""
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True
