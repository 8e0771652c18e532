"""The object store: one interface (``ObjectStore``), two implementations (``DirStore``, a
local directory; ``S3Store``, any S3-compatible service), chosen once at start.

Neutral ground for the API and the operator (see ``base`` for the contract, ``layout``
for where a conversation's files and metadata live).
"""

from __future__ import annotations

from pathlib import Path

from .base import (
    Body,
    Download,
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    PreconditionFailed,
    StoreConfigError,
    StoreError,
    StoreUnavailable,
)
from .dirstore import DirStore
from .s3 import S3Store
from .settings import S3Settings, StoreMode


async def open_store(mode: StoreMode, s3: S3Settings, local_root: Path | None = None):
    """The store of ``mode``, checked (``StoreConfigError`` naming the setting), or None
    for ``local`` without a directory (files live only in the workspaces)."""
    store: ObjectStore
    if mode == "s3":
        store = S3Store(s3)
    elif local_root is not None:
        store = DirStore(local_root)
    else:
        return None
    await store.check()
    return store


__all__ = [
    "Body",
    "DirStore",
    "Download",
    "ObjectInfo",
    "ObjectNotFound",
    "ObjectStore",
    "PreconditionFailed",
    "S3Settings",
    "S3Store",
    "StoreConfigError",
    "StoreError",
    "StoreMode",
    "StoreUnavailable",
    "open_store",
]
