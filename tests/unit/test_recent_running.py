"""``SessionService.recent_running`` (api/sessions.py), the E2B data plane's reuse of a
caller's Running answer for ``RECENT_SECONDS``: an ``ensure_running`` under way when the
answer is forgotten stores none, and a runtime the data plane cannot reach (a crash, a new
pod at a new address) makes the caller's next call look the session up again — the
SDK retries nothing itself (a 503 is its ``SandboxUnreachableException``), so without it
every call inside the window failed the same way.

With a backend that holds the session in memory and runtimes answered on MockTransport:
the old pod's address refuses connections as a crashed pod's does."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from types import SimpleNamespace

import httpx
import pytest

from sandbox_workspace.api.backends.base import (
    ConversationPhase,
    RuntimeEndpoint,
    Session,
    SessionSpec,
    SessionStatus,
)
from sandbox_workspace.api.e2b.conversation import Sandbox
from sandbox_workspace.api.e2b.ids import SandboxNotFound
from sandbox_workspace.api.e2b.lifetimes import Idempotency, Lifetimes
from sandbox_workspace.api.identity import Caller
from sandbox_workspace.api.sessions import SessionService
from sandbox_workspace.operator.models import FileUploadConfig
from sandbox_workspace.runtime.client import RuntimeUnavailable
from sandbox_workspace.runtime.schemas import ExecuteRequest

CALLER = Caller(user_id="e2b-0123456789abcdef", via="dev")
SANDBOX_ID = "0123456789abcdef0123"


class OnePodBackend:
    """The caller's session, Running at ``url`` (a new pod: a new url); ``reads`` counts
    look-ups; ``hold``, when given, makes look-ups wait until it is set."""

    def __init__(self) -> None:
        self.url = "http://old-pod:8080"
        self.reads = 0
        self.hold: asyncio.Event | None = None
        self.reading = asyncio.Event()  # set at the first look-up
        self.phase = ConversationPhase.READY  # tracked: no listing needed at open

    async def get_session(self, session_id: str) -> Session:
        self.reads += 1
        self.reading.set()
        if self.hold is not None:
            await self.hold.wait()
        return Session(
            spec=SessionSpec(session_id=CALLER.session_id, user_id=CALLER.user_id),
            status=SessionStatus.RUNNING,
            created_at=datetime.now(UTC),
            workspace_path="/w",
            endpoint=RuntimeEndpoint(url=self.url, token="t"),
        )

    async def conversation_phase(self, session: Session, cid: str) -> ConversationPhase:
        return self.phase

    async def conversation_opened(self, session: Session, cid: str) -> None:
        pass

    async def conversation_written(self, session: Session, cid: str) -> None:
        pass


def runtimes(request: httpx.Request) -> httpx.Response:
    """The old pod is gone (connection refused); the new one answers every call."""
    if request.url.host == "old-pod":
        raise httpx.ConnectError("connection refused", request=request)
    if request.url.path.endswith("/execute") and request.url.params.get("stream"):
        return httpx.Response(200, content=b'{"type": "stdout", "text": "x"}\n')
    if request.url.path.endswith("/execute"):
        stat = {"ok": {"name": "user", "rel": "", "dir": True}}
        answer = {
            "conversation_id": "c",
            "language": "bash",
            "stdout": json.dumps(stat) + "\n",
            "stderr": "",
            "exit_code": 0,
            "duration_ms": 1.0,
        }
        return httpx.Response(200, json=answer)
    return httpx.Response(200, json={"conversations": [], "processes": []})


def services(backend: OnePodBackend, http: httpx.AsyncClient) -> SimpleNamespace:
    sessions = SessionService(backend, default_upload=FileUploadConfig(), ready_timeout=5)  # type: ignore[arg-type]
    return SimpleNamespace(
        sessions=sessions, backend=backend, http=http, e2b_state=(Lifetimes(), Idempotency())
    )


@pytest.mark.parametrize("counts_cleared", [False, True], ids=["forget", "forget-then-bound"])
async def test_an_ensure_under_way_at_a_forget_stores_no_answer(
    counts_cleared: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A look-up that began before the forget (say, before the session's deletion) ends
    after it: its Running answer is not reused, the next call reads again — also when
    other callers' forgets meanwhile filled the counts' bound and they were cleared."""
    from sandbox_workspace.api import sessions

    monkeypatch.setattr(sessions, "_RECENT_MAX", 2)
    backend = OnePodBackend()
    service = SessionService(backend, default_upload=FileUploadConfig(), ready_timeout=5)  # type: ignore[arg-type]
    backend.hold = asyncio.Event()
    under_way = asyncio.create_task(service.ensure_running(CALLER, CALLER.session_id))
    await backend.reading.wait()
    service.forget(CALLER)
    if counts_cleared:  # the second of these clears the counts, CALLER's with them
        for user in ("a", "b"):
            service.forget(Caller(user_id=user, via="dev"))
    backend.hold.set()
    await under_way
    assert backend.reads == 1
    await service.recent_running(CALLER)
    assert backend.reads == 2  # looked up again: the answer from before the forget was not kept
    await service.recent_running(CALLER)
    assert backend.reads == 2  # and that fresh answer is reused as ever


async def _stat(sandbox: Sandbox) -> None:
    await sandbox.fs("stat", "")


async def _stream(sandbox: Sandbox) -> None:
    async for _ in sandbox.stream(ExecuteRequest(language="python", code="1")):
        pass


async def _list(sandbox: Sandbox) -> None:
    await sandbox.client.list_processes(sandbox.cid)


@pytest.mark.parametrize("call", [_stat, _stream, _list], ids=["file", "stream", "unary"])
async def test_a_runtime_the_data_plane_cannot_reach_is_looked_up_again(call) -> None:
    backend = OnePodBackend()
    async with httpx.AsyncClient(transport=httpx.MockTransport(runtimes)) as http:
        plane = services(backend, http)
        await Sandbox.open(plane, CALLER, SANDBOX_ID)  # the create's answer: old-pod
        backend.url = "http://new-pod:8080"  # the runtime crashed; its new pod runs
        stale = await Sandbox.open(plane, CALLER, SANDBOX_ID)  # inside RECENT_SECONDS
        assert backend.reads == 1 and stale.session.endpoint.url == "http://old-pod:8080"
        with pytest.raises(RuntimeUnavailable):
            await call(stale)  # the one call that meets the old address: 503
        retry = await Sandbox.open(plane, CALLER, SANDBOX_ID)
        assert retry.session.endpoint.url == "http://new-pod:8080"
        await call(retry)  # the SDK caller's retry works


async def test_a_runtime_unreachable_at_open_is_looked_up_again() -> None:
    # Not tracked (e.g. another replica's watch behind): the open itself asks the runtime.
    backend = OnePodBackend()
    backend.phase = ConversationPhase.ABSENT
    async with httpx.AsyncClient(transport=httpx.MockTransport(runtimes)) as http:
        plane = services(backend, http)
        await plane.sessions.ensure_running(CALLER, CALLER.session_id)  # old-pod
        backend.url = "http://new-pod:8080"
        with pytest.raises(RuntimeUnavailable):
            await Sandbox.open(plane, CALLER, SANDBOX_ID)
        # Looked up again: the new pod is reached, and its listing has no such sandbox.
        with pytest.raises(SandboxNotFound):
            await Sandbox.open(plane, CALLER, SANDBOX_ID)
        assert backend.reads == 2
