"""The object store interface: what the API and the operator need of a bucket.

Neutral ground (as ``sandbox_workspace.kube``): the API moves conversation files through
it, the operator checks a conversation's prefix is empty before it releases a finalizer.
The runtime never imports it — a sandbox pod holds no store credential.

Contract of every implementation (``DirStore``, ``S3Store``; the same contract tests run
against both, tests/unit/test_store_contract.py):
- Keys are ``/``-separated strings with no empty, ``.`` or ``..`` segment; a prefix ends
  with ``/`` and lists exactly the keys below it.
- ``put`` is atomic: readers see the old object or the whole new one, never a part.
  Bodies may be ``bytes`` or an async iterable of chunks (streamed; memory stays flat).
  Preconditions make it a compare-and-swap: ``if_absent`` fails when the key exists,
  ``if_match`` fails unless the current object's ETag is that one — both with
  ``PreconditionFailed``. It answers the new object's ETag.
- ``get`` streams; a missing key is ``ObjectNotFound``; ``head`` answers None for one.
- ``copy`` makes ``dst`` a new object with ``src``'s bytes without moving them through
  this process (S3: a server-side CopyObject; a directory: a reflink where the filesystem
  has one, else a copy) — the two are independent objects from then on; a missing
  ``src`` is ``ObjectNotFound``.
- ``delete`` and ``delete_prefix`` are idempotent (gone is success); ``delete_prefix``
  answers how many objects it still finds under the prefix afterwards (0: verified gone).
- ``check`` is called once at start: a missing bucket, bad credentials or an unreachable
  endpoint raise ``StoreConfigError`` whose message names the setting to change.
- Failures of the service itself are ``StoreUnavailable`` (retry later).
- Errors are the store's own (``StoreError`` and its subclasses), plain exceptions that
  know nothing of HTTP: the operator and the CLI read them as they are, the API
  translates them once, at its edge (``api/backends/store_errors.py``).
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol
from urllib.parse import quote

Body = bytes | AsyncIterable[bytes]


class StoreError(Exception):
    """Base of the object store's errors (the API answers them: api/backends/store_errors.py)."""


class StoreConfigError(StoreError):
    """The store cannot be used as configured (bucket, credentials, endpoint)."""


class StoreUnavailable(StoreError):
    """The store did not answer, or answered an error; retrying later may work."""


class ObjectNotFound(StoreError):
    """No object at that key."""


class PreconditionFailed(StoreError):
    """A conditional put lost: the object exists (``if_absent``) or changed (``if_match``)."""


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    etag: str
    modified: datetime


class Download(Protocol):
    """An open object: its ``info``, then its bytes by iteration (once)."""

    info: ObjectInfo

    def __aiter__(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


class ObjectStore(Protocol):
    async def check(self) -> None:
        """Raise ``StoreConfigError`` (naming the setting) unless the store is usable."""

    async def put(
        self, key: str, body: Body, *, if_absent: bool = False, if_match: str | None = None
    ) -> str:
        """Write ``key`` atomically; answer its new ETag."""

    async def get(self, key: str) -> Download: ...

    async def read(self, key: str) -> tuple[bytes, str]:
        """A small object's bytes and ETag (``ObjectNotFound`` when missing)."""

    async def head(self, key: str) -> ObjectInfo | None: ...

    def list(self, prefix: str) -> AsyncIterator[ObjectInfo]:
        """Every object whose key starts with ``prefix`` (in no particular order)."""

    async def copy(self, src: str, dst: str) -> None:
        """``dst`` becomes an independent copy of ``src``, no bytes through here."""

    async def delete(self, key: str) -> None: ...

    async def delete_prefix(self, prefix: str) -> int:
        """Delete everything under ``prefix``; answer how many objects remain under it."""

    async def aclose(self) -> None: ...


def scope_segment(value: str) -> str:
    """One opaque key segment from any id: percent-encoded so that no id can add a
    ``/``, be ``.``/``..``, or equal the encoding of another id (injective)."""
    encoded = quote(value, safe="-_~@+=,;:")
    return encoded.replace(".", "%2E") if encoded.strip(".") == "" else encoded


def check_key(key: str) -> str:
    """A key of an object: non-empty ``/``-separated segments, none ``.`` or ``..``."""
    if any(p in ("", ".", "..") for p in key.split("/")):
        raise ValueError(f"invalid object key {key!r}")
    return key


def check_prefix(prefix: str) -> str:
    """A prefix: empty (everything), or a key followed by ``/``."""
    if prefix and not (prefix.endswith("/") and check_key(prefix[:-1])):
        raise ValueError(f"invalid key prefix {prefix!r} (must end with '/')")
    return prefix
