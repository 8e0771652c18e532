"""The Redis run store with two replicas in one process, on a real Redis-protocol server:
followers, approvals and cancels across replicas, lease fencing, takeover, hand-over."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
import uuid

import pytest
from redis.asyncio import Redis

from sandbox_workspace.api.chat.progress import Progress
from sandbox_workspace.api.chat.runs import Run, RunRegistry
from sandbox_workspace.api.chat.runstore.memory import MemoryRunStore
from sandbox_workspace.api.chat.runstore.redis_log import read_log
from sandbox_workspace.api.chat.runstore.redis_store import RedisRunStore
from sandbox_workspace.api.sse import encode_event
from sandbox_workspace.contract.errors import Conflict, NotFoundError
from sandbox_workspace.operator.naming import session_id_for


@pytest.fixture
async def replica(redis_url):
    """A factory of replicas (registries on Redis stores) sharing one key prefix."""
    prefix = f"t{uuid.uuid4().hex[:8]}:"
    made: list[RunRegistry] = []

    async def make(resume=None, lease: float = 1.0) -> RunRegistry:
        store = RedisRunStore(
            Redis.from_url(redis_url),
            prefix=prefix,
            lease_seconds=lease,
            retention_seconds=60,
            handover_seconds=5,
        )
        registry = RunRegistry(60, store)
        await store.start(resume or (lambda run, spec, checkpoint: None))
        made.append(registry)
        return registry

    yield make
    for registry in made:
        with contextlib.suppress(Exception):
            await registry.aclose()


async def eventually(probe, timeout: float = 10.0):
    """Poll ``probe`` (sync or async) until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(NotFoundError):
            value = probe()
            if asyncio.iscoroutine(value):
                value = await value
            if value:
                return value
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def stored(run: Run):
    return lambda: run.durable == len(run.frames)


def parse(frames: list[bytes]) -> list[tuple[int, str, dict]]:
    events = []
    for frame in frames:
        fields = dict(line.split(": ", 1) for line in frame.decode().strip().split("\n"))
        events.append((int(fields["id"]), fields["event"], json.loads(fields["data"])))
    return events


async def collect(run, after: int = 0) -> list[tuple[int, str, dict]]:
    frames: list[bytes] = []
    async with asyncio.timeout(15):
        async for batch in run.follow(after, idle=0.2):
            frames.extend(batch)
    return parse(frames)


async def kill(registry: RunRegistry) -> None:
    """What SIGKILL leaves behind: no more writes, no renewals, no release; its
    connections close (as the kernel closes a dead process's sockets)."""
    store = registry.store
    store._closing = True
    tasks = [*store._tasks, *(r.task for r in registry.all() if r.task)]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await store.redis.aclose()
    registry.store = MemoryRunStore()  # the fixture's aclose: nothing left to do


async def test_every_replica_follows_the_same_log_exactly_once(replica):
    a, b = await replica(), await replica()
    run = a.add(Run(user_id="u", session_id="s", conversation_id="c"), {})
    for i in range(3):
        run.emit("text", {"delta": str(i)})
    remote = await eventually(lambda: b.find(run.id, "s"))
    with pytest.raises(NotFoundError):
        await b.find(run.id, "someone-else")
    followers = [asyncio.create_task(collect(r)) for r in (run, remote)]
    replay = asyncio.create_task(collect(remote, after=2))
    for i in range(3, 50):
        run.emit("text", {"delta": str(i)})
    run.emit("done", {"run_id": run.id})
    run.finish()
    local, far = await asyncio.gather(*followers)
    assert [e[0] for e in local] == list(range(1, 52)) and local == far
    assert [e[0] for e in await replay] == list(range(3, 52))


async def test_an_approval_answered_on_another_replica_reaches_the_owner(replica):
    a, b = await replica(), await replica()
    run = a.add(Run(user_id="u", session_id="s", conversation_id="c"), {})
    run.open_approval("call_1", "bash")
    run.emit("tool_approval", {"tool_call_id": "call_1"})
    await eventually(stored(run))
    waiting = asyncio.create_task(run.decision("call_1", 10))
    remote = await b.find(run.id, "s")
    assert remote.awaiting_approval
    await b.decide(remote, "call_1", True, "fine")
    decision = await waiting
    assert decision.approved and decision.reason == "fine"
    with pytest.raises(Conflict):  # wherever the second answer is sent
        await a.decide(run, "call_1", False)
    with pytest.raises(NotFoundError):
        await b.decide(remote, "call_2", True)


async def test_a_cancel_sent_to_another_replica_stops_the_owners_loop(replica):
    a, b = await replica(), await replica()
    run = a.add(Run(user_id="u", session_id="s", conversation_id="c"), {})
    run.task = asyncio.create_task(asyncio.sleep(60))
    run.emit("run_started", {})
    await eventually(stored(run))
    assert await b.cancel(await b.find(run.id, "s")) is True
    await eventually(lambda: run.task.cancelled())


