"""The Redis store's writer on a real server when things go wrong under it: its connection
cut mid-flush, the server's scripts flushed, writes refused for a while. Every event must
end up stored exactly once, in order, and followers must never see an event before it is
stored (what a client saw survives the owner)."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

import pytest
from redis.asyncio import Redis

from sandbox_workspace.api.chat.runs import Run, RunRegistry
from sandbox_workspace.api.chat.runstore.redis_log import read_log
from sandbox_workspace.api.chat.runstore.redis_store import RedisRunStore


@pytest.fixture
async def owner(redis_url):
    store = RedisRunStore(Redis.from_url(redis_url), prefix=f"w{uuid.uuid4().hex[:8]}:")
    registry = RunRegistry(60, store)
    await store.start(lambda *args: None)
    admin = Redis.from_url(redis_url)
    yield registry, admin
    with contextlib.suppress(Exception):
        await registry.aclose()
    await admin.aclose()


def runs_of(registry: RunRegistry, count: int) -> list[Run]:
    return [
        registry.add(Run(user_id="u", session_id="s", conversation_id="c"), {})
        for _ in range(count)
    ]


def watch_durable(runs: list[Run], admin: Redis, keys) -> list:
    """Each time a run says more is stored, check the store really has it."""
    checks: list = []

    async def check(run: Run, upto: int) -> None:
        stored = await read_log(admin, keys, run.id)
        checks.append(len(stored) >= upto and stored[:upto] == run.frames[:upto])

    def watching(run: Run):
        notify = run._notify

        def notified() -> None:
            if run.durable:
                asyncio.get_running_loop().create_task(check(run, run.durable))
            notify()

        return notified

    for run in runs:
        run._notify = watching(run)
    return checks


async def cut_writer(admin: Redis) -> None:
    """Close the writer's connection from the server's side (the last command it sent
    was the flush script, or the script's load)."""
    for client in await admin.client_list():
        if client["cmd"] in ("evalsha", "script|load"):
            await admin.client_kill_filter(_id=client["id"])


async def assert_all_stored_once(registry: RunRegistry, runs: list[Run], events: int) -> None:
    store = registry.store
    async with asyncio.timeout(20):
        await store.writer.drained()
    for run in runs:
        frames = await read_log(store.redis, store.keys, run.id)
        assert frames == run.frames and len(frames) == events and run.durable == events


async def test_a_connection_cut_mid_flush_loses_and_duplicates_nothing(owner):
    registry, admin = owner
    runs = runs_of(registry, 40)
    checks = watch_durable(runs, admin, registry.store.keys)
    for i in range(20):
        for run in runs:
            run.emit("text", {"delta": str(i)})
        await asyncio.sleep(0)  # the flush goes out; the cut may land before its reply
        if i % 5 == 2:
            await cut_writer(admin)
    await assert_all_stored_once(registry, runs, 20)
    assert registry.store.writer.reconnects >= 1
    assert checks and all(checks)


async def test_scripts_lost_by_the_server_are_loaded_again(owner):
    registry, admin = owner
    runs = runs_of(registry, 5)
    for run in runs:
        run.emit("text", {"delta": "before"})
    await registry.store.writer.drained()
    await admin.script_flush()  # as a restarted server would have it: NOSCRIPT
    for run in runs:
        run.emit("text", {"delta": "after"})
    await assert_all_stored_once(registry, runs, 2)


async def test_writes_refused_for_a_while_are_sent_again_and_shown_only_once_stored(owner):
    registry, admin = owner
    runs = runs_of(registry, 5)
    for run in runs:
        run.emit("text", {"delta": "first"})
    await registry.store.writer.drained()
    await admin.config_set("maxmemory-policy", "noeviction")
    await admin.config_set("maxmemory", "1")  # every write refused: OOM
    try:
        for run in runs:
            run.emit("text", {"delta": "refused at first"})
        writer, deadline = registry.store.writer, time.monotonic() + 10
        while writer.refused_writes < 2:  # several attempts, each refused
            assert time.monotonic() < deadline, "the writer never retried the refused write"
            await asyncio.sleep(0.01)
        assert all(run.durable == 1 for run in runs)  # nobody saw the refused event
    finally:
        await admin.config_set("maxmemory", "0")
    await assert_all_stored_once(registry, runs, 2)


async def test_the_writes_round_trips_and_events_are_in_the_metrics(owner):
    registry, _ = owner
    runs = runs_of(registry, 3)
    for run in runs:
        run.emit("text", {"delta": "x"})
        run.emit("text", {"delta": "y"})
    await assert_all_stored_once(registry, runs, 2)
    families = {f.name: f for f in registry.store.metric_families()}
    trips = {s.name: s.value for s in families["sandbox_chat_run_store_flush_seconds"].samples}
    assert trips["sandbox_chat_run_store_flush_seconds_count"] >= 1
    assert trips["sandbox_chat_run_store_flush_seconds_sum"] > 0
    stored = families["sandbox_chat_run_store_events_stored"].samples[0].value
    assert stored == 6


async def test_a_run_whose_queue_reaches_the_cap_is_moved_off_and_its_queue_dropped(
    owner, monkeypatch
):
    """Redis refuses every write: a run that keeps emitting is stopped here once it has
    ``MAX_QUEUED_OPS`` items queued (its memory freed, its lease left for whoever holds it
    next), and a quiet run beside it keeps its queue and is stored once Redis answers."""
    from sandbox_workspace.api.chat.runstore import writer as writer_module

    monkeypatch.setattr(writer_module, "MAX_QUEUED_OPS", 200)  # an event is two items
    registry, admin = owner
    writer = registry.store.writer
    loud, quiet = runs_of(registry, 2)
    for run in (loud, quiet):
        run.emit("text", {"delta": "first"})
    await writer.drained()
    await admin.config_set("maxmemory-policy", "noeviction")
    await admin.config_set("maxmemory", "1")  # every write refused: OOM
    try:
        quiet.emit("text", {"delta": "queued while refused"})
        for i in range(400):  # twice the cap's events: past it whatever a flush holds
            loud.emit("text", {"delta": str(i)})
            await asyncio.sleep(0)
            if writer.overflowed:
                break
        assert writer.overflowed == 1, "the run past the cap was not stopped"
        assert loud.relay is not None, "moved off this replica (carried on from the store)"
        assert loud.id not in writer._ops, "its queue was dropped"
        assert quiet.relay is None and not quiet.finished
        queued = sum(len(ops) for ops in writer._ops.values())
        assert queued <= 2 * writer_module.MAX_QUEUED_OPS
    finally:
        await admin.config_set("maxmemory", "0")
    async with asyncio.timeout(20):
        await writer.drained()
    stored = await read_log(registry.store.redis, registry.store.keys, quiet.id)
    assert stored == quiet.frames and len(stored) == 2
