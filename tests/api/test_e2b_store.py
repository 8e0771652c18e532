"""E2B sandboxes in ``SANDBOX_WORKSPACE_STORE=s3`` mode (the tests' shared SeaweedFS),
through the official SDK (issue 37 item 3's last part):

- what E2B code writes anywhere under ``/home/user`` — by file calls, commands and
  ``run_code``, at the top and in subdirectories — survives an idle stop that loses the
  sandbox's cache (the local backend keeps its files at an idle stop, so the test removes
  the conversation's directory, as a pod's ``emptyDir`` goes with it);
- what the SDK's file calls remove or move away is not filled back;
- a sandbox whose conversation the new runtime does not list yet (its files only in the
  store) is found by get, connect and the data plane, and its files are filled back.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import httpx
import pytest
from e2b_code_interpreter import Sandbox
from polling import wait_for

pytestmark = pytest.mark.local_backend

KEY = "e2b_" + "57" * 16
KEY_USER = "e2b-" + hashlib.sha256(KEY.encode()).hexdigest()[:16]  # docs/e2b.md
SESSION = f"/api/v1/sessions/sb-session-{KEY_USER}"


@pytest.fixture(scope="module")
def store_api(start_server, seaweedfs, tmp_path_factory):
    bucket = f"t-e2b-{tmp_path_factory.mktemp('b').name[-6:].lower()}"
    seaweedfs.make_bucket(bucket)
    server = start_server(
        "dev",
        "--data-dir",
        str(tmp_path_factory.mktemp("data")),
        SANDBOX_WORKSPACE_SANDBOX_MOUNT="none",
        SANDBOX_WORKSPACE_SESSION_IDLE_TIMEOUT_SECONDS="1",
        **seaweedfs.env(bucket),
    )
    return server, bucket


def chat_upload(url: str, user: str, cid: str, name: str, data: bytes) -> None:
    """A file the user uploads in the chat, into ``uploads/temparea/`` of ``cid``."""
    with httpx.Client(base_url=url, headers={"X-User-Id": user}, timeout=60) as c:
        up = c.post(
            f"/api/v1/sessions/sb-session-{user}/files/upload",
            files={"file": (name, data)},
            data={"conversation_id": cid, "subdir": "temparea"},
        )
        assert up.status_code == 201, up.text


def _opts(url: str) -> dict:
    return {"api_url": f"{url}/e2b", "sandbox_url": f"{url}/e2b/envd", "api_key": KEY}


def _lose_the_cache(server, conversation: Path, runtime_pids, wait_status) -> None:
    """Wait for the idle stop, then remove the conversation's directory: what a new pod
    of a stopped session has (nothing but the store)."""
    with httpx.Client(base_url=server.url, headers={"X-User-Id": KEY_USER}, timeout=30) as c:
        wait_status(c, SESSION, "stopped")
    session_dir = conversation.parents[1]
    wait_for(lambda: runtime_pids(session_dir) == [], "the idle runtime's process to end")
    shutil.rmtree(conversation)


WRITTEN = {
    "top.txt": "by files.write",
    "sub/dir/deep.txt": "nested by files.write",
    "cmd.txt": "by a command\n",
    "cmd-dir/x.txt": "in a directory a command made\n",
    "tilde.txt": "by ~\n",
    "code/from-code.txt": "by run_code",
}


def test_files_under_home_survive_an_idle_stop_and_the_store_finds_the_sandbox(
    store_api, seaweedfs, runtime_pids, wait_status
):
    # ~15-20 s: three idle stops, each followed by a new runtime (get, connect and the data
    # plane must each find the sandbox with nothing but the store behind them).
    server, bucket = store_api
    opts = _opts(server.url)
    sbx = Sandbox.create(timeout=600, **opts)
    try:
        sbx.files.write("/home/user/top.txt", WRITTEN["top.txt"])
        sbx.files.write("sub/dir/deep.txt", WRITTEN["sub/dir/deep.txt"])
        made = sbx.commands.run(
            "echo 'by a command' > cmd.txt && mkdir -p cmd-dir && "
            "echo 'in a directory a command made' > cmd-dir/x.txt && "
            "echo 'by ~' > ~/tilde.txt && pwd"
        )
        home = Path(made.stdout.strip())
        ran = sbx.run_code(
            "import os\nos.makedirs('code', exist_ok=True)\n"
            "open('code/from-code.txt', 'w').write('by run_code')"
        )
        assert ran.error is None, ran.error
        assert home.name == "outputs" and home.parent.name == f"e2b-{sbx.sandbox_id}"
        # What the SDK's file calls remove or move away stays gone (not filled back).
        sbx.files.write("doomed.txt", "x")
        sbx.files.write("doomed-dir/a.txt", "x")
        sbx.files.write("moved-from.txt", "moved")
        sbx.files.remove("doomed.txt")
        sbx.files.remove("/home/user/doomed-dir")
        sbx.files.rename("moved-from.txt", "moved-to.txt")
        conversation = home.parent

        # get: the new runtime lists nothing yet; the store has the sandbox's files.
        _lose_the_cache(server, conversation, runtime_pids, wait_status)
        assert Sandbox.get_info(sbx.sandbox_id, **opts).sandbox_id == sbx.sandbox_id
        for path, text in WRITTEN.items():
            assert sbx.files.read(f"/home/user/{path}") == text, path
        listed = {e.name for e in sbx.files.list("/home/user")}
        assert {"top.txt", "sub", "cmd.txt", "cmd-dir", "tilde.txt", "code"} <= listed
        assert not {"doomed.txt", "doomed-dir", "moved-from.txt"} & listed
        assert sbx.files.read("moved-to.txt") == "moved"

        # connect, and commands see the files filled back at the same paths.
        _lose_the_cache(server, conversation, runtime_pids, wait_status)
        again = Sandbox.connect(sbx.sandbox_id, **opts)
        assert again.commands.run("cat sub/dir/deep.txt").stdout == WRITTEN["sub/dir/deep.txt"]

        # The data plane alone (the sandbox's access token, no control-plane call).
        _lose_the_cache(server, conversation, runtime_pids, wait_status)
        assert sbx.files.read("code/from-code.txt") == "by run_code"
    finally:
        assert sbx.kill() is True
    prefix = f"workspaces/default/sb-session-{KEY_USER}/e2b-{sbx.sandbox_id}/"
    assert seaweedfs.list_keys(bucket, prefix) == []  # the deletion guarantee, in the store


def test_an_attached_chat_conversation_keeps_the_chats_layout(store_api, seaweedfs):
    """Attaching changes nothing for the chat's files: home is the conversation's own
    directory, the upload is at the chat's relative path, what code writes to outputs/
    is the chat's output, and kill only detaches."""
    server, bucket = store_api
    chat_upload(server.url, KEY_USER, "chat-s3", "sales.csv", b"region,total\n")
    attach = {"sandbox-workspace.conversation": "chat-s3"}
    sbx = Sandbox.create(metadata=attach, **_opts(server.url))
    try:
        assert sbx.files.read("/home/user/uploads/temparea/sales.csv") == "region,total\n"
        assert sbx.commands.run("echo made > outputs/made.txt && pwd").stdout.endswith("/chat-s3\n")
    finally:
        sbx.kill()
    prefix = f"workspaces/default/sb-session-{KEY_USER}/chat-s3/"
    keys = {o.key[len(prefix) :] for o in seaweedfs.list_keys(bucket, prefix)}
    assert {k for k in keys if not k.startswith(".sbw/")} == {
        "uploads/temparea/sales.csv",
        "outputs/made.txt",
    }
