"""A conversation's scratch ($HOME = $TMPDIR) goes with the conversation even when the
runtime that made it was killed (SIGKILL: the OOM killer, a crash): deleting the
conversation or the session through the API removes what its code put there, whether
the session's runtime was started again since or is still down (DESIGN.md, "deleted
with the conversation"; runtime/scratch.py)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import pytest
from api_calls import execute as run
from runtime_ops import execute, restart

pytestmark = pytest.mark.local_backend

_WRITE = (
    "import os\n"
    "p = os.path.join(os.environ['TMPDIR'], 'pip-cache', 'user-data.bin')\n"
    "os.makedirs(os.path.dirname(p))\n"
    "open(p, 'wb').write(b'private')\n"
    "p"
)


def _write_scratch(api: httpx.Client, session_url: str, cid: str) -> Path:
    out = run(api, session_url, _WRITE, cid=cid)
    path = Path(out["results"][0]["data"]["text/plain"].strip("'"))
    assert path.read_bytes() == b"private"
    return path


def _kill_runtime(api, session_url, runtime_pids, wait_status) -> None:
    workspace = Path(api.get(session_url).json()["workspace_path"])
    [pid] = runtime_pids(workspace.parent)
    os.kill(pid, signal.SIGKILL)
    wait_status(api, session_url, "error")


def test_conversation_deleted_after_a_restart_takes_the_killed_runtimes_scratch(
    api, session_url, runtime_pids, wait_status
):
    gone = _write_scratch(api, session_url, "c")
    _kill_runtime(api, session_url, runtime_pids, wait_status)
    # The next use starts the session's runtime again, with a scratch of its own.
    again = run(api, session_url, "import os\nos.environ['TMPDIR']", cid="other")
    assert again["exit_code"] == 0
    assert not again["results"][0]["data"]["text/plain"].startswith(f"'{gone.parents[2]}")
    r = api.delete(f"{session_url}/conversations/c")
    assert r.status_code == 200, r.text
    assert not gone.exists(), "the conversation's scratch outlived it"
    assert not gone.parents[2].exists(), "the killed runtime's scratch root is left behind"


def test_conversation_deleted_while_the_killed_runtime_is_down_takes_its_scratch(
    api, session_url, runtime_pids, wait_status
):
    gone = _write_scratch(api, session_url, "c")
    _kill_runtime(api, session_url, runtime_pids, wait_status)
    r = api.delete(f"{session_url}/conversations/c")
    assert r.status_code == 200, r.text
    assert api.get(session_url).json()["status"] in ("stopped", "error")  # nothing started
    assert not gone.exists(), "the conversation's scratch outlived it"


@pytest.mark.parametrize("restarted", [False, True], ids=["down", "restarted"])
def test_session_deleted_after_its_runtime_was_killed_takes_its_scratch(
    api, session_url, runtime_pids, wait_status, restarted
):
    gone = _write_scratch(api, session_url, "c")
    _kill_runtime(api, session_url, runtime_pids, wait_status)
    if restarted:
        assert run(api, session_url, "1", cid="other")["exit_code"] == 0
    assert api.delete(session_url).status_code in (200, 204)
    assert not gone.exists(), "the session's scratch outlived it"
    assert not gone.parents[2].exists(), "the killed runtime's scratch root is left behind"


def _scratch_of(runtime, cid: str) -> Path:
    out = execute(runtime, cid, _WRITE, "python")
    path = Path(out["results"][0]["data"]["text/plain"].strip("'"))
    assert path.read_bytes() == b"private"
    return path


def test_a_runtime_started_again_removes_what_the_killed_one_left(runtime):
    gone = _scratch_of(runtime, "c")
    restart(runtime, signal.SIGKILL)  # no aclose: the root and the file stay behind...
    assert execute(runtime, "c", "echo ok")["stdout"] == "ok\n"
    assert not gone.parents[2].exists()  # ...until the next start on this root
    r = runtime.client.delete("/v1/conversations/c")
    assert r.status_code == 200 and not gone.exists()


def test_a_clean_stop_removes_its_scratch_root_and_its_record(runtime):
    root = _scratch_of(runtime, "c").parents[2]
    runtime.server.stop(signal.SIGTERM)
    assert not root.exists()
    assert (runtime.root / ".runtime" / "scratch").read_text() == "[]"
