"""Upload metadata: what makes a file in a conversation's temparea a user upload.

Contract:
- One JSON document per upload at ``.runtime/meta/{cid}/{hash of name}.json`` (a hash,
  not the name: "{name}.json" could pass the 255-byte limit). It records what we stored:
  name, size, sha256, type, time, and the file's inode with its ctime/mtime, so a file
  code put in the upload's place (another inode: a new file, a hard link to something
  else) is never taken for the upload, and one code changed in place is recognised.
- Memory is the authority while the runtime runs (everything is loaded at start); the
  disk copy is written through and is what the next start loads. Tampering with the
  documents while we run changes nothing we answer, and is repaired from memory:
  ``check(cid)`` (one ``fstatat`` per upload, on every listing) rewrites a document that
  is not the one we wrote; ``rewrite_all`` restores everything after ``.runtime`` was
  rebuilt.
- ``load`` trusts a document only when it is a regular file that parses, names a valid
  file name whose hash is its own file name, in a directory named by a valid
  conversation id; anything else is removed. It never follows a link, never blocks on a
  FIFO (opened non-blocking, then refused as not a regular file).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import threading
from dataclasses import MISSING, asdict, dataclass, fields, replace

from . import pathsafe, tree
from .state import META, StateDir, write_atomically

log = logging.getLogger(__name__)

_MAX_DOC_BYTES = 64 * 1024
_KINDS = {"int": int, "bool": bool}  # a field's annotation → its JSON type (else str)


def meta_file_name(file_name: str) -> str:
    return hashlib.sha256(file_name.encode()).hexdigest()[:40] + ".json"


def valid_conversation_id(cid: str) -> bool:
    try:
        return pathsafe.check_name(cid) == cid and not cid.startswith(".")
    except pathsafe.UnsafePath:
        return False


@dataclass(frozen=True)
class UploadMeta:
    name: str
    size: int
    sha256: str
    mime_type: str
    uploaded_at: str
    ino: int
    ctime_ns: int
    mtime_ns: int

    @classmethod
    def of(cls, st: os.stat_result, **recorded: str | int) -> UploadMeta:
        """The record of the file ``st`` describes, with ``recorded`` (name, size, sha256,
        mime_type, uploaded_at)."""
        return cls(**recorded, ino=0, ctime_ns=0, mtime_ns=0).with_identity(st)

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    def with_identity(self, st: os.stat_result) -> UploadMeta:
        return replace(self, ino=st.st_ino, ctime_ns=st.st_ctime_ns, mtime_ns=st.st_mtime_ns)

    def same_file(self, st: os.stat_result) -> bool:
        """The very file we stored (same inode), whatever happened to its bytes since."""
        return stat.S_ISREG(st.st_mode) and st.st_ino == self.ino

    def unchanged(self, st: os.stat_result) -> bool:
        # ctime cannot be set back by code (utime can forge mtime, not ctime).
        return (st.st_size, st.st_ctime_ns, st.st_mtime_ns) == (
            self.size,
            self.ctime_ns,
            self.mtime_ns,
        )

    @classmethod
    def parse(cls, data: bytes) -> UploadMeta | None:
        doc = named_document(data)
        if doc is None:
            return None
        values = {}
        for f in fields(cls):
            if f.name not in doc and f.default is not MISSING:
                continue  # a field added since the document was written: its default
            value = doc.get(f.name)
            kind = _KINDS.get(str(f.type), str)
            if type(value) is not kind:  # bool is an int: refuse it too
                return None
            values[f.name] = value
        return cls(**values)


def named_document(data: bytes) -> dict | None:
    """A JSON object whose "name" is a valid file name exactly as stored, or None."""
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("name"), str):
        return None
    try:
        return doc if pathsafe.check_name(doc["name"]) == doc["name"] else None
    except pathsafe.UnsafePath:
        return None


def read_document(
    dir_fd: int, name: str, limit: int = _MAX_DOC_BYTES
) -> tuple[bytes, os.stat_result] | None:
    """A small regular file's bytes and stat, or None (missing, link, FIFO, dir, too big)."""
    try:
        fd = os.open(
            name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd
        )
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return None
        return os.read(fd, limit + 1), st
    finally:
        os.close(fd)


