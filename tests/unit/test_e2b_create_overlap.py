"""E2B create makes a new sandbox's conversation in one round trip (api/e2b/control.py
``_made``; issue 39 item 6): the backend's record (kubernetes: the ConversationWorkspace)
and the runtime's directories side by side, and a refused record takes the empty
directories back. A fake backend and the runtime on MockTransport."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from types import SimpleNamespace

import httpx
import pytest

from sandbox_workspace.api.backends.base import (
    RuntimeEndpoint,
    Session,
    SessionSpec,
    SessionStatus,
)
from sandbox_workspace.api.e2b.control import _made
from sandbox_workspace.api.quotas import QuotaExceeded

CID = "e2b-0123456789abcdef01234567"
INFO = {
    "conversation_id": CID,
    "exists": True,
    "path": f"/workspace/{CID}",
    "uploads_path": f"/workspace/{CID}/uploads",
    "outputs_path": f"/workspace/{CID}/outputs",
    "deleted": True,  # the DELETE's answer (ConversationDeleted) from the same handler
}


def session() -> Session:
    return Session(
        spec=SessionSpec(session_id="sb-session-u", user_id="u"),
        status=SessionStatus.RUNNING,
        created_at=datetime.now(UTC),
        workspace_path="/workspace",
        endpoint=RuntimeEndpoint(url="http://runtime", token="t"),
    )


class Backend:
    def __init__(self, refuse: bool) -> None:
        self.refuse = refuse
        self.runtime_seen = asyncio.Event()

    async def conversation_created(self, session: Session, cid: str) -> None:
        # The runtime's call is under way before this answers: one round trip, not two.
        async with asyncio.timeout(5):
            await self.runtime_seen.wait()
        if self.refuse:
            raise QuotaExceeded("conversations of this user", 1, "conversations_per_user")


def run(refuse: bool, calls: list[str]) -> None:
    async def go() -> None:
        backend = Backend(refuse)

        def runtime(request: httpx.Request) -> httpx.Response:
            calls.append(request.method)
            backend.runtime_seen.set()
            return httpx.Response(200, json=INFO)

        async with httpx.AsyncClient(transport=httpx.MockTransport(runtime)) as http:
            await _made(SimpleNamespace(backend=backend, http=http), session(), CID)

    asyncio.run(go())


def test_the_record_and_the_directories_are_made_side_by_side() -> None:
    calls: list[str] = []
    run(False, calls)
    assert calls == ["PUT"]


def test_a_refused_record_takes_the_new_directories_back() -> None:
    calls: list[str] = []
    with pytest.raises(QuotaExceeded):
        run(True, calls)
    assert calls == ["PUT", "DELETE"]
