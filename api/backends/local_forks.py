"""The local backend's record of which conversations a fork made (``Backend.fork_opened``),
kept where no code in a sandbox can write.

A local conversation exists as its directory in the session's workspace, which the
runtime makes and code in the sandbox can write (under bubblewrap it sees the workspace
and its session's directory, never the rest of the data directory). A fork's origin
written there could be forged — code planting one in a conversation the user made would
let a fork claim it — so it is kept here, in the API's data directory:
``{data_dir}/fork-origins/{h(session_id)}/{h(conversation_id)}.json`` (``h``: SHA-256,
so any id is a file name), the document naming both ids again (compared on read).

Contract:
- ``record`` writes the origin atomically (a temporary file renamed), before the
  conversation's directory exists: the fork's first durable step, so an API killed at
  any later point leaves the record beside whatever else it made.
- ``read`` answers the origin recorded for the conversation, None for none (or for a
  document not naming these ids, or unreadable).
- ``forget`` removes a conversation's record (its deletion, or a conversation made
  otherwise under the id after a fork was cut off before its directory);
  ``forget_session`` a session's.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path

from .base import ForkOrigin


def _h(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


class ForkRecords:
    def __init__(self, data_dir: Path) -> None:
        self.root = data_dir / "fork-origins"

    def _session(self, session_id: str) -> Path:
        return self.root / _h(session_id)

    def _path(self, session_id: str, conversation_id: str) -> Path:
        return self._session(session_id) / f"{_h(conversation_id)}.json"

    def record(self, session_id: str, conversation_id: str, origin: ForkOrigin) -> None:
        path = self._path(session_id, conversation_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"session_id": session_id, "conversation_id": conversation_id,
               "origin": origin.to_json()}  # fmt: skip
        tmp = path.with_name(f".{uuid.uuid4().hex}.tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, path)

    def read(self, session_id: str, conversation_id: str) -> ForkOrigin | None:
        try:
            doc = json.loads(self._path(session_id, conversation_id).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(doc, dict) or (doc.get("session_id"), doc.get("conversation_id")) != (
            session_id,
            conversation_id,
        ):
            return None
        return ForkOrigin.parse(doc.get("origin"))

    def forget(self, session_id: str, conversation_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(session_id, conversation_id).unlink()

    def forget_session(self, session_id: str) -> None:
        shutil.rmtree(self._session(session_id), ignore_errors=True)
