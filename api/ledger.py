"""What runs did to a conversation's files, as this API process saw them (seed 003).

Contract: ``record(session_id, cid, changed, presented)`` notes, from a run's ``result``,
which files under outputs/ the agent created or modified and which it presented;
``source(...)`` and ``presented(...)`` answer for one file. A file the ledger has not seen
(written by ``/execute``, or before this process started) counts as ``ai_created`` and
not presented: outputs/ holds only what code wrote. The ledger lives in memory: it is a
view for the frontend, never a reason to keep or delete a file. ``forget`` drops a
conversation (deleted).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

Source = Literal["user_upload", "ai_created", "ai_modified"]
_MAX_CONVERSATIONS = 10_000  # bounded: oldest conversations are forgotten first


@dataclass
class _Entry:
    modified: set[str] = field(default_factory=set)  # paths as code opens them
    presented: set[str] = field(default_factory=set)


class Ledger:
    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], _Entry] = {}

    def record(
        self, session_id: str, cid: str, changed: Iterable[dict], presented: Iterable[str]
    ) -> None:
        key = (session_id, cid)
        entry = self._entries.pop(key, None) or _Entry()
        self._entries[key] = entry  # re-inserted: most recently used last
        for f in changed:
            if f.get("status") == "modified":
                entry.modified.add(f["path"])
            else:  # created again after a delete: no longer "modified"
                entry.modified.discard(f["path"])
        entry.presented.update(presented)
        while len(self._entries) > _MAX_CONVERSATIONS:
            del self._entries[next(iter(self._entries))]

    def output_source(self, session_id: str, cid: str, path: str) -> Source:
        entry = self._entries.get((session_id, cid))
        return "ai_modified" if entry and path in entry.modified else "ai_created"

    def is_presented(self, session_id: str, cid: str, path: str) -> bool:
        entry = self._entries.get((session_id, cid))
        return bool(entry and path in entry.presented)

    def forget(self, session_id: str, cid: str) -> None:
        self._entries.pop((session_id, cid), None)
