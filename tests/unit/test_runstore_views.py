"""What the protocol routes read through a run store (``RunStore.frames``,
``open_approvals``, ``last_event_ids``, ``chat_run``): the same answers for a run held
here and for another replica's view of it; a client-side chat's run scoped by user,
collision-free, and forgotten after its time to live."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from redis.asyncio import Redis

from sandbox_workspace.api.chat.chat_index import ChatRun
from sandbox_workspace.api.chat.runs import Run, RunRegistry
from sandbox_workspace.api.chat.runstore.memory import MemoryRunStore
from sandbox_workspace.api.chat.runstore.redis_store import RedisRunStore


@pytest.fixture
async def stores(redis_url):
    """A factory of Redis stores (replicas) sharing one key prefix, started and closed."""
    prefix = f"v{uuid.uuid4().hex[:8]}:"
    made: list[RedisRunStore] = []

    async def make() -> RedisRunStore:
        store = RedisRunStore(Redis.from_url(redis_url), prefix=prefix, lease_seconds=5)
        await store.start(lambda run, spec, checkpoint: None)
        made.append(store)
        return store

    yield make
    for store in made:
        await store.aclose([])


async def until(probe, timeout: float = 10.0) -> None:
    """Poll ``probe`` (sync or async) until it is truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_another_replicas_view_reads_as_the_run_held_here(stores):
    a, b = RunRegistry(60, await stores()), RunRegistry(60, await stores())
    run = a.add(Run(user_id="u", session_id="s", conversation_id="c"), {})
    run.task = asyncio.create_task(asyncio.sleep(60))  # the loop, as far as cancel sees
    run.emit("run_started", {"run_id": run.id})
    run.open_approval("call_1", "bash")
    run.emit("tool_approval", {"tool_call_id": "call_1", "name": "bash"})
    await until(lambda: run.durable == 2)
    view = await b.find(run.id, "s")
    assert view is not run
    assert await b.store.frames(view) == run.frames == await a.store.frames(run)
    for registry, seen in ((a, run), (b, view)):
        assert await registry.store.open_approvals(seen) == {"call_1"}
        assert await registry.store.last_event_ids([seen]) == [2]
    await b.decide(view, "call_1", True)
    assert await b.store.open_approvals(view) == set()
    await until(lambda: run._pending["call_1"].decided)  # the owner hears it (pub/sub)
    assert await a.store.open_approvals(run) == set()
    # Several runs, held here and seen from there, answered in the order asked.
    other = a.add(Run(user_id="u", session_id="s", conversation_id="c"), {})
    other.emit("run_started", {})
    await until(lambda: other.durable == 1)
    other_view = await b.find(other.id, "s")
    assert await b.store.last_event_ids([view, other_view]) == [2, 1]
    assert await a.store.last_event_ids([other, run]) == [1, 2]
    run.task.cancel()


@pytest.mark.parametrize("kind", ["memory", "redis"])
async def test_a_chats_run_is_the_users_alone_and_collision_free(kind, stores):
    store = MemoryRunStore() if kind == "memory" else await stores()
    entry = ChatRun("run_1", "msg_1")
    await store.set_chat_run("a:b", "c", entry, ttl=60)
    assert await store.chat_run("a:b", "c") == entry
    assert await store.chat_run("a", "b:c") is None  # the same characters, another pair
    assert await store.chat_run("someone-else", "c") is None
    await store.set_chat_run("a:b", "c", ChatRun("run_2", "msg_2"), ttl=60)
    assert await store.chat_run("a:b", "c") == ChatRun("run_2", "msg_2")


async def test_a_chats_run_is_shared_by_replicas_and_expires(stores):
    a, b = await stores(), await stores()
    await a.set_chat_run("u", "chat", ChatRun("run_1", "msg_1"), ttl=0.2)
    assert await b.chat_run("u", "chat") == ChatRun("run_1", "msg_1")

    async def gone() -> bool:
        return await b.chat_run("u", "chat") is None

    await until(gone, timeout=5)
