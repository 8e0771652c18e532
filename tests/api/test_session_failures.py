"""Ensure-session's failure paths (seed 000 §3.2, §8.2), each asserted: a session still
starting after the ready timeout is 503 ``session_not_ready`` (and a retry then works),
one that fails to start is 503 ``session_failed`` saying why; the create that loses a
race of first uses (409) waits for the winner's session."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from sandbox_workspace.api.backends.base import Session, SessionExists, SessionSpec, SessionStatus
from sandbox_workspace.api.backends.local import LocalBackend
from sandbox_workspace.api.identity import Caller
from sandbox_workspace.api.sessions import SessionService
from sandbox_workspace.contract.errors import Unavailable
from sandbox_workspace.operator.models import FileUploadConfig
from sandbox_workspace.runtime.scratch import remove_recorded

pytestmark = pytest.mark.local_backend


def _upload(client: httpx.Client, user: str) -> httpx.Response:
    return client.post(
        f"/api/v1/sessions/sb-session-{user}/files/upload",
        files={"file": ("a.csv", b"1")},
        data={"conversation_id": "c"},
    )


def test_still_starting_after_the_ready_timeout_is_session_not_ready(start_server, wait_status):
    # A runtime takes far longer than 10 ms to start (a Python process): never ready in time.
    server = start_server(
        "dev",
        "--data-dir",
        "data",
        SANDBOX_WORKSPACE_SANDBOX_MOUNT="none",
        SANDBOX_WORKSPACE_SESSION_READY_TIMEOUT_SECONDS="0.01",
    )
    user = "slow-start"
    with httpx.Client(base_url=server.url, headers={"X-User-Id": user}, timeout=30) as client:
        r = _upload(client, user)
        assert r.status_code == 503, r.text
        error = r.json()["error"]
        assert error["code"] == "session_not_ready" and "retry shortly" in error["message"]
        # Nothing lost: the session goes on starting, and the retry the message asks for works.
        wait_status(client, f"/api/v1/sessions/sb-session-{user}", "running")
        assert _upload(client, user).status_code == 201
    server.stop()  # with its runtime, now rather than at the end of the test session


def test_runtime_that_cannot_start_is_session_failed(
    api, user, session_url, runtime_pids, wait_status
):
    assert _upload(api, user).status_code == 201
    workspace = Path(api.get(session_url).json()["workspace_path"])
    [pid] = runtime_pids(workspace.parent)
    os.kill(pid, signal.SIGKILL)
    wait_status(api, session_url, "error")
    # The next runtime finds no directory to serve: it exits during start-up. The killed
    # one's scratch root goes first (its record is in the workspace, removed next).
    remove_recorded(workspace)
    shutil.rmtree(workspace)
    workspace.write_text("not a directory")
    r = _upload(api, user)
    assert r.status_code == 503, r.text
    error = r.json()["error"]
    assert error["code"] == "session_failed" and "failed to start" in error["message"]
    assert "runtime exited during start-up" in error["message"]


class _MeetAfterLookUp(LocalBackend):
    """The real local backend, except that the first look-ups of ``callers`` requests
    wait for each other: all of them see no session, then all create (the race)."""

    def __init__(self, *args, callers: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.line = asyncio.Barrier(callers)
        self.first_looks = callers
        self.created: list[str] = []

    async def get_session(self, session_id: str):
        session = await super().get_session(session_id)
        if self.first_looks > 0:
            self.first_looks -= 1
            await self.line.wait()
        return session

    async def create_session(self, spec):
        try:
            session = await super().create_session(spec)
        except SessionExists:
            self.created.append("409")
            raise
        self.created.append("201")
        return session


async def test_two_first_uses_at_once_both_get_the_one_session(tmp_path):
    """seed 000 §3.2/§8.1: the create that loses the race answers 409, and its caller
    waits for the winner's session instead of failing."""
    async with httpx.AsyncClient() as http:
        backend = _MeetAfterLookUp(tmp_path, http, callers=2)
        await backend.start()
        service = SessionService(backend, default_upload=FileUploadConfig(), ready_timeout=30)
        caller = Caller("racer", "dev")
        try:
            first, second = await asyncio.gather(
                *(service.ensure_running(caller, caller.session_id) for _ in range(2))
            )
        finally:
            await backend.aclose()
    assert sorted(backend.created) == ["201", "409"]
    assert first.status == second.status == SessionStatus.RUNNING
    assert first.endpoint == second.endpoint


class _NeverRunning(LocalBackend):
    """A session that stays pending with the backend's word on why (as the kubernetes
    backend reports a pod its kubelet has not mounted the volume of)."""

    WHY = "Unable to attach or mount volumes: PVC is not bound " + "x" * 400

    async def get_session(self, session_id: str):
        return Session(
            spec=SessionSpec(session_id=session_id, user_id="slow"),
            status=SessionStatus.PENDING,
            created_at=datetime.now(UTC),
            workspace_path="/workspace",
            message=self.WHY,
        )

    async def wait_changed(self, session_id: str, timeout: float):
        await asyncio.sleep(min(timeout, 0.01))
        return None


async def test_session_not_ready_says_what_the_session_waits_for(tmp_path):
    """The 503 of a session still starting carries the backend's message (bounded), so a
    caller that gives up — a node-tier fixture in CI — says why without another look."""
    async with httpx.AsyncClient() as http:
        backend = _NeverRunning(tmp_path, http)
        service = SessionService(backend, default_upload=FileUploadConfig(), ready_timeout=0.05)
        with pytest.raises(Unavailable) as raised:
            await service.wait_running("sb-session-slow")
    assert raised.value.code == "session_not_ready"
    message = str(raised.value)
    assert "(status pending: Unable to attach or mount volumes: PVC is not bound" in message
    assert message.endswith("); retry shortly") and len(message) < 450, message
