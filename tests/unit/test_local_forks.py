"""The local backend's record of a fork's origin (``local_forks``): kept in the API's data
directory, never in the workspace code can write; a fork's new conversation is refused
when it exists otherwise; a record a fork cut off before its directory left never claims
a conversation made otherwise under the id; deletions forget it."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sandbox_workspace.api.backends.base import (
    ConversationExists,
    ForkOrigin,
    Session,
    SessionSpec,
    SessionStatus,
)
from sandbox_workspace.api.backends.local import LocalBackend

A, B = ForkOrigin("c1", None), ForkOrigin("c1", "0" * 32)


def _session(sid: str = "sb-session-u") -> Session:
    spec = SessionSpec(session_id=sid, user_id="u")
    return Session(spec, SessionStatus.STOPPED, datetime.now(UTC), "")


def test_a_forks_origin_is_kept_outside_the_workspace_and_tells_its_fork(tmp_path: Path):
    backend = LocalBackend(tmp_path, http=None)  # type: ignore[arg-type]
    s = _session()
    workspace = backend.workspace_dir(s.session_id)
    asyncio.run(backend.fork_opened(s, "f1", A))
    assert not (workspace / "f1").exists()  # recorded first; the runtime makes the directory
    (workspace / "f1").mkdir(parents=True)
    assert asyncio.run(backend.fork_origin(s, "f1")) == A
    assert list(workspace.rglob("*.json")) == []  # nothing of it where code writes
    asyncio.run(backend.fork_opened(s, "f1", A))  # the same fork, cut off: accepted
    with pytest.raises(ConversationExists):
        asyncio.run(backend.fork_opened(s, "f1", B))  # another fork
    assert asyncio.run(backend.fork_origin(_session("sb-session-v"), "f1")) is None

    (workspace / "c9").mkdir()  # made otherwise
    with pytest.raises(ConversationExists):
        asyncio.run(backend.fork_opened(s, "c9", A))

    # Cut off before its directory, then the id used otherwise: the record is forgotten.
    asyncio.run(backend.fork_opened(s, "f2", A))
    asyncio.run(backend.conversation_opened(s, "f2"))
    (workspace / "f2").mkdir()
    assert asyncio.run(backend.fork_origin(s, "f2")) is None
    with pytest.raises(ConversationExists):
        asyncio.run(backend.fork_opened(s, "f2", A))


def test_a_garbled_or_foreign_record_reads_as_none(tmp_path: Path):
    backend = LocalBackend(tmp_path, http=None)  # type: ignore[arg-type]
    s = _session()
    asyncio.run(backend.fork_opened(s, "f1", A))
    (path,) = (tmp_path / "fork-origins").rglob("*.json")
    path.write_text("{not json")
    assert asyncio.run(backend.fork_origin(s, "f1")) is None
    path.write_text('{"session_id": "sb-session-v", "conversation_id": "f1", "origin": "{}"}')
    assert asyncio.run(backend.fork_origin(s, "f1")) is None
    assert ForkOrigin.parse('{"conversation_id": 3, "snapshot_id": null}') is None
    assert ForkOrigin.parse(A.to_json()) == A
