"""E2B sandboxes on two API replicas sharing a Redis run store (started by the tests) and
an ``s3`` store (the tests' SeaweedFS): timers, ``Idempotency-Key`` answers and
attachments live in Redis, so a retry, a kill or a timeout landing on the other replica
behaves as on the first. Each replica has its own data directory (as two pods have their
own caches); what one wrote the other finds through the store."""

from __future__ import annotations

import hashlib
import signal
import uuid

import pytest
from e2b.exceptions import NotFoundException, SandboxException
from e2b_code_interpreter import Sandbox
from polling import wait_for

from .test_e2b_store import chat_upload

pytestmark = pytest.mark.local_backend

KEY = "e2b_" + "4e" * 16
KEY_USER = "e2b-" + hashlib.sha256(KEY.encode()).hexdigest()[:16]  # docs/e2b.md


@pytest.fixture(scope="module")
def replicas(start_server, seaweedfs, redis_url, tmp_path_factory):
    bucket = f"t-e2r-{uuid.uuid4().hex[:10]}"
    seaweedfs.make_bucket(bucket)
    env = {
        "SANDBOX_WORKSPACE_SANDBOX_MOUNT": "none",
        # Access tokens are signed with it: every replica accepts another's (as run
        # stream tokens need, docs/operations.md).
        "SANDBOX_WORKSPACE_STREAM_TOKEN_SECRET": uuid.uuid4().hex,
        "SANDBOX_WORKSPACE_CHAT_RUN_STORE": "redis",
        "SANDBOX_WORKSPACE_CHAT_REDIS_URL": redis_url,
        "SANDBOX_WORKSPACE_CHAT_REDIS_PREFIX": f"t{uuid.uuid4().hex[:8]}:",
        **seaweedfs.env(bucket),
    }
    servers = [
        start_server("dev", "--data-dir", str(tmp_path_factory.mktemp("data")), **env)
        for _ in range(2)
    ]
    yield servers, bucket
    for server in servers:
        if server.proc is not None and server.proc.poll() is None:
            server.stop(signal.SIGTERM)


def _opts(server) -> dict:
    return {"api_url": f"{server.url}/e2b", "sandbox_url": f"{server.url}/e2b/envd", "api_key": KEY}


def _gone(sandbox_id: str, server) -> bool:
    try:
        Sandbox.get_info(sandbox_id, **_opts(server))
    except NotFoundException:
        return True
    return False


def test_retry_kill_and_attachment_behave_alike_on_either_replica(replicas, seaweedfs):
    (a, b), bucket = replicas
    first = Sandbox.create(idempotency_key="retry-r", metadata={"n": "1"}, **_opts(a))
    first.files.write("kept.txt", "written through A")
    # The retry lands on B: the same sandbox, whose files B finds through the store.
    again = Sandbox.create(idempotency_key="retry-r", metadata={"n": "1"}, **_opts(b))
    assert again.sandbox_id == first.sandbox_id
    assert again.files.read("kept.txt") == "written through A"
    with pytest.raises(SandboxException, match="another request body"):
        Sandbox.create(idempotency_key="retry-r", metadata={"n": "2"}, **_opts(b))
    # Killed on B: gone on A too (its timer was the shared one), and from the store.
    assert Sandbox.kill(first.sandbox_id, **_opts(b)) is True
    assert _gone(first.sandbox_id, a) and _gone(first.sandbox_id, b)
    listed_on_a = [s.sandbox_id for s in Sandbox.list(**_opts(a)).next_items()]
    assert first.sandbox_id not in listed_on_a  # though A's own cache still holds it
    prefix = f"workspaces/default/sb-session-{KEY_USER}/e2b-{first.sandbox_id}/"
    assert seaweedfs.list_keys(bucket, prefix) == []

    # An attachment made on A is known on B; B's kill detaches it on A as well.
    chat_upload(a.url, KEY_USER, "chat-r", "notes.txt", b"the chat's")
    attached = Sandbox.create(metadata={"sandbox-workspace.conversation": "chat-r"}, **_opts(a))
    on_b = Sandbox.connect(attached.sandbox_id, **_opts(b))
    assert on_b.files.read("uploads/temparea/notes.txt") == "the chat's"
    assert on_b.kill() is True
    assert _gone(attached.sandbox_id, a)  # detached only: the chat's file stays
    chat = f"workspaces/default/sb-session-{KEY_USER}/chat-r/uploads/temparea/"
    assert [o.key for o in seaweedfs.list_keys(bucket, chat)] == [chat + "notes.txt"]


def test_a_timeout_set_on_a_replica_that_stopped_is_enforced_by_the_other(replicas, seaweedfs):
    (a, b), bucket = replicas
    short = Sandbox.create(timeout=3, **_opts(a))
    short.files.write("soon-gone.txt", "x")
    prefix = f"workspaces/default/sb-session-{KEY_USER}/e2b-{short.sandbox_id}/"
    assert seaweedfs.list_keys(bucket, prefix)
    assert not _gone(short.sandbox_id, b)  # B has served an E2B call: it reaps too
    a.stop(signal.SIGTERM)  # A, which set the timer, is gone before it ends
    wait_for(lambda: _gone(short.sandbox_id, b), "B to kill the sandbox at its timeout", 30)
    wait_for(lambda: seaweedfs.list_keys(bucket, prefix) == [], "its files to go", 30)


def test_shared_answers_are_per_user_and_bounded(redis_url, monkeypatch):
    """A user minting Idempotency-Keys keeps at most MAX_REMEMBERED answers in Redis (the
    oldest dropped first), and another user's same key is another answer."""
    import asyncio

    from redis.asyncio import Redis

    from sandbox_workspace.api.e2b import shared
    from sandbox_workspace.api.identity import Caller

    monkeypatch.setattr(shared, "MAX_REMEMBERED", 5)
    prefix = f"t{uuid.uuid4().hex[:8]}:e2b:"
    alice, bob = Caller("alice", "e2b-key"), Caller("bob", "e2b-key")

    async def play() -> None:
        redis = Redis.from_url(redis_url)
        answers = shared.SharedAnswers(redis, prefix)

        async def made(n: int) -> dict:
            return {"n": n}

        try:
            for i in range(8):
                await answers.once(alice, f"k{i}", {}, lambda i=i: made(i))
            assert await answers.once(alice, "k7", {}, lambda: made(99)) == {"n": 7}
            assert await answers.once(alice, "k0", {}, lambda: made(100)) == {"n": 100}
            assert await answers.once(bob, "k7", {}, lambda: made(101)) == {"n": 101}
            kept = [k async for k in redis.scan_iter(f"{prefix}idem:*") if b"by-user" not in k]
            assert len(kept) == 5 + 1  # alice's newest five, bob's one
        finally:
            await redis.aclose()

    asyncio.run(play())
