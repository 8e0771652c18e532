"""Two API processes sharing a Redis-protocol run store (started by the tests): a run is
followed, approved and cancelled on either; a killed owner's runs are taken over or ended
cleanly; a rolling restart of both loses no run and no event."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
import uuid

import httpx
import pytest
from run_follower import Followed, start_and_follow
from scripted_llm import Reply, text_reply, tool_reply, tool_results

pytestmark = pytest.mark.local_backend


@pytest.fixture
def replicas(start_server, scripted_llm, chat_env_factory, redis_url):
    """Two ``dev`` API processes, each with its own data directory: a run needs only the
    store and its user's session, which whichever replica runs it ensures."""
    env = chat_env_factory(
        scripted_llm,
        SANDBOX_WORKSPACE_CHAT_RUN_STORE="redis",
        SANDBOX_WORKSPACE_CHAT_REDIS_URL=redis_url,
        SANDBOX_WORKSPACE_CHAT_REDIS_PREFIX=f"t{uuid.uuid4().hex[:8]}:",
        SANDBOX_WORKSPACE_CHAT_RUN_LEASE_SECONDS="1.5",
        SANDBOX_WORKSPACE_CHAT_RUN_HANDOVER_SECONDS="10",
        SANDBOX_WORKSPACE_CHAT_KEEPALIVE_SECONDS="0.5",
        SANDBOX_WORKSPACE_CHAT_APPROVAL_TIMEOUT_SECONDS="60",
    )
    servers = [start_server("dev", "--data-dir", "data", **env) for _ in range(2)]
    yield servers
    for server in servers:
        server.stop(signal.SIGTERM)


def on(*servers):
    """The URLs of those of ``servers`` running now (a Service's endpoints)."""
    return lambda: [s.url for s in servers if s.proc is not None and s.proc.poll() is None]


