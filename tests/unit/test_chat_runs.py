"""The run log: SSE frames kept once, followed in batches, forgotten after retention."""

from __future__ import annotations

import asyncio
import gc
import json

import pytest

from sandbox_workspace.api.chat.runs import Run, RunRegistry
from sandbox_workspace.contract.errors import NotFoundError
from sandbox_workspace.operator.naming import session_id_for


def _run(user: str = "u", tenant: str = "default") -> Run:
    return Run(user_id=user, session_id=session_id_for(user, tenant), conversation_id="c")


def test_each_event_is_kept_as_one_sse_frame_with_its_id():
    run = _run()
    assert run.emit("text", {"delta": "a\nb"}) == 1
    assert run.emit("done") == 2
    first, second = run.frames
    assert first == b'id: 1\nevent: text\ndata: {"delta":"a\\nb"}\n\n'
    assert json.loads(second.split(b"data: ")[1]) == {}


def test_the_log_is_invisible_to_the_garbage_collector():
    # Bytes are never tracked: full collections must not walk every event of every run.
    run = _run()
    for i in range(100):
        run.emit("text", {"delta": str(i)})
    assert not any(gc.is_tracked(frame) for frame in run.frames)


async def test_a_follower_gets_every_event_after_its_position_exactly_once():
    run = _run()
    run.emit("a")
    run.emit("b")
    seen: list[bytes] = []

    async def follow():
        async for batch in run.follow(after=1):
            seen.extend(batch)

    follower = asyncio.create_task(follow())
    await asyncio.sleep(0)  # the follower catches up, then waits
    run.emit("c")
    run.emit("d")  # two emits before it wakes: one batch
    run.finish()
    await asyncio.wait_for(follower, 5)
    assert [f.split(b"\n")[1] for f in seen] == [b"event: b", b"event: c", b"event: d"]


async def test_a_quiet_run_hands_its_follower_empty_batches_for_keepalives():
    run = _run()
    batches = []

    async def follow():
        async for batch in run.follow(idle=0.01):
            batches.append(batch)
            if len(batches) == 2:
                return

    await asyncio.wait_for(follow(), 5)
    assert batches == [[], []]


async def test_a_busy_follower_gets_no_keepalive_until_the_run_goes_quiet():
    # The idle timer is re-armed lazily (not per wait): events closer together than
    # ``idle`` must never count as silence, and silence after them must.
    run = _run()
    batches: list[list[bytes]] = []

    async def follow():
        async for batch in run.follow(idle=0.5):
            batches.append(batch)
            if not batch:
                return

    follower = asyncio.create_task(follow())
    for _ in range(30):  # 1.5 s of events, 0.05 s apart: three idle periods and more
        run.emit("text")
        await asyncio.sleep(0.05)
    assert all(batches), "no keep-alive while events keep coming"
    await asyncio.wait_for(follower, 5)  # then quiet: one comes
    assert sum(len(b) for b in batches) == 30 and batches[-1] == []


async def test_a_follower_that_goes_away_leaves_the_run_untouched():
    run = _run()
    follower = asyncio.create_task(anext(run.follow()))
    await asyncio.sleep(0)
    follower.cancel()
    with pytest.raises(asyncio.CancelledError):
        await follower
    assert run.emit("text") == 1  # waking a cancelled follower is harmless


async def test_a_finished_run_is_gone_once_its_retention_has_passed():
    registry = RunRegistry(retention_seconds=0.05)
    run = registry.add(_run("ann"))
    assert registry.get(run.id, session_id_for("ann")) is run
    with pytest.raises(NotFoundError):
        registry.get(run.id, session_id_for("bob"))  # another user's run: none for them
    run.finish()
    await asyncio.sleep(0.1)
    # Pruning walks all runs at most once a second, but a lookup is exact.
    with pytest.raises(NotFoundError):
        registry.get(run.id, session_id_for("ann"))


async def test_cancel_conversation_ends_only_that_conversations_open_runs():
    from fake_conversation import FakeConversation

    from sandbox_workspace.api.chat.loop import RunSpec, run_agent

    registry = RunRegistry(retention_seconds=60)
    started = asyncio.Event()

    async def ensure_session():
        started.set()
        await asyncio.sleep(3600)  # a run that would go on for an hour

    def spec() -> RunSpec:
        return RunSpec(
            query="q",
            history=[],
            selected_files=[],
            policies={},
            max_iterations=1,
            deadline_seconds=3600,
            approval_timeout=1,
            tool_timeout=1,
        )

    doomed, other_conv, other_session = (
        registry.add(Run(user_id="u", session_id=s, conversation_id=c))
        for s, c in (("s", "c"), ("s", "keep"), ("s2", "c"))
    )
    for run in (doomed, other_conv, other_session):
        conversation = FakeConversation(ensure_session=ensure_session)
        run.task = asyncio.create_task(run_agent(run, spec(), conversation, None, None))  # type: ignore[arg-type]
    await started.wait()
    assert registry.cancel_conversation("s", "c") == 1
    await asyncio.wait_for(doomed.task, 5)
    events = [f.split(b"\n")[1] for f in doomed.frames]
    assert events[-2:] == [b"event: error", b"event: done"]
    assert b'"code":"conversation_deleted"' in doomed.frames[-2]
    assert not other_conv.finished and not other_session.finished
    assert registry.cancel_conversation("s", "c") == 0  # finished runs are not counted
    for run in (other_conv, other_session):
        run.cancel()
    await asyncio.gather(other_conv.task, other_session.task)


async def test_a_run_is_its_tenants_a_user_id_repeated_in_another_tenant_finds_nothing():
    registry = RunRegistry(retention_seconds=60)
    run = registry.add(_run("42", "acme"))
    assert await registry.find(run.id, session_id_for("42", "acme")) is run
    for other in (session_id_for("42", "globex"), session_id_for("42")):
        with pytest.raises(NotFoundError):
            await registry.find(run.id, other)