async def test_a_replica_that_lost_its_lease_can_write_nothing_more(replica, redis_url):
    a = await replica()
    run = a.add(Run(user_id="u", session_id="s", conversation_id="c"), {})
    run.emit("run_started", {})
    await eventually(stored(run))
    follower = asyncio.create_task(collect(run))
    keys = a.store.keys
    await a.store.redis.set(keys.lease(run.id), "another-replica")
    run.emit("text", {"delta": "late"})
    await eventually(lambda: run.relay is not None)  # stopped here; followers use the store
    view = await a.find(run.id, "s")  # answers come from the store now, not the old object
    assert view is not run and view.id == run.id
    assert await a.conversation_runs("s", "c") == [view]
    assert await a.store.redis.xlen(keys.log(run.id)) == 1
    # The replica that holds the lease now ends the stream; the follower sees it, once.
    done = encode_event(2, "done", {})
    await a.store.redis.xadd(keys.log(run.id), {"k": "done", "f": done}, id="2-0")
    assert await follower == [(1, "run_started", {}), (2, "done", {})]


async def test_a_dead_owners_run_with_a_tool_call_in_flight_is_ended_cleanly(replica):
    a = await replica(lease=0.5)
    run = a.add(Run(user_id="u", session_id="s", conversation_id="c"), {})
    run.emit("run_started", {})
    run.checkpoint(Progress(in_flight="call_1"))
    run.emit("tool_start", {"tool_call_id": "call_1"})
    await eventually(stored(run))
    await kill(a)
    resumed = []
    b = await replica(resume=lambda *args: resumed.append(args), lease=0.5)
    events = await collect(await b.find(run.id, "s"))
    assert [(i, k) for i, k, _ in events] == [
        (1, "run_started"),
        (2, "tool_start"),
        (3, "error"),
        (4, "done"),
    ]
    assert events[2][2]["code"] == "run_interrupted" and not resumed


async def test_a_dead_owners_run_is_resumed_from_its_last_step_by_another(replica):
    a = await replica(lease=0.5)
    run = a.add(Run(user_id="u", session_id="s", conversation_id="c"), {"query": "q"})
    run.emit("run_started", {})
    run.checkpoint(Progress(iteration=2, messages=[{"role": "user", "content": "q"}]))
    run.emit("status", {"stage": "thinking", "iteration": 2})
    await eventually(stored(run))
    await kill(a)
    seen = []

    def resume(taken: Run, spec: dict, checkpoint: dict | None):
        seen.append((spec, checkpoint))
        taken.emit("done", {"run_id": taken.id})
        taken.finish()

    b = await replica(resume=resume, lease=0.5)
    events = await collect(await b.find(run.id, "s"))
    assert [k for _, k, _ in events] == ["run_started", "status", "status", "done"]
    assert events[2][2]["stage"] == "resumed" and [e[0] for e in events] == [1, 2, 3, 4]
    spec, checkpoint = seen[0]
    assert spec == {"query": "q"} and checkpoint["iteration"] == 2
    assert checkpoint["messages"] == [{"role": "user", "content": "q"}]


async def test_an_answer_given_while_nobody_owned_the_run_is_applied_by_the_taker(replica):
    a = await replica(lease=0.5)
    run = a.add(Run(user_id="u", session_id="s", conversation_id="c"), {})
    run.open_approval("call_1", "bash")
    run.checkpoint(Progress(approval="call_1", approval_deadline=time.time() + 30))
    run.emit("tool_approval", {"tool_call_id": "call_1"})
    await eventually(stored(run))
    await kill(a)
    decided = []

    async def reopen(taken: Run):
        taken.open_approval("call_1", "bash")
        decided.append(await taken.decision("call_1", 10))
        taken.emit("done", {})
        taken.finish()

    c = await replica(lease=30)  # scans every 15 s: answers, but takes nothing over
    remote = await c.find(run.id, "s")
    await c.decide(remote, "call_1", True, "yes")  # recorded; its owner is dead
    await replica(resume=lambda taken, *_: asyncio.create_task(reopen(taken)), lease=0.5)
    await collect(remote)
    assert decided[0].approved and decided[0].reason == "yes"


async def test_a_graceful_shutdown_hands_runs_over_at_once(replica):
    a = await replica(lease=30)  # an expiring lease would take 30 s
    run = a.add(Run(user_id="u", session_id="s", conversation_id="c"), {})
    run.task = asyncio.create_task(asyncio.sleep(60))
    run.emit("run_started", {})
    taken = asyncio.Event()

    def resume(moved: Run, spec, checkpoint):
        moved.emit("done", {})
        moved.finish()
        taken.set()

    b = await replica(resume=resume, lease=30)
    await eventually(stored(run))
    started = time.monotonic()
    await a.aclose()
    async with asyncio.timeout(5):
        await taken.wait()
    assert time.monotonic() - started < 5
    events = await collect(await b.find(run.id, "s"))
    assert [k for _, k, _ in events] == ["run_started", "status", "done"]