async def until(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def follow(urls, user, body=None, run_id="", tenant=None) -> tuple[Followed, asyncio.Task]:
    watched = Followed()
    task = asyncio.create_task(
        start_and_follow(urls, user, body, run_id=run_id, followed=watched, tenant=tenant)
    )
    return watched, task


def slow_text(pieces: int, pause: float) -> Reply:
    reply = text_reply("x" * pieces, pieces=pieces)
    reply.pause_between = pause
    return reply


def assert_complete(followed: Followed) -> None:
    assert followed.done, followed.kinds()
    assert followed.ids == list(range(1, len(followed.ids) + 1)), followed.ids


def test_follow_approve_and_cancel_on_either_replica(replicas, scripted_llm):
    a, b = replicas
    user = f"u-{uuid.uuid4().hex[:8]}"
    scripted_llm.responder = lambda body: (
        text_reply("ran it")
        if tool_results(body)
        else tool_reply("bash", {"command": "echo approved-on-b"})
    )
    body = {"query": "go", "conversation_id": "c", "tool_policies": {"bash": "require_approval"}}

    async def scenario():
        async with httpx.AsyncClient(headers={"X-User-Id": user}, timeout=60) as client:
            # Started on A, followed on B, approved on B (a second answer on A: 409).
            on_a, a_done = follow(on(a), user, body)
            await until(lambda: on_a.run_id)
            on_b, b_done = follow(on(b), user, run_id=on_a.run_id)
            await until(lambda: "tool_approval" in on_b.kinds())
            call = on_b.events[-1][2]["tool_call_id"]
            approvals = f"/api/v1/runs/{on_a.run_id}/approvals"
            r = await client.post(b.url + approvals, json={"tool_call_id": call, "approved": True})
            assert r.status_code == 200, r.text
            again = await client.post(
                a.url + approvals, json={"tool_call_id": call, "approved": False}
            )
            assert again.status_code == 409 and again.json()["error"]["code"] == "already_decided"
            await asyncio.gather(a_done, b_done)
            assert on_a.events == on_b.events
            assert_complete(on_a)
            tool_end = next(d for _, k, d in on_a.events if k == "tool_end")
            assert tool_end["ok"] and "approved-on-b" in tool_end["output"]
            # Started on B, cancelled on A while it waits for its approval.
            on_b, b_done = follow(on(b), user, body)
            await until(lambda: "tool_approval" in on_b.kinds())
            r = await client.post(f"{a.url}/api/v1/runs/{on_b.run_id}/cancel")
            assert r.status_code == 200 and r.json()["status"] == "cancelling"
            await b_done
            assert_complete(on_b)
            assert on_b.kinds()[-2:] == ["error", "done"]
            assert on_b.events[-2][2]["code"] == "cancelled"
            r = await client.get(
                f"{a.url}/api/v1/runs/{on_b.run_id}/events", headers={"X-User-Id": "intruder"}
            )
            assert r.status_code == 404  # foreign runs stay invisible on every replica

    asyncio.run(scenario())


def test_a_killed_owners_runs_are_taken_over_or_ended_cleanly(replicas, scripted_llm):
    a, b = replicas
    user = f"u-{uuid.uuid4().hex[:8]}"

    def respond(body):
        query = body["messages"][-1]["content"] if not tool_results(body) else "answer"
        if query == "talk":
            return slow_text(40, 0.1)  # a 4 s model turn: killed in the middle of it
        if query == "work":
            return tool_reply("execute_code", {"code": "import time; time.sleep(30)"})
        return text_reply("finished")

    scripted_llm.responder = respond

    async def scenario():
        talk, talk_done = follow(on(a, b), user, {"query": "talk", "conversation_id": "c1"})
        work, work_done = follow(on(a, b), user, {"query": "work", "conversation_id": "c2"})
        await until(lambda: talk.run_id and work.run_id)
        # Both must be on A: each POST went to the first live replica, A.
        await until(lambda: "tool_start" in work.kinds() and "text" in talk.kinds())
        a.stop(signal.SIGKILL)
        await asyncio.gather(talk_done, work_done)
        for followed in (talk, work):
            assert_complete(followed)
        resumed = [d for _, k, d in talk.events if k == "status" and d["stage"] == "resumed"]
        assert resumed and talk.kinds()[-2:] == ["result", "done"]
        assert work.kinds()[-3:] == ["tool_start", "error", "done"]
        assert work.events[-2][2]["code"] == "run_interrupted"

    asyncio.run(scenario())


def test_a_run_taken_over_carries_on_in_its_tenant(replicas, scripted_llm):
    # Security review M6: the resumed run's caller lost its tenant, so its session (one
    # per tenant and user) was "not found" on the replica that took it over.
    a, b = replicas
    user = f"u-{uuid.uuid4().hex[:8]}"
    turns: list[str] = []

    def respond(body):
        turns.append("x")
        if len(turns) == 1:
            return slow_text(40, 0.1)  # on A: killed in the middle of it
        if not tool_results(body):  # resumed on B: a tool, in the run's own session
            return tool_reply("execute_code", {"code": "print('in-' + 'tenant')"})
        return text_reply("finished")

    scripted_llm.responder = respond

    async def scenario():
        talk, done = follow(on(a, b), user, {"query": "q", "conversation_id": "c"}, tenant="t1")
        await until(lambda: "text" in talk.kinds())
        a.stop(signal.SIGKILL)
        await done
        assert_complete(talk)
        assert any(k == "status" and d["stage"] == "resumed" for _, k, d in talk.events)
        tool_end = next(d for _, k, d in talk.events if k == "tool_end")
        assert tool_end["ok"] and "in-tenant" in tool_end["output"], tool_end
        assert talk.kinds()[-2:] == ["result", "done"]

    asyncio.run(scenario())


def test_a_rolling_restart_of_both_replicas_loses_no_run(replicas, scripted_llm):
    a, b = replicas
    user = f"u-{uuid.uuid4().hex[:8]}"
    # Model turns far longer than the restarts: every run is in flight at both stops. A
    # run carried on by another replica asks the model again; before the last stop the
    # model turns short, so the runs end soon after it.
    scripted_llm.responder = lambda body: slow_text(600, 0.1)

    async def scenario():
        runs = [
            follow(on(a, b), user, {"query": "go", "conversation_id": f"c{i % 5}"})
            for i in range(50)
        ]
        await until(lambda: all(f.run_id and "text" in f.kinds() for f, _ in runs))
        for server in (a, b):  # one at a time, as a Deployment's rolling update does
            assert not any(t.done() for _, t in runs)
            if server is b:
                scripted_llm.responder = lambda body: text_reply("after the update")
            await asyncio.to_thread(server.stop, signal.SIGTERM)
            await asyncio.to_thread(server.start)
        await asyncio.gather(*(t for _, t in runs))
        for followed, _ in runs:
            assert_complete(followed)
            assert followed.kinds()[-2:] == ["result", "done"], followed.kinds()
            resumed = [d for _, k, d in followed.events if d.get("stage") == "resumed"]
            assert resumed, "each run was on the replica stopped last: it must have moved"
            assert followed.events[-2][2]["answer"] == "after the update"

    asyncio.run(scenario())


def test_a_replica_cut_off_from_redis_starts_no_tool_the_other_also_runs(
    start_server, scripted_llm, chat_env_factory, redis_url
):
    """Replica A reaches Redis through a proxy the test cuts while A's run waits on a
    model turn; B takes the run over and runs its tool. A's model turn then ends with the
    same tool call: fenced (no renewal for two thirds of a lease), A does not start it and
    is not ready meanwhile: while cut off, the tool ran once (the model received its
    result once); A is ready again once the partition heals."""
    from tcp_proxy import TcpProxy

    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    proxy = TcpProxy("127.0.0.1", port).start()
    common = dict(
        SANDBOX_WORKSPACE_CHAT_RUN_STORE="redis",
        SANDBOX_WORKSPACE_CHAT_REDIS_PREFIX=f"t{uuid.uuid4().hex[:8]}:",
        SANDBOX_WORKSPACE_CHAT_RUN_LEASE_SECONDS="1.5",
        SANDBOX_WORKSPACE_CHAT_KEEPALIVE_SECONDS="0.5",
    )
    a = start_server(
        "dev", "--data-dir", "data",
        **chat_env_factory(scripted_llm, SANDBOX_WORKSPACE_CHAT_REDIS_URL=
                           f"redis://127.0.0.1:{proxy.port}/0", **common),
    )  # fmt: skip
    b = start_server(
        "dev", "--data-dir", "data",
        **chat_env_factory(scripted_llm, SANDBOX_WORKSPACE_CHAT_REDIS_URL=redis_url, **common),
    )  # fmt: skip
    user = f"u-{uuid.uuid4().hex[:8]}"
    turns: list[str] = []  # "model" per model turn started, "result" per tool result seen

    def respond(body):
        if tool_results(body):
            turns.append("result")
            return text_reply("done")
        turns.append("model")
        reply = tool_reply("execute_code", {"code": "print('ran')"})
        reply.stall_seconds = 4.0  # A's turn outlasts the lease while it is cut off
        return reply

    scripted_llm.responder = respond

    def ready(server) -> int:
        return httpx.get(f"{server.url}/readyz", timeout=5).status_code

    def running_on(server) -> int:
        """Runs ``server`` holds that are neither finished nor awaiting an approval."""
        text = httpx.get(f"{server.url}/metrics", timeout=5).text
        found = [
            ln for ln in text.splitlines() if ln.startswith('sandbox_chat_runs{state="running"}')
        ]
        return int(float(found[0].split()[-1])) if found else 0

    async def scenario():
        body = {"query": "work", "conversation_id": "c1"}
        work, done = follow(on(a, b), user, body)
        await until(lambda: work.run_id and turns == ["model"])  # A's turn under way
        proxy.cut()
        # B takes the run over, calls the model again and runs the tool: one result.
        await until(lambda: "result" in turns, timeout=60)
        await until(lambda: ready(a) == 503)  # cut off for a whole lease: not ready
        # A's own model turn (the first request) ends, with the tool call, while cut off.
        await until(lambda: 0 in scripted_llm.completed, timeout=30)
        assert turns.count("result") == 1, turns  # the tool ran once, on B
        proxy.heal()
        await until(lambda: ready(a) == 200, timeout=30)
        # Healed: A starts nothing late either. A tool run reaches the model as a result,
        # and a run A held would show until that answer was in.
        await until(lambda: running_on(a) == 0 and running_on(b) == 0, timeout=30)
        assert turns.count("result") == 1, turns
        done.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await done

    try:
        asyncio.run(scenario())
    finally:
        proxy.stop()
        for server in (a, b):
            server.stop(signal.SIGTERM)
