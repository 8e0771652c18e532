"""Path safety: the one place where untrusted names become file-system locations.

Contract:
- ``check_name``, ``split_relative`` and ``UnsafePath`` are the contract's id rules
  (``sandbox_workspace/contract/ids.py``), re-exported for the runtime's file code.
- ``SafeRoot`` walks beneath a root directory file descriptor one component at a time with
  ``O_NOFOLLOW``; a symlink anywhere under the root is never followed (it raises
  ``UnsafePath``), whatever code running in the sandbox planted. Nothing here resolves a
  path string with ``realpath``. Modes code set to lock the runtime out of its own tree
  (``chmod 000``) are given back to the owner when a lookup meets them.
- ``remove_tree`` (from ``tree``): iterative deletion beneath a directory descriptor that
  never follows a symlink and survives any depth, count, name or mode.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator, Sequence

from sandbox_workspace.contract.ids import MAX_NAME_BYTES, UnsafePath, check_name, split_relative

from .tree import DIR_FLAGS as _DIR_FLAGS
from .tree import grant_owner_access, remove_tree

__all__ = [
    "MAX_NAME_BYTES",
    "NotFound",
    "SafeRoot",
    "UnsafePath",
    "check_name",
    "remove_tree",
    "split_relative",
]


class NotFound(FileNotFoundError):
    """The safe path does not exist (or is not the kind of entry asked for)."""


class SafeRoot:
    """A directory opened once; every lookup beneath it refuses to follow symlinks."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        os.makedirs(self.path, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def open_dir(self, parts: Sequence[str], *, create: bool = False) -> int:
        """Open the directory ``parts`` beneath the root; the caller closes the fd."""
        fd = os.dup(self._fd)
        try:
            for part in parts:
                try:
                    nxt = _open_component(fd, part, create=create)
                except FileNotFoundError as e:
                    raise NotFound(part) from e
                except (NotADirectoryError, OSError) as e:
                    if _is_symlink(fd, part):
                        raise UnsafePath(f"'{part}' is a symbolic link; refusing to follow") from e
                    if isinstance(e, NotADirectoryError):
                        raise NotFound(part) from e
                    raise
                os.close(fd)
                fd = nxt
            return fd
        except BaseException:
            os.close(fd)
            raise

    @contextlib.contextmanager
    def directory(self, parts: Sequence[str], *, create: bool = False) -> Iterator[int]:
        """Yield an fd for the directory ``parts`` (created when asked), closing it after."""
        fd = self.open_dir(parts, create=create)
        try:
            yield fd
        finally:
            os.close(fd)

    def exists_dir(self, parts: Sequence[str]) -> bool:
        """True for a real directory; False when missing or a symlink (never followed)."""
        if not parts:
            return True
        try:
            return stat.S_ISDIR(self.lstat(parts).st_mode)
        except (NotFound, UnsafePath, NotADirectoryError):
            return False

    def open_file(self, parts: Sequence[str]) -> int:
        """Open a regular file for reading; symlinks, FIFOs, devices and dirs are refused."""
        *dirs, name = parts
        with self.directory(dirs) as dfd:
            # O_NONBLOCK: opening a FIFO planted by sandbox code must not hang us.
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            try:
                try:
                    fd = os.open(name, flags, dir_fd=dfd)
                except PermissionError:  # code made it unreadable: it is still ours
                    grant_owner_access(dfd, name, want=0o600)
                    fd = os.open(name, flags, dir_fd=dfd)
            except FileNotFoundError as e:
                raise NotFound(name) from e
            except OSError as e:
                if _is_symlink(dfd, name):
                    raise UnsafePath(f"'{name}' is a symbolic link; refusing to follow") from e
                raise
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise NotFound(name)
        os.set_blocking(fd, True)
        return fd

    def lstat(self, parts: Sequence[str]) -> os.stat_result:
        *dirs, name = parts
        with self.directory(dirs) as dfd:
            try:
                return os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError as e:
                raise NotFound(name) from e


def _open_component(fd: int, part: str, *, create: bool) -> int:
    """One step down. Everything under the root is the runtime's: modes that code set to
    lock us out (chmod 000, a parent without search) are given back, then retried once."""
    for attempt in (1, 2):
        try:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
            return os.open(part, _DIR_FLAGS, dir_fd=fd)
        except PermissionError:
            if attempt == 2:
                raise
            grant_owner_access(fd, part)
    raise AssertionError("unreachable")


def _is_symlink(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False
