"""What the Redis store's heartbeat catches when pub/sub dropped a message (a reconnect):
a cancel or a decision recorded in a run's metadata reaches its owner anyway; and the
scan for runs nobody holds finds exactly those."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid

import pytest
from redis.asyncio import Redis

from sandbox_workspace.api.chat.runs import Run, RunRegistry
from sandbox_workspace.api.chat.runstore.redis_store import RedisRunStore


@pytest.fixture
async def owner(redis_url):
    # A long lease: nothing is taken over here; the heartbeat runs every lease / 3.
    store = RedisRunStore(
        Redis.from_url(redis_url), prefix=f"k{uuid.uuid4().hex[:8]}:", lease_seconds=0.6
    )
    registry = RunRegistry(60, store)
    await store.start(lambda *args: None)
    admin = Redis.from_url(redis_url)
    yield registry, admin
    with contextlib.suppress(Exception):
        await registry.aclose()
    await admin.aclose()


async def started(registry: RunRegistry) -> Run:
    run = registry.add(Run(user_id="u", session_id="s", conversation_id="c"), {})
    run.task = asyncio.create_task(asyncio.sleep(60))
    run.emit("run_started", {})
    await registry.store.writer.drained()
    return run


async def until(probe, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_a_cancel_whose_message_was_lost_stops_the_run_at_the_next_heartbeat(owner):
    registry, admin = owner
    others = [await started(registry) for _ in range(3)]
    run = await started(registry)
    reason = {"code": "conversation_deleted", "message": "gone"}
    # Recorded as CANCEL records it, but never published: what a dropped message leaves.
    await admin.hset(registry.store.keys.meta(run.id), "cancel", json.dumps(reason))
    await until(lambda: run.task.cancelled())
    assert run.cancelled_because == ("conversation_deleted", "gone")
    assert not any(o.task.done() for o in others)


async def test_a_decision_whose_message_was_lost_reaches_the_awaited_approval(owner):
    registry, admin = owner
    run = await started(registry)
    run.open_approval("call-1", "execute")
    waiting = asyncio.create_task(run.decision("call-1", timeout=10))
    await registry.store.writer.drained()
    decision = {"approved": True, "reason": "fine"}
    await admin.hset(registry.store.keys.meta(run.id), "a:call-1", json.dumps(decision))
    async with asyncio.timeout(5):
        got = await waiting
    assert got.approved and got.reason == "fine" and not run.task.done()


async def test_the_scan_names_exactly_the_open_runs_nobody_holds(owner):
    registry, admin = owner
    held, orphan, skipped = [await started(registry) for _ in range(3)]
    store = registry.store
    for run in (orphan, skipped):
        await admin.delete(store.keys.lease(run.id))
    assert await store.leases.orphans({held.id, skipped.id}) == [orphan.id]
