"""E2B sandboxes on two API replicas sharing a Redis run store (started by the tests) and
an ``s3`` store (the tests' SeaweedFS): timers, ``Idempotency-Key`` answers and
attachments live in Redis, so a retry, a kill or a timeout landing on the other replica
behaves as on the first. Each replica has its own data directory (as two pods have their
own caches); what one wrote the other finds through the store."""

from __future__ import annotations

import hashlib
import signal
import uuid

import httpx
import pytest
from e2b.exceptions import NotFoundException, SandboxException
from e2b_code_interpreter import Sandbox
from polling import wait_for

pytestmark = pytest.mark.local_backend

KEY = "e2b_" + "4e" * 16
KEY_USER = "e2b-" + hashlib.sha256(KEY.encode()).hexdigest()[:16]  # docs/e2b.md
SESSION = f"/api/v1/sessions/sb-session-{KEY_USER}"


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
    prefix = f"workspaces/default/sb-session-{KEY_USER}/e2b-{first.sandbox_id}/"
    assert seaweedfs.list_keys(bucket, prefix) == []

    # An attachment made on A is known on B; B's kill detaches it on A as well.
    with httpx.Client(base_url=a.url, headers={"X-User-Id": KEY_USER}, timeout=60) as c:
        up = c.post(
            f"{SESSION}/files/upload",
            files={"file": ("notes.txt", b"the chat's")},
            data={"conversation_id": "chat-r", "subdir": "temparea"},
        )
        assert up.status_code == 201, up.text
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
