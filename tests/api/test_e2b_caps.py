"""What one E2B caller may hold open on an API replica, through the official SDK against a
real server in ``required`` auth mode (users in two tenants; small caps so the attack is
short): streams (commands, ``commands.connect``, ``run_code``) and directory watchers are
capped per user, per tenant and per replica with the SDK's rate-limit error; another
tenant's user still runs commands promptly, and unary calls find a runtime connection
while streams hold their whole share. The code interpreter's execution count is per
(tenant, user, sandbox): the same chat conversation id in two tenants counts apart.
"""

from __future__ import annotations

import time

import httpx
import pytest
from api_calls import required_api
from e2b.exceptions import RateLimitException, SandboxException
from e2b_code_interpreter import Sandbox

from sandbox_workspace.operator.naming import session_id_for

SERVICE_TOKEN = "e2b-caps-service-token-0123456789abcdef"
CAPS = {
    # Streams: 3 per user, 4 per tenant, half of 12 runtime connections (6) per replica.
    "SANDBOX_WORKSPACE_RUNTIME_CONNECTIONS": "12",
    "SANDBOX_WORKSPACE_QUOTAS__E2B_STREAMS_PER_USER": "3",
    "SANDBOX_WORKSPACE_QUOTAS__E2B_STREAMS_PER_TENANT": "4",
    "SANDBOX_WORKSPACE_QUOTAS__E2B_WATCHERS_PER_USER": "2",
    "SANDBOX_WORKSPACE_QUOTAS__E2B_WATCHERS_PER_TENANT": "3",
}
PROMPT = 5.0  # seconds: a command or file call of a user under no cap


@pytest.fixture(scope="module")
def server(start_server):
    return required_api(start_server, SERVICE_TOKEN, **CAPS)


def _as(user: str, tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {SERVICE_TOKEN}", "X-User-Id": user, "X-Tenant-Id": tenant}


@pytest.fixture(scope="module")
def keys(server):
    """An E2B key per (user, tenant); their sessions are deleted at the module's end."""
    made = {}
    for user, tenant in [("alice", "acme"), ("bob", "acme"), ("carol", "globex"),
                         ("alice", "globex")]:  # fmt: skip
        issued = httpx.post(f"{server.url}/e2b/keys", headers=_as(user, tenant), timeout=30)
        assert issued.status_code == 201, issued.text
        made[(user, tenant)] = issued.json()["key"]
    yield made
    for user, tenant in made:
        httpx.delete(
            f"{server.url}/api/v1/sessions/{session_id_for(user, tenant)}",
            headers=_as(user, tenant),
            timeout=60,
        )


def _sdk(server, key: str) -> dict:
    return {"api_url": f"{server.url}/e2b", "sandbox_url": f"{server.url}/e2b/envd", "api_key": key}


def _prompt(call):
    started = time.monotonic()
    answer = call()
    assert time.monotonic() - started < PROMPT, "a call of a user under no cap waited"
    return answer


def test_streams_are_capped_per_user_tenant_and_replica_and_others_run_promptly(server, keys):
    alice, bob, carol = (
        Sandbox.create(**_sdk(server, keys[who]))
        for who in [("alice", "acme"), ("bob", "acme"), ("carol", "globex")]
    )
    held = []
    try:
        first = alice.commands.run("sleep 60", background=True, timeout=0)
        held += [first, alice.commands.connect(first.pid)]
        held.append(alice.commands.run("sleep 60", background=True, timeout=0))
        # Each held stream is one of the replica's runtime connections: the fourth is not.
        with pytest.raises(RateLimitException, match=r"at most 3 at once per user"):
            alice.commands.run("echo more")
        with pytest.raises(SandboxException, match=r"429.*E2B_STREAMS_PER_USER"):
            alice.run_code("1")  # the code interpreter's stream: E2B's REST error shape
        held.append(bob.commands.run("sleep 60", background=True, timeout=0))
        with pytest.raises(RateLimitException, match=r"at most 4 at once per tenant"):
            bob.commands.run("echo more")
        # Another tenant's user is not held back by acme's four streams.
        assert _prompt(lambda: carol.commands.run("echo hi")).stdout == "hi\n"
        held += [carol.commands.run("sleep 60", background=True, timeout=0) for _ in range(2)]
        with pytest.raises(RateLimitException, match=r"at most 6 at once on this API replica"):
            carol.commands.run("echo more")
        # Streams hold their whole share (6 of 12): every other call still finds one.
        for sbx in (alice, bob, carol):
            _prompt(lambda sbx=sbx: sbx.files.write("note.txt", "still served"))
            assert _prompt(lambda sbx=sbx: len(sbx.commands.list())) >= 1
        # A stream that ends frees its slot: kill alice's first command (and so both of
        # its streams), then she may run one again.
        assert alice.commands.kill(first.pid)
        deadline = time.monotonic() + 30
        while True:
            try:
                assert alice.commands.run("echo again").stdout == "again\n"
                break
            except RateLimitException:
                assert time.monotonic() < deadline, "an ended stream kept its slot"
                time.sleep(0.2)
    finally:
        for handle in held:
            handle.disconnect()
        for sbx in (alice, bob, carol):
            sbx.kill()


def test_directory_watchers_are_capped_per_user_and_per_tenant(server, keys):
    alice, bob, carol = (
        Sandbox.create(**_sdk(server, keys[who]))
        for who in [("alice", "acme"), ("bob", "acme"), ("carol", "globex")]
    )
    try:
        held = [alice.files.watch_dir("/home/user") for _ in range(2)]
        with pytest.raises(SandboxException, match=r"at most 2 at once per user"):
            alice.files.watch_dir("/home/user")
        held.append(bob.files.watch_dir("/home/user"))
        with pytest.raises(SandboxException, match=r"at most 3 at once per tenant"):
            bob.files.watch_dir("/home/user")
        carol.files.watch_dir("/home/user").stop()  # another tenant's: not held back
        held.pop(0).stop()  # a stopped watcher frees its slots
        held.append(alice.files.watch_dir("/home/user"))
        for handle in held:
            handle.stop()
    finally:
        for sbx in (alice, bob, carol):
            sbx.kill()


def test_execution_counts_are_per_tenant_for_one_conversation_id(server, keys):
    """alice in acme and alice in globex each have a chat conversation "shared": each
    attached sandbox counts its own cells."""
    counts = {}
    for tenant in ("acme", "globex"):
        up = httpx.post(
            f"{server.url}/api/v1/sessions/{session_id_for('alice', tenant)}/files/upload",
            files={"file": ("a.csv", b"a\n")},
            data={"conversation_id": "shared"},
            headers=_as("alice", tenant),
            timeout=60,
        )
        assert up.status_code == 201, up.text
    sandboxes = [
        Sandbox.create(
            metadata={"sandbox-workspace.conversation": "shared"},
            **_sdk(server, keys[("alice", tenant)]),
        )
        for tenant in ("acme", "globex")
    ]
    try:
        for tenant, sbx in zip(("acme", "globex"), sandboxes, strict=True):
            counts[tenant] = [sbx.run_code("1").execution_count for _ in range(2)]
    finally:
        for sbx in sandboxes:
            sbx.kill()
    assert counts == {"acme": [1, 2], "globex": [1, 2]}