async def test_a_conversations_runs_are_listed_on_every_replica(replica):
    a, b = await replica(), await replica()
    first = a.add(Run(user_id="u", session_id="s", conversation_id="c"), {})
    second = b.add(Run(user_id="u", session_id="s", conversation_id="c"), {})
    other = b.add(Run(user_id="u", session_id="s", conversation_id="elsewhere"), {})
    for run in (first, second, other):
        run.emit("run_started", {})
    await eventually(lambda: all(stored(r)() for r in (first, second, other)))
    listed = await a.conversation_runs("s", "c")
    assert [r.id for r in listed] == [first.id, second.id]
    assert listed[0] is first and not listed[1].finished  # local object, then a view
    assert [r.id for r in await b.conversation_runs("s", "elsewhere")] == [other.id]


async def test_a_conversations_run_index_is_its_own_when_ids_hold_colons(replica):
    # ("a", "b:c") and ("a:b", "c") once shared the key conv:a:b:c: deleting user a's
    # conversation "b:c" cancelled user a:b's runs in "c" (security review L2).
    a, b = await replica(), await replica()
    mine = a.add(Run(user_id="a", session_id="sb-session-a", conversation_id="b:c"), {})
    theirs = a.add(Run(user_id="a:b", session_id="sb-session-a:b", conversation_id="c"), {})
    for run in (mine, theirs):
        run.emit("run_started", {})
    await eventually(lambda: stored(mine)() and stored(theirs)())
    assert [r.id for r in await b.conversation_runs("sb-session-a", "b:c")] == [mine.id]
    assert [r.id for r in await b.conversation_runs("sb-session-a:b", "c")] == [theirs.id]


async def test_a_run_held_elsewhere_is_its_tenants_alone(replica):
    a, b = await replica(), await replica()
    acme = session_id_for("42", "acme")
    run = a.add(Run(user_id="42", session_id=acme, conversation_id="c"), {})
    run.emit("run_started", {})
    await eventually(stored(run))
    assert (await eventually(lambda: b.find(run.id, acme))).id == run.id
    for other in (session_id_for("42", "globex"), session_id_for("42")):
        with pytest.raises(NotFoundError):
            await b.find(run.id, other)


async def test_bursts_of_many_runs_are_stored_complete_and_in_order(replica):
    a = await replica()
    runs = [a.add(Run(user_id="u", session_id="s", conversation_id="c"), {}) for _ in range(100)]
    for i in range(30):  # the writer flushes several batches at once, over disjoint runs
        for run in runs:
            run.emit("text", {"delta": str(i)})
        await asyncio.sleep(0)
    await a.store.writer.drained()
    for run in runs:
        frames = await read_log(a.store.redis, a.store.keys, run.id)
        assert frames == run.frames and run.durable == 30


async def test_an_unreachable_server_stops_the_start_with_what_to_change():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = RedisRunStore(Redis.from_url(f"redis://127.0.0.1:{port}/0"))
    with pytest.raises(RuntimeError, match="SANDBOX_WORKSPACE_CHAT_REDIS_URL"):
        await store.start(lambda *args: None)
    await store.redis.aclose()


async def test_deleting_a_conversation_stops_its_runs_on_every_replica(replica):
    a, b = await replica(), await replica()
    there = b.add(Run(user_id="u", session_id="s", conversation_id="c"), {})
    there.task = asyncio.create_task(asyncio.sleep(60))
    there.emit("run_started", {})
    await eventually(stored(there))
    assert a.cancel_conversation("s", "c") == 0  # none of them runs here
    await eventually(lambda: there.task.cancelled())
    assert there.cancelled_because[0] == "conversation_deleted"


async def test_a_cancel_recorded_while_nobody_owned_the_run_ends_it_on_takeover(replica):
    a = await replica(lease=0.5)
    run = a.add(Run(user_id="u", session_id="s", conversation_id="c"), {})
    run.emit("run_started", {})
    await eventually(stored(run))
    await kill(a)
    c = await replica(lease=30)  # records the cancel, takes nothing over
    view = await c.find(run.id, "s")
    assert await c.cancel(view, "conversation_deleted", "gone") is True
    resumed = []
    await replica(resume=lambda *args: resumed.append(args), lease=0.5)
    events = await collect(view)
    assert [k for _, k, _ in events] == ["run_started", "error", "done"] and not resumed
    assert events[1][2] == {"code": "conversation_deleted", "message": "gone"}
