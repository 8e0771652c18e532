"""E2B sandboxes' lifecycle through the official SDK (issue 37): keys in ``required``
auth mode, ``Idempotency-Key``, attaching a chat's conversation, timeouts.

The SDK (``e2b-code-interpreter`` 2.11.5) runs in this process against a real API
server on loopback, configured by its own parameters (``api_url``, ``sandbox_url``,
``api_key``: the same as E2B's environment variables, docs/e2b.md).
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import httpx
import pytest
from api_calls import required_api
from e2b.exceptions import AuthenticationException, NotFoundException, SandboxException
from e2b_code_interpreter import Sandbox

from sandbox_workspace.api.e2b import watchers

SERVICE_TOKEN = "e2b-lifecycle-service-token-0123456789"
DEV_KEY = "e2b_" + "ab" * 16


def sdk(url: str, key: str) -> dict:
    return {"api_url": f"{url}/e2b", "sandbox_url": f"{url}/e2b/envd", "api_key": key}


def _gone(root: Path, cid: str) -> bool:
    return not [p for p in root.rglob(cid) if p.is_dir()]


def _wait(condition, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


@pytest.fixture(scope="module")
def secure_api(start_server):
    return required_api(start_server, SERVICE_TOKEN)


def _as(user: str, tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {SERVICE_TOKEN}", "X-User-Id": user, "X-Tenant-Id": tenant}


def test_required_mode_keys_are_per_user_hashed_and_revocable(secure_api):
    url = secure_api.url
    issued = httpx.post(f"{url}/e2b/keys", headers=_as("alice", "acme"), timeout=30)
    assert issued.status_code == 201, issued.text
    alice = issued.json()
    assert alice["key"].startswith("e2b_") and (alice["tenant"], alice["user"]) == (
        "acme",
        "alice",
    )
    other = httpx.post(f"{url}/e2b/keys", headers=_as("alice", "globex"), timeout=30).json()
    # Without API credentials no key is issued; a key never issued is refused.
    assert httpx.post(f"{url}/e2b/keys", timeout=30).status_code == 401
    with pytest.raises(AuthenticationException):
        Sandbox.create(**sdk(url, "e2b_" + "0" * 40))

    sbx = Sandbox.create(**sdk(url, alice["key"]))
    try:
        sbx.files.write("mine.txt", "acme's alice")
        # The same user id in another tenant is another user: 404, never this sandbox.
        with pytest.raises(NotFoundException):
            Sandbox.connect(sbx.sandbox_id, **sdk(url, other["key"]))
        assert sbx.sandbox_id not in [
            s.sandbox_id for s in Sandbox.list(**sdk(url, other["key"])).next_items()
        ]

        # What is stored is the hash, never the key.
        [stored] = [p for p in secure_api.workdir.rglob("e2b-keys.json")]
        text = stored.read_text()
        assert alice["key"] not in text and other["key"] not in text
        assert len(json.loads(text)) == 2
        assert stored.stat().st_mode & 0o077 == 0

        listed = httpx.get(f"{url}/e2b/keys", headers=_as("alice", "acme"), timeout=30).json()
        assert [k["id"] for k in listed] == [alice["id"]] and "key" not in listed[0]
        # Another user cannot revoke it; its owner can, and then it is 401.
        foreign = httpx.delete(
            f"{url}/e2b/keys/{alice['id']}", headers=_as("alice", "globex"), timeout=30
        )
        assert foreign.status_code == 404
        assert Sandbox.connect(sbx.sandbox_id, **sdk(url, alice["key"])).files.read("mine.txt")
    finally:
        sbx.kill()
    revoked = httpx.delete(
        f"{url}/e2b/keys/{alice['id']}", headers=_as("alice", "acme"), timeout=30
    )
    assert revoked.status_code == 204
    with pytest.raises(AuthenticationException) as refused:
        Sandbox.create(**sdk(url, alice["key"]))
    assert "revoked" in str(refused.value)


def test_idempotency_key_answers_the_same_sandbox_and_refuses_another_body(dev_server):
    opts = sdk(dev_server.url, DEV_KEY)
    first = Sandbox.create(idempotency_key="retry-1", metadata={"a": "1"}, **opts)
    try:
        again = Sandbox.create(idempotency_key="retry-1", metadata={"a": "1"}, **opts)
        assert again.sandbox_id == first.sandbox_id
        with pytest.raises(SandboxException) as clash:
            Sandbox.create(idempotency_key="retry-1", metadata={"a": "2"}, **opts)
        assert "another request body" in str(clash.value)
        assert Sandbox.create(idempotency_key="retry-2", **opts).sandbox_id != first.sandbox_id
    finally:
        first.kill()


def _upload(url: str, user: str, cid: str) -> str:
    up = httpx.post(
        f"{url}/api/v1/sessions/sb-session-{user}/files/upload",
        files={"file": ("sales.csv", b"region,total\nnorth,3\n")},
        data={"conversation_id": cid, "subdir": "temparea"},
        headers={"X-User-Id": user},
        timeout=60,
    )
    assert up.status_code == 201, up.text
    return up.json()["path"]


def _detached(sandbox_id: str, opts: dict) -> bool:
    try:
        Sandbox.get_info(sandbox_id, **opts)
    except NotFoundException:
        return True
    return False


def test_attached_conversation_shows_chat_files_and_kill_only_detaches(dev_server, user):
    key = "e2b_" + "cd" * 16
    key_user = "e2b-" + hashlib.sha256(key.encode()).hexdigest()[:16]  # docs/e2b.md
    opts = sdk(dev_server.url, key)
    attach = {"sandbox-workspace.conversation": "chat-7"}
    _upload(dev_server.url, user, "chat-7")  # another user's chat of that name
    try:
        with pytest.raises(SandboxException, match=r"404: sandbox 'conv.*' not found"):
            Sandbox.create(metadata=attach, **opts)
        chat_file = Path(_upload(dev_server.url, key_user, "chat-7"))
        sbx = Sandbox.create(metadata=attach, **opts)
        try:
            # Code through the SDK sees the chat's upload at the same relative path.
            seen = sbx.commands.run("cat uploads/temparea/sales.csv").stdout
            assert seen == chat_file.read_text()
            assert sbx.files.read("/home/user/uploads/temparea/sales.csv") == seen
            sbx.files.write("/home/user/outputs/from-sdk.txt", "made by SDK code")
            background = sbx.commands.run("sleep 600", background=True, timeout=0)
            assert [sbx.run_code("1").execution_count for _ in range(2)] == [1, 2]
        finally:
            assert sbx.kill() is True
        # What the SDK started there ends with the sandbox: attached again, none runs.
        again = Sandbox.create(metadata=attach, **opts)
        assert background.pid not in [p.pid for p in again.commands.list()]
        # A new sandbox counts from 1: the detached one's count was dropped (it was
        # kept for good, one per conversation ever attached).
        assert again.run_code("1").execution_count == 1
        again.kill()
        # Detached only: the chat's files are all still there, and so is what code made.
        assert chat_file.read_bytes() == b"region,total\nnorth,3\n"
        assert (chat_file.parents[2] / "outputs" / "from-sdk.txt").read_text() == (
            "made by SDK code"
        )
        # A short timeout on an attached sandbox detaches too, never deletes.
        short = Sandbox.create(metadata=attach, timeout=1, **opts)
        _wait(
            lambda: _detached(short.sandbox_id, opts), "the attached sandbox outlived its timeout"
        )
        assert chat_file.exists()
    finally:
        httpx.delete(
            f"{dev_server.url}/api/v1/sessions/sb-session-{key_user}",
            headers={"X-User-Id": key_user},
            timeout=30,
        )


def test_two_users_chats_of_one_name_have_their_own_directory_watchers(dev_server):
    # Conversation ids are per session: two users may each attach a chat named "chat-w".
    # One user's watchers must neither use up the other's allowance nor be theirs.
    keys = ["e2b_" + "a1" * 16, "e2b_" + "b2" * 16]
    users = ["e2b-" + hashlib.sha256(k.encode()).hexdigest()[:16] for k in keys]
    attach = {"sandbox-workspace.conversation": "chat-w"}
    try:
        for user in users:
            _upload(dev_server.url, user, "chat-w")
        mine, theirs = (Sandbox.create(metadata=attach, **sdk(dev_server.url, k)) for k in keys)
        held = [mine.files.watch_dir("uploads") for _ in range(watchers.MAX_PER_SANDBOX)]
        with pytest.raises(SandboxException, match="directory watchers per sandbox"):
            mine.files.watch_dir("uploads")
        theirs.files.watch_dir("uploads").stop()
        for handle in held:
            handle.stop()
    finally:
        for user in users:
            httpx.delete(
                f"{dev_server.url}/api/v1/sessions/sb-session-{user}",
                headers={"X-User-Id": user},
                timeout=30,
            )


def test_timeout_kills_a_fresh_sandbox_and_set_timeout_extends_it(dev_server):
    opts = sdk(dev_server.url, DEV_KEY)
    short = Sandbox.create(timeout=2, **opts)
    kept = Sandbox.create(timeout=2, **opts)
    kept.set_timeout(60)
    cid = f"e2b-{short.sandbox_id}"
    _wait(lambda: _gone(dev_server.workdir, cid), "the timed-out sandbox's files stayed", 30)
    with pytest.raises(NotFoundException):
        Sandbox.connect(short.sandbox_id, **opts)
    # Past the first timeout the extended one lives, and connect extends it again.
    assert kept.files.exists("/home/user")
    Sandbox.connect(kept.sandbox_id, timeout=120, **opts)
    assert not _gone(dev_server.workdir, f"e2b-{kept.sandbox_id}")
    kept.kill()
