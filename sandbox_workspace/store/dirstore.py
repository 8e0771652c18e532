"""``DirStore``: the object store interface over a local directory.

For one machine without an S3 service, and the second implementation the contract tests
hold the S3 one to. Layout: ``{root}/objects/{key}`` (a key's segments are directories
and a file), ``{root}/tmp/`` for bodies being written, ``{root}/lock`` for preconditions.

- A put writes the whole body to ``tmp/`` first (streamed, flat memory), then renames it
  over the key: readers see the old file or the new one, never a part.
- The ETag is the new file's identity (inode, mtime in ns, size): every put makes a new
  file, so it changes on every write, and costs no read of the bytes.
- Conditional puts compare and rename under an exclusive ``flock`` of ``{root}/lock``, so
  they are a compare-and-swap across processes of this machine.
- A key cannot be both an object and the prefix of others (a file is not a directory);
  the layout of workspace keys never needs that.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shutil
import stat
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

from .base import (
    Body,
    ObjectInfo,
    ObjectNotFound,
    PreconditionFailed,
    StoreConfigError,
    check_key,
    check_prefix,
)

_CHUNK = 1024 * 1024
_FICLONE = 0x40049409  # linux/fs.h


def _etag(st: os.stat_result) -> str:
    return f"{st.st_ino:x}-{st.st_mtime_ns:x}-{st.st_size:x}"


def _info(key: str, st: os.stat_result) -> ObjectInfo:
    return ObjectInfo(
        key=key,
        size=st.st_size,
        etag=_etag(st),
        modified=datetime.fromtimestamp(st.st_mtime, UTC),
    )


def _read(path: Path) -> tuple[bytes, str]:
    with open(path, "rb") as f:
        return f.read(), _etag(os.fstat(f.fileno()))


class _Download:
    def __init__(self, file, info: ObjectInfo) -> None:
        self._file = file
        self.info = info

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            while chunk := await asyncio.to_thread(self._file.read, _CHUNK):
                yield chunk
        finally:
            self._file.close()

    async def aclose(self) -> None:
        self._file.close()


class DirStore:
    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.objects = self.root / "objects"
        self.tmp = self.root / "tmp"

    def _path(self, key: str) -> Path:
        return self.objects / check_key(key)

    async def check(self) -> None:
        try:
            for d in (self.objects, self.tmp):
                d.mkdir(parents=True, exist_ok=True)
            (self.root / "lock").touch()
        except OSError as e:
            raise StoreConfigError(f"store directory {self.root} is not usable: {e}") from e

    async def put(
        self, key: str, body: Body, *, if_absent: bool = False, if_match: str | None = None
    ) -> str:
        target = self._path(key)
        tmp = self.tmp / uuid.uuid4().hex
        f = await asyncio.to_thread(open, tmp, "wb")
        try:
            with f:
                if isinstance(body, bytes | bytearray | memoryview):
                    await asyncio.to_thread(f.write, body)
                else:
                    async for chunk in body:
                        await asyncio.to_thread(f.write, chunk)
            return await asyncio.to_thread(self._commit, tmp, target, if_absent, if_match)
        finally:
            tmp.unlink(missing_ok=True)

    def _commit(self, tmp: Path, target: Path, if_absent: bool, if_match: str | None) -> str:
        with open(self.root / "lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if if_absent or if_match is not None:
                try:
                    current = _etag(target.stat())
                except FileNotFoundError:
                    current = None
                if (if_absent and current is not None) or (
                    if_match is not None and current != if_match
                ):
                    raise PreconditionFailed(f"object {target.name!r} changed meanwhile")
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, target)
            return _etag(target.stat())

    async def get(self, key: str) -> _Download:
        path = self._path(key)
        try:
            file = await asyncio.to_thread(open, path, "rb")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
            raise ObjectNotFound(f"no object {key!r}") from e
        return _Download(file, _info(key, os.fstat(file.fileno())))

    async def read(self, key: str) -> tuple[bytes, str]:
        try:
            return await asyncio.to_thread(_read, self._path(key))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
            raise ObjectNotFound(f"no object {key!r}") from e

    async def head(self, key: str) -> ObjectInfo | None:
        try:
            st = await asyncio.to_thread(self._path(key).stat)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return _info(key, st) if stat.S_ISREG(st.st_mode) else None

    def _walk(self, prefix: str) -> list[ObjectInfo]:
        base = self.objects / prefix if prefix else self.objects
        found = []
        for directory, _, files in os.walk(base):
            for name in files:
                path = Path(directory, name)
                with contextlib.suppress(FileNotFoundError):
                    found.append(_info(path.relative_to(self.objects).as_posix(), path.stat()))
        return found

    async def list(self, prefix: str) -> AsyncIterator[ObjectInfo]:
        check_prefix(prefix)
        for info in await asyncio.to_thread(self._walk, prefix):
            yield info

    async def copy(self, src: str, dst: str) -> None:
        await asyncio.to_thread(self._copy, self._path(src), self._path(dst))

    def _copy(self, src: Path, dst: Path) -> None:
        tmp = self.tmp / uuid.uuid4().hex
        try:
            try:
                source = open(src, "rb")  # noqa: SIM115 (closed below)
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
                raise ObjectNotFound(f"no object {src.name!r}") from e
            with source, open(tmp, "wb") as target:
                try:  # a reflink: a new inode sharing the extents (copy-on-write)
                    fcntl.ioctl(target.fileno(), _FICLONE, source.fileno())
                except OSError:
                    shutil.copyfileobj(source, target, _CHUNK)
            self._commit(tmp, dst, False, None)
        finally:
            tmp.unlink(missing_ok=True)

    async def delete(self, key: str) -> None:
        path = self._path(key)
        with contextlib.suppress(FileNotFoundError, IsADirectoryError, NotADirectoryError):
            await asyncio.to_thread(path.unlink)

    async def delete_prefix(self, prefix: str) -> int:
        check_prefix(prefix)
        base = self.objects / prefix if prefix else self.objects
        await asyncio.to_thread(shutil.rmtree, base, True)
        if not prefix:
            self.objects.mkdir(exist_ok=True)
        return len(await asyncio.to_thread(self._walk, prefix))

    async def aclose(self) -> None:
        return None
