"""Migration of workspaces written by older runtimes (a PVC outlives the image).

Layout 1 kept upload metadata inside the conversation, ``{cid}/uploads/.meta/{hash}.json``
(``{"name", "size", "sha256", "mime_type", "uploaded_at"}``), where executed code could
forge it. Layout 2 keeps it under ``.runtime/meta/{cid}/`` (``metastore``).

Contract: runs at start until ``.runtime/layout`` says 2 (then never again, so a
``.meta`` directory code creates later is just code's files). A layout-1 document is
carried over only if it parses, its hash matches its name, and temparea holds a regular
file (no link followed) of that name and the recorded size; the new record takes that
file's inode, so later replacement is noticed. Every ``{cid}/uploads/.meta`` entry —
directory, symlink (never followed) or file — is removed afterwards. Idempotent: a crash
half-way leaves the marker unwritten and the next start finishes the job.
"""

from __future__ import annotations

import logging
import os
import stat

from . import pathsafe, tree
from .metastore import (
    MetaStore,
    UploadMeta,
    meta_file_name,
    named_document,
    read_document,
    valid_conversation_id,
)
from .schemas import UPLOAD_SUBDIR

log = logging.getLogger(__name__)

OLD_META = ".meta"


def migrate(root: pathsafe.SafeRoot, store: MetaStore) -> int:
    """Carry layout-1 metadata over (once); returns how many uploads were migrated."""
    if store.state.layout_migrated():
        return 0
    migrated = 0
    with root.directory([]) as rfd:
        cids = [c for c in os.listdir(rfd) if valid_conversation_id(c)]
    for cid in cids:
        try:
            ufd = root.open_dir([cid, "uploads"])
        except (pathsafe.NotFound, pathsafe.UnsafePath, NotADirectoryError):
            continue
        try:
            if tree.entry_exists(ufd, OLD_META):
                migrated += _migrate_conversation(root, store, cid, ufd)
                tree.remove_tree(ufd, OLD_META)
        finally:
            os.close(ufd)
    store.state.mark_layout_migrated()
    if migrated:
        log.info(
            "migrated upload metadata out of conversation directories", extra={"uploads": migrated}
        )
    return migrated


def _migrate_conversation(root: pathsafe.SafeRoot, store: MetaStore, cid: str, ufd: int) -> int:
    st = os.stat(OLD_META, dir_fd=ufd, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode):
        return 0
    mfd = tree.open_dir_accessible(ufd, OLD_META)
    count = 0
    try:
        for doc in os.listdir(mfd):
            read = read_document(mfd, doc)
            old = _parse_layout1(read[0]) if read is not None else None
            if old is None or meta_file_name(old["name"]) != doc:
                continue
            try:
                fst = root.lstat([cid, "uploads", UPLOAD_SUBDIR, old["name"]])
            except (pathsafe.NotFound, pathsafe.UnsafePath, NotADirectoryError):
                continue
            if not stat.S_ISREG(fst.st_mode) or fst.st_size != old["size"]:
                continue
            recorded = {k: old[k] for k in ("name", "size", "sha256", "mime_type", "uploaded_at")}
            meta = UploadMeta.of(fst, **recorded)
            store.put(cid, meta)
            count += 1
    finally:
        os.close(mfd)
    return count


def _parse_layout1(data: bytes) -> dict | None:
    doc = named_document(data)
    if doc is None or type(doc.get("size")) is not int:
        return None
    if not all(isinstance(doc.get(k), str) for k in ("sha256", "uploaded_at")):
        return None
    mime = doc.get("mime_type")
    return {**doc, "mime_type": mime if isinstance(mime, str) else ""}
