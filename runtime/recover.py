"""Start-up reconciliation of upload records with what temparea holds.

Contract: for each recorded upload — the conversation directory is gone: its records
go; the file is still the stored one and unchanged: kept as is; a regular file of the
recorded size whose bytes hash to the recorded sha256 (a restored volume gives files new
inodes): kept and re-identified, so the next start need not hash it again; the stored
file changed in place: kept (listed as modified); anything else (missing, another file,
a link): the record goes. Hashing happens only for records that do not match, at start.

It reads the workspace through ``UploadsView`` (what ``workspace.Workspace`` provides),
so this module does not import ``workspace``, which calls it: no import cycle.
"""

from __future__ import annotations

import hashlib
import os
from typing import Protocol

from . import pathsafe
from .metastore import MetaStore, UploadMeta

_CHUNK = 1024 * 1024


class UploadsView(Protocol):
    """The part of a workspace the reconciliation reads and corrects."""

    root: pathsafe.SafeRoot
    meta: MetaStore

    def current_uploads(
        self, cid: str, *, any_file: bool = False
    ) -> list[tuple[UploadMeta, os.stat_result | None]]: ...

    def uploads_parts(self, cid: str) -> list[str]: ...


def verify_uploads(ws: UploadsView) -> None:
    for cid in ws.meta.conversations():
        if not ws.root.exists_dir([cid]):
            ws.meta.drop(cid)
            continue
        for meta, st in ws.current_uploads(cid, any_file=True):
            if st is not None and meta.same_file(st) and meta.unchanged(st):
                continue
            same_size = st is not None and st.st_size == meta.size
            if same_size and _sha256(ws, cid, meta.name) == meta.sha256:
                ws.meta.put(cid, meta.with_identity(st))
            elif st is None or not meta.same_file(st):
                ws.meta.remove(cid, meta.name)


def _sha256(ws: UploadsView, cid: str, name: str) -> str | None:
    try:
        fd = ws.root.open_file([*ws.uploads_parts(cid), name])
    except (pathsafe.NotFound, pathsafe.UnsafePath, NotADirectoryError, PermissionError):
        return None
    digest = hashlib.sha256()
    with os.fdopen(fd, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
