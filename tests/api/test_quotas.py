"""Per-user caps against a real API process (small caps so the attack is short): the
conversation count answers 409 quota_exceeded naming the cap; runs, event-stream
followers and executions answer 429 with Retry-After (executions also per tenant and per
replica); another user is not affected, and a slot is free again once its holder ends."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import httpx
import pytest
from api_calls import execute
from rss_watch import PeakWatch
from scripted_llm import Reply, text_reply, tool_reply, tool_results
from sse_stream import Stream

pytestmark = pytest.mark.local_backend

CAPS = {
    "SANDBOX_WORKSPACE_QUOTAS__CONVERSATIONS_PER_USER": "3",
    "SANDBOX_WORKSPACE_QUOTAS__RUNS_PER_USER": "1",
    "SANDBOX_WORKSPACE_QUOTAS__FOLLOWERS_PER_USER": "2",
    "SANDBOX_WORKSPACE_QUOTAS__EXECUTIONS_PER_USER": "2",
    "SANDBOX_WORKSPACE_QUOTAS__EXECUTIONS_PER_TENANT": "3",
    # Executions of all users (and E2B streams) on the replica: half of 8, so 4.
    "SANDBOX_WORKSPACE_RUNTIME_CONNECTIONS": "8",
    "SANDBOX_WORKSPACE_CHAT_APPROVAL_TIMEOUT_SECONDS": "60",
}


@pytest.fixture(scope="module")
def capped(start_server, scripted_llm_server, chat_env_factory):
    return start_server(
        "dev", "--data-dir", "data", **chat_env_factory(scripted_llm_server, **CAPS)
    )


def client(server, user: str, tenant: str = "") -> httpx.Client:
    headers = {"X-User-Id": user} | ({"X-Tenant-Id": tenant} if tenant else {})
    return httpx.Client(base_url=server.url, headers=headers, timeout=60)


@pytest.fixture
def api(capped) -> Iterator[tuple[httpx.Client, str]]:
    user = f"u-{uuid.uuid4().hex[:10]}"
    url = f"/api/v1/sessions/sb-session-{user}"
    with client(capped, user) as c:
        yield c, url
        c.delete(url, timeout=120)


def test_conversations_past_the_cap_answer_409_naming_it(api, capped):
    c, url = api
    peak = PeakWatch(capped.proc.pid)
    for cid in ("c1", "c2", "c3"):
        assert execute(c, url, "1", cid=cid)["error"] is None
    r = c.post(f"{url}/execute", json={"conversation_id": "c4", "language": "python", "code": "1"})
    assert r.status_code == 409, r.text
    error = r.json()["error"]
    assert error["code"] == "quota_exceeded"
    assert "3" in error["message"] and "QUOTAS__CONVERSATIONS_PER_USER" in error["message"]
    upload = c.post(
        f"{url}/files/upload", data={"conversation_id": "c5"}, files={"file": ("a.csv", b"a")}
    )
    assert upload.status_code == 409 and upload.json()["error"]["code"] == "quota_exceeded"
    assert execute(c, url, "2", cid="c1")["error"] is None  # a held one goes on
    assert c.delete(f"{url}/conversations/c1", timeout=120).status_code == 200
    assert execute(c, url, "1", cid="c4")["error"] is None  # room again
    peak.check()


def test_executions_past_the_cap_answer_429_with_retry_after(api, capped):
    c, url = api
    slow = "print('started', flush=True)\nimport time\ntime.sleep(3)"
    body = {"language": "python", "code": slow, "stream": True}
    with (
        c.stream("POST", f"{url}/execute", json={**body, "conversation_id": "a"}) as one,
        c.stream("POST", f"{url}/execute", json={**body, "conversation_id": "b"}) as two,
    ):
        # Each has started (its first output arrived): two executions are in progress.
        assert one.status_code == two.status_code == 200
        first, second = Stream(one), Stream(two)
        first.until("stdout")
        second.until("stdout")
        quick = {"conversation_id": "c", "language": "python", "code": "1"}
        refused = c.post(f"{url}/execute", json=quick)
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "too_many_requests"
        assert int(refused.headers["retry-after"]) >= 1
        assert "QUOTAS__EXECUTIONS_PER_USER" in refused.json()["error"]["message"]
        with client(capped, f"other-{uuid.uuid4().hex[:6]}") as other:  # only this user's
            other_url = f"/api/v1/sessions/sb-session-{other.headers['X-User-Id']}"
            assert execute(other, other_url, "1")["error"] is None
            other.delete(other_url, timeout=120)
        first.until("done")
        second.until("done")
    assert execute(c, url, "1", cid="c")["error"] is None  # the slots are free again


def test_executions_past_the_tenants_cap_then_the_replicas_bound_answer_429_naming_it(api, capped):
    # The caller holds two executions (its own cap) and another user of its tenant one:
    # the tenant's three are taken, so a third user of that tenant is refused while a user
    # of another tenant still runs one. That fills the replica's four runtime connections
    # for executions: a user of a third tenant is refused — never a wait for the pool
    # that every other call of every user needs too.
    c, _ = api
    # Runs until the test uploads "go.txt" into its conversation (at most 60 s).
    wait = (
        "import os, time\nprint('started', flush=True)\nend = time.time() + 60\n"
        "while not os.path.exists('uploads/temparea/go.txt') and time.time() < end:\n"
        "    time.sleep(0.05)"
    )
    body = {"language": "python", "code": wait, "stream": True}
    quick = {"conversation_id": "c", "language": "python", "code": "1"}
    url_of = "/api/v1/sessions/sb-session-{}".format
    name = uuid.uuid4().hex[:6]
    with contextlib.ExitStack() as held:
        other, third, far, farther = (
            held.enter_context(client(capped, f"{who}-{name}", tenant))
            for who, tenant in (("o", ""), ("t", ""), ("f", "t2"), ("g", "t3"))
        )
        streams = []

        def hold(who: httpx.Client, cid: str) -> None:
            where = url_of(who.headers["X-User-Id"])
            r = held.enter_context(
                who.stream("POST", f"{where}/execute", json={**body, "conversation_id": cid})
            )
            assert r.status_code == 200
            stream = Stream(r)
            stream.until("stdout")
            streams.append((who, where, cid, stream))

        def refused_naming(who: httpx.Client, *words: str) -> None:
            refused = who.post(f"{url_of(who.headers['X-User-Id'])}/execute", json=quick)
            assert refused.status_code == 429, refused.text
            assert int(refused.headers["retry-after"]) >= 1
            message = refused.json()["error"]["message"]
            assert all(word in message for word in words), message

        for who, cid in ((c, "a"), (c, "b"), (other, "a")):
            hold(who, cid)
        refused_naming(third, "at most 3 at once per tenant", "QUOTAS__EXECUTIONS_PER_TENANT")
        hold(far, "a")  # another tenant's user is not affected
        refused_naming(
            farther,
            "at most 4 at once on this API replica",
            "SANDBOX_WORKSPACE_RUNTIME_CONNECTIONS",
        )
        for who, where, cid, stream in streams:
            go = who.post(
                f"{where}/files/upload",
                data={"conversation_id": cid},
                files={"file": ("go.txt", b"")},
            )
            assert go.status_code == 201, go.text
            stream.until("done")
        # Free again (the tenant's slots and the replica's): the refused user runs now.
        assert execute(third, url_of(third.headers["X-User-Id"]), "1", cid="c")["error"] is None
        for who in (other, third, far):  # farther was refused before any session started
            who.delete(url_of(who.headers["X-User-Id"]), timeout=120)


def waiting_for_approval(body: dict) -> Reply:
    if not tool_results(body):
        return tool_reply("bash", {"command": "echo hi"}, call_id="call_ok")
    return text_reply("done")


def test_runs_and_followers_past_their_caps_answer_429(api, scripted_llm):
    c, _ = api
    scripted_llm.responder = waiting_for_approval
    chat = {"conversation_id": "r", "query": "hi", "tool_policies": {"bash": "require_approval"}}
    with c.stream("POST", "/api/v1/chat", json=chat) as first:
        assert first.status_code == 200
        run = Stream(first)
        run.until("tool_approval")  # the run waits: it is in progress
        run_id = first.headers["x-run-id"]
        second = c.post("/api/v1/chat", json={**chat, "conversation_id": "r2"})
        assert second.status_code == 429, second.text
        assert "QUOTAS__RUNS_PER_USER" in second.json()["error"]["message"]
        assert "retry-after" in second.headers

        events = f"/api/v1/runs/{run_id}/events"
        with c.stream("GET", events) as f1, c.stream("GET", events) as f2:
            assert f1.status_code == f2.status_code == 200
            third = c.get(events)
            assert third.status_code == 429, third.text
            assert "QUOTAS__FOLLOWERS_PER_USER" in third.json()["error"]["message"]
        # Both followers hung up: their slots are free.
        for _ in range(100):
            with c.stream("GET", events) as again:
                if again.status_code == 200:
                    break
        assert again.status_code == 200
        decide = {"tool_call_id": "call_ok", "approved": True}
        assert c.post(f"/api/v1/runs/{run_id}/approvals", json=decide).status_code == 200
        run.until("done")
    # The run ended: its slot is free for the next one.
    for _ in range(100):
        with c.stream("POST", "/api/v1/chat", json={**chat, "tool_policies": {}}) as r:
            if r.status_code == 200:
                Stream(r).until("done")
                break
    assert r.status_code == 200


def test_ui_chat_resumes_past_the_follower_cap_answer_429(api, scripted_llm):
    """The AI SDK protocol's resume route (``GET /ui/chat/{id}/stream``) holds the same
    per-user follower slots as ``/runs/{id}/events``."""
    c, _ = api
    slow = text_reply("slow")
    scripted_llm.responder = lambda body: Reply(slow.chunks, stall_seconds=30)
    message = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}
    body = {"id": "chat-cap", "messages": [message], "conversation_id": "u"}
    with c.stream("POST", "/api/v1/ui/chat", json=body) as started:
        assert started.status_code == 200
        run_id = started.headers["x-run-id"]
        resume = "/api/v1/ui/chat/chat-cap/stream"
        try:
            with c.stream("GET", resume) as f1, c.stream("GET", resume) as f2:
                assert f1.status_code == f2.status_code == 200
                third = c.get(resume)
                assert third.status_code == 429, third.text
                assert "QUOTAS__FOLLOWERS_PER_USER" in third.json()["error"]["message"]
                assert "retry-after" in third.headers
        finally:
            assert c.post(f"/api/v1/runs/{run_id}/cancel").status_code == 200


def test_an_over_long_conversation_id_does_not_slip_an_upload_past_the_guard(api):
    """Review L1: a first conversation_id longer than the guard parsed (but within what
    the runtime takes) hid a second, valid one: the guard opened nothing, the runtime
    stored the file there — past the conversation cap, untracked. Now the guard reads
    every value the runtime reads: the second id is opened first, and refused at the cap."""
    c, url = api
    for cid in ("c1", "c2", "c3"):
        assert execute(c, url, "1", cid=cid)["error"] is None
    boundary = "b0undary"
    parts = [("conversation_id", "x" * 2000), ("conversation_id", "c-over")]
    body = (
        b"".join(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{n}"\r\n\r\n{v}\r\n'.encode()
            for n, v in parts
        )
        + (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.csv"\r\n\r\n'
            f"a,b\r\n--{boundary}--\r\n"
        ).encode()
    )
    r = c.post(
        f"{url}/files/upload",
        content=body,
        headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
    )
    assert r.status_code == 409, r.text
    assert r.json()["error"]["code"] == "quota_exceeded"
    listing = c.get(f"{url}/files", params={"conversation_id": "c-over"})
    assert listing.status_code != 200 or listing.json()["files"] == []