class MetaStore:
    """Upload metadata of every conversation, in memory and under ``.runtime/meta``."""

    def __init__(self, state: StateDir) -> None:
        self.state = state
        self._lock = threading.RLock()  # RLock: a write may trigger a repair that rewrites all
        self._uploads: dict[str, dict[str, UploadMeta]] = {}
        self._written: dict[tuple[str, str], tuple[int, int]] = {}  # doc → (ino, size)

    # -- start ------------------------------------------------------------------------

    def load(self) -> dict[str, list[UploadMeta]]:
        """Read every trustworthy document from disk into memory, removing the rest."""
        found: dict[str, list[UploadMeta]] = {}
        removed = 0
        with self._lock, self.state.directory(META) as mfd:
            for cid in os.listdir(mfd):
                st = os.stat(cid, dir_fd=mfd, follow_symlinks=False)
                if not (valid_conversation_id(cid) and stat.S_ISDIR(st.st_mode)):
                    tree.remove_tree(mfd, cid)
                    removed += 1
                    continue
                cfd = tree.open_dir_accessible(mfd, cid)
                try:
                    for doc in os.listdir(cfd):
                        read = read_document(cfd, doc)
                        meta = UploadMeta.parse(read[0]) if read is not None else None
                        if read is None or meta is None or meta_file_name(meta.name) != doc:
                            tree.remove_tree(cfd, doc)
                            removed += 1
                            continue
                        found.setdefault(cid, []).append(meta)
                        self._uploads.setdefault(cid, {})[meta.name] = meta
                        self._written[(cid, doc)] = (read[1].st_ino, read[1].st_size)
                finally:
                    os.close(cfd)
        if removed:
            log.warning("removed untrustworthy upload metadata", extra={"entries": removed})
        return found

    # -- reads ------------------------------------------------------------------------

    def get(self, cid: str, name: str) -> UploadMeta | None:
        with self._lock:
            return self._uploads.get(cid, {}).get(name)

    def entries(self, cid: str) -> list[UploadMeta]:
        with self._lock:
            return list(self._uploads.get(cid, {}).values())

    def conversations(self) -> list[str]:
        with self._lock:
            return list(self._uploads)

    # -- writes -----------------------------------------------------------------------

    def put(self, cid: str, meta: UploadMeta) -> None:
        with self._lock:
            self._uploads.setdefault(cid, {})[meta.name] = meta
            self._write(cid, [meta])

    def remove(self, cid: str, name: str) -> None:
        with self._lock:
            self._uploads.get(cid, {}).pop(name, None)
            doc = meta_file_name(name)
            self._written.pop((cid, doc), None)
            with self.state.directory(META, cid, create=True) as cfd:
                tree.remove_tree(cfd, doc)

    def drop(self, cid: str) -> bool:
        """Forget a conversation's uploads and delete its metadata directory; True when
        that directory is verifiably gone."""
        with self._lock:
            self._uploads.pop(cid, None)
            for key in [k for k in self._written if k[0] == cid]:
                del self._written[key]
            with self.state.directory(META, create=True) as mfd:
                tree.remove_tree(mfd, cid)
                return not tree.entry_exists(mfd, cid)

    def check(self, cid: str) -> None:
        """Rewrite any document of ``cid`` that is not the one we wrote (cheap: stats)."""
        with self._lock:
            metas = self._uploads.get(cid)
            if not metas:
                return
            with self.state.directory(META, cid, create=True) as cfd:
                stale = []
                for meta in metas.values():
                    doc = meta_file_name(meta.name)
                    try:
                        st = os.stat(doc, dir_fd=cfd, follow_symlinks=False)
                    except FileNotFoundError:
                        stale.append(meta)
                        continue
                    if not stat.S_ISREG(st.st_mode) or self._written.get((cid, doc)) != (
                        st.st_ino,
                        st.st_size,
                    ):
                        stale.append(meta)
            if stale:
                log.warning(
                    "upload metadata was tampered with; rewritten from memory",
                    extra={"conversation_id": cid, "documents": len(stale)},
                )
                self._write(cid, stale)

    def rewrite_all(self) -> None:
        """After ``.runtime`` was rebuilt: write back everything memory holds."""
        with self._lock:
            self._written.clear()
            for cid, metas in self._uploads.items():
                self._write(cid, list(metas.values()))

    def _write(self, cid: str, metas: list[UploadMeta]) -> None:
        with self.state.directory(META, cid, create=True) as cfd:
            for meta in metas:
                doc = meta_file_name(meta.name)
                data = meta.to_bytes()
                write_atomically(cfd, doc, data)
                self._written[(cid, doc)] = (
                    os.stat(doc, dir_fd=cfd, follow_symlinks=False).st_ino,
                    len(data),
                )
