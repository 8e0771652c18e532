"""E2B's calls in the fewest round trips and hops (issue 39 item 6): create makes a new
sandbox's conversation in one round trip (api/e2b/control.py ``_made``: the backend's
record — kubernetes: the ConversationWorkspace — and the runtime's directories side by
side; a refused record takes the empty directories back), and a command's end and its
stream's close are one write after the check (api/e2b/processes.py ``envd_stream``).
Fake backends and the runtime on MockTransport."""

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


def test_a_commands_end_and_the_streams_close_go_together_after_the_check() -> None:
    """``processes.envd_stream``: the after-write check runs when the runtime says the
    process ended, then the ``end`` event and the close are one write (the SDK waits for
    the close: a write of the end alone cost a hop first); the runtime's answer is
    released at once; a refusal by the check still follows the end event."""
    from sandbox_workspace.api.e2b import connect
    from sandbox_workspace.api.e2b.processes import envd_stream
    from sandbox_workspace.contract.errors import ConversationDeleting

    def go(refuse: bool) -> tuple[list[bytes], list[str]]:
        seen: list[str] = []

        class Checked:
            async def conversation_written(self, session, cid) -> None:
                seen.append("checked")
                if refuse:
                    raise ConversationDeleting(cid)

        async def runtime():
            try:
                yield {"type": "start", "pid": 7}
                yield {"type": "stdout", "data": "aGkK"}
                yield {"type": "end", "exit_code": 0, "limit": None}
                yield {"type": "stdout", "data": "never"}  # nothing follows the end
            finally:
                seen.append("released")

        sandbox = SimpleNamespace(
            services=SimpleNamespace(backend=Checked()), session=session(), cid=CID
        )

        async def collect() -> list[bytes]:
            out = []
            async for chunk in envd_stream(sandbox, runtime()):
                out.append(chunk)
                seen.append(f"chunk {len(out)}")
            return out

        return asyncio.run(collect()), seen

    chunks, seen = go(refuse=False)
    assert seen == ["chunk 1", "chunk 2", "checked", "released", "chunk 3"]
    messages = connect.read_envelopes(chunks[-1])
    assert messages[0] == (
        0,
        {"event": {"end": {"exitCode": 0, "exited": True, "status": "exit status 0"}}},
    )
    assert messages[1] == (connect.END_STREAM, {})
    assert len(messages) == 2 and len(chunks) == 3
    chunks, seen = go(refuse=True)
    flags, last = connect.read_envelopes(chunks[-1])[-1]
    assert flags == connect.END_STREAM and last["error"]["code"] == "already_exists"  # 409
    assert "end" in connect.read_envelopes(chunks[-1])[0][1]["event"]


def _listings(outputs_status: int) -> tuple[object, list[str]]:
    """``store_cache.listings`` against a runtime that answers the uploads' listing only
    once the outputs' listing has arrived too: both in flight at once, or a timeout."""
    from sandbox_workspace.api.backends.store_cache import listings
    from sandbox_workspace.api.runtime_client import RuntimeClient

    seen: list[str] = []

    async def go() -> object:
        outputs_asked = asyncio.Event()

        async def runtime(request: httpx.Request) -> httpx.Response:
            kind = request.url.path.rsplit("/", 1)[-1]
            seen.append(kind)
            if kind == "outputs":
                outputs_asked.set()
                if outputs_status != 200:
                    return httpx.Response(
                        outputs_status, json={"error": {"code": "x", "message": "m"}}
                    )
                return httpx.Response(200, json={"conversation_id": CID, "path": "/o", "files": []})
            async with asyncio.timeout(5):  # a second round trip never comes in time
                await outputs_asked.wait()
            return httpx.Response(200, json={"conversation_id": CID, "path": "/u", "files": []})

        async with httpx.AsyncClient(transport=httpx.MockTransport(runtime)) as http:
            try:
                return await listings(RuntimeClient(http, session().endpoint), CID)
            except Exception as e:  # the test looks at what was raised
                return e

    return asyncio.run(go()), seen


def test_the_write_backs_two_listings_are_one_round_trip() -> None:
    """After every command the write-back looks at the conversation's uploads and its
    outputs: both asked at once (``store_cache.listings``), not one after the other."""
    result, seen = _listings(200)
    assert result == ({}, {})
    assert sorted(seen) == ["outputs", "uploads"]


def test_a_listing_refused_is_still_said_when_the_other_succeeds() -> None:
    from sandbox_workspace.runtime.client import RuntimeRefused

    gone, _ = _listings(404)  # the runtime does not know the conversation: nothing
    assert gone == ({}, {})
    broken, _ = _listings(500)  # any other refusal reaches the caller, not a timeout
    assert isinstance(broken, RuntimeRefused) and broken.status == 500, broken


def test_a_listing_refused_is_said_at_once_while_the_other_hangs() -> None:
    """The uploads' listing is refused at once, the outputs' never answers (a runtime
    stuck on it): the refusal reaches the write-back now and the hanging request is
    cancelled — not held until the runtime read timeout (300 s) as a gather of both did."""
    from sandbox_workspace.api.backends.store_cache import listings
    from sandbox_workspace.api.runtime_client import RuntimeClient
    from sandbox_workspace.runtime.client import RuntimeRefused

    async def go() -> tuple[BaseException, bool]:
        hung = asyncio.Event()
        cancelled = False

        async def runtime(request: httpx.Request) -> httpx.Response:
            nonlocal cancelled
            if request.url.path.endswith("/outputs"):
                try:
                    hung.set()
                    await asyncio.Event().wait()  # never answers
                except asyncio.CancelledError:
                    cancelled = True
                    raise
            await hung.wait()  # refused once the other is in flight
            return httpx.Response(500, json={"error": {"code": "x", "message": "m"}})

        async with httpx.AsyncClient(transport=httpx.MockTransport(runtime)) as http:
            with pytest.raises(RuntimeRefused) as refused:
                async with asyncio.timeout(5):
                    await listings(RuntimeClient(http, session().endpoint), CID)
        return refused.value, cancelled

    refused, cancelled = asyncio.run(go())
    assert isinstance(refused, RuntimeRefused) and refused.status == 500
    assert cancelled  # nothing left running


def test_a_kill_answers_once_the_killed_commands_are_reported_ended() -> None:
    """``processes.kill_all``: a SIGKILL is delivered at once but a process is seen ended
    only once it is reaped; the kill waits for each one's end, so the sandbox attached
    again right after lists none of them (a race the loaded test runs lost)."""
    from sandbox_workspace.api.e2b import processes

    async def go() -> list[str]:
        steps: list[str] = []
        reaped = asyncio.Event()

        class Client:
            async def list_processes(self, cid):
                return [{"pid": 7, "running": True}, {"pid": 8, "running": False}]

            async def process_signal(self, cid, pid, signal):
                steps.append(f"signal {pid} {signal}")

            async def process_events(self, cid, pid):
                yield {"type": "start", "pid": pid}
                await reaped.wait()
                steps.append(f"end {pid}")
                yield {"type": "end", "exit_code": 137}

        sandbox = SimpleNamespace(client=Client(), cid=CID)
        kill = asyncio.create_task(processes.kill_all(sandbox))
        for _ in range(50):  # every step the kill could take without an end: taken
            await asyncio.sleep(0)
        steps.append("killed" if kill.done() else "waiting")
        reaped.set()
        await asyncio.wait_for(kill, 5)
        steps.append("answered")
        return steps

    assert asyncio.run(go()) == ["signal 7 SIGKILL", "waiting", "end 7", "answered"]
