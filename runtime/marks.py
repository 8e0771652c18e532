"""What runs did to a conversation's files, kept with the files (seed 003's provenance).

A run that ends with a result tells the runtime which files under outputs/ it created or
modified and which files it presented to the user (``POST .../marks``); listings answer
``modified`` / ``presented`` per file from here. Kept on the volume, not in an API
process: every API replica, and an API restarted, reads the same answer, and deleting the
conversation deletes its marks.

Contract:
- One JSON document per conversation at ``.runtime/marks/{hash of cid}.json`` (a hash:
  a 255-byte id plus ".json" would pass the file-name limit):
  ``{"conversation_id": cid, "modified": [path…], "presented": [path…]}``, paths as code
  opens them. Memory is the authority while the runtime runs; the document is written
  through (atomically) and loaded at the next start. Executed code cannot reach
  ``.runtime`` (Landlock); a document that is not what we would write (not a regular
  file, not JSON of that shape, an id whose hash is not its name, too big) is removed at
  load — marks are a view for a frontend, never a reason to keep or delete a file.
- ``record`` applies one run's report: a path reported ``modified`` is marked, one
  reported ``created`` loses the mark (created again after a delete), presented paths are
  added. Each set is bounded (``MAX_MARKS``, oldest dropped first) so a chatty agent cannot
  grow the document without limit.
- ``drop(cid)`` forgets the conversation and removes its document (conversation deleted);
  ``rewrite_all`` writes everything back after ``.runtime`` was rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from dataclasses import dataclass, field

from . import tree
from .metastore import read_document, valid_conversation_id
from .schemas import MAX_MARK_PATH
from .state import MARKS, StateDir, write_atomically

log = logging.getLogger(__name__)

MAX_MARKS = 1000  # per set and conversation
_MAX_DOC_BYTES = 2 * MAX_MARKS * (MAX_MARK_PATH * 6 + 8) + 4096  # json escapes: 6 per byte


@dataclass
class ConversationMarks:
    # dicts as ordered sets: insertion order is age, the oldest is dropped first
    modified: dict[str, None] = field(default_factory=dict)
    presented: dict[str, None] = field(default_factory=dict)

    def to_bytes(self, cid: str) -> bytes:
        doc = {"conversation_id": cid, "modified": [*self.modified], "presented": [*self.presented]}
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def parse(cls, data: bytes) -> tuple[str, ConversationMarks] | None:
        """The conversation id and its marks, or None when ``data`` is not a document we
        would write."""
        try:
            doc = json.loads(data)
        except ValueError:
            return None
        if not isinstance(doc, dict) or not isinstance(cid := doc.get("conversation_id"), str):
            return None
        sets = [doc.get("modified"), doc.get("presented")]
        if not all(isinstance(s, list) and all(isinstance(p, str) for p in s) for s in sets):
            return None
        return cid, cls(*({p: None for p in s[-MAX_MARKS:]} for s in sets))


def doc_name(cid: str) -> str:
    return hashlib.sha256(cid.encode()).hexdigest()[:40] + ".json"


def _bounded(marks: dict[str, None]) -> None:
    while len(marks) > MAX_MARKS:
        del marks[next(iter(marks))]


class MarksStore:
    """Every conversation's marks, in memory and under ``.runtime/marks``."""

    def __init__(self, state: StateDir) -> None:
        self.state = state
        self._lock = threading.RLock()  # a write may repair .runtime, which rewrites all
        self._marks: dict[str, ConversationMarks] = {}

    def load(self) -> None:
        """Read every trustworthy document into memory; remove the rest."""
        removed = 0
        with self._lock, self.state.directory(MARKS) as dfd:
            for doc in os.listdir(dfd):
                read = read_document(dfd, doc, _MAX_DOC_BYTES)
                found = ConversationMarks.parse(read[0]) if read is not None else None
                cid = found[0] if found else ""
                if not (found and valid_conversation_id(cid) and doc_name(cid) == doc):
                    tree.remove_tree(dfd, doc)
                    removed += 1
                    continue
                self._marks[cid] = found[1]
        if removed:
            log.warning("removed untrustworthy output marks", extra={"entries": removed})

    def get(self, cid: str) -> ConversationMarks:
        with self._lock:
            found = self._marks.get(cid) or ConversationMarks()
            return ConversationMarks(dict(found.modified), dict(found.presented))

    def record(
        self, cid: str, modified: list[str], created: list[str], presented: list[str]
    ) -> ConversationMarks:
        with self._lock:
            marks = self._marks.setdefault(cid, ConversationMarks())
            for path in created:
                marks.modified.pop(path, None)
            for path in modified:
                marks.modified.pop(path, None)  # re-inserted: most recent last
                marks.modified[path] = None
            for path in presented:
                marks.presented.pop(path, None)
                marks.presented[path] = None
            _bounded(marks.modified)
            _bounded(marks.presented)
            self._write(cid, marks)
            return self.get(cid)

    def drop(self, cid: str) -> bool:
        """Forget a conversation's marks and delete its document; True when verifiably gone."""
        with self._lock:
            self._marks.pop(cid, None)
            with self.state.directory(MARKS, create=True) as dfd:
                tree.remove_tree(dfd, doc_name(cid))
                return not tree.entry_exists(dfd, doc_name(cid))

    def rewrite_all(self) -> None:
        """After ``.runtime`` was rebuilt: write back everything memory holds."""
        with self._lock:
            for cid, marks in self._marks.items():
                self._write(cid, marks)

    def _write(self, cid: str, marks: ConversationMarks) -> None:
        with self.state.directory(MARKS, create=True) as dfd:
            write_atomically(dfd, doc_name(cid), marks.to_bytes(cid))
