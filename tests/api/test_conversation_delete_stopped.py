"""Deleting a conversation starts nothing (seed 000 §4.3: no side effects): a stopped
session stays stopped and its conversation's files are gone all the same; a repeat, and
a deletion in a session that does not exist, are successes."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.local_backend


def test_stopped_session_stays_stopped_and_the_files_go(start_server, runtime_pids):
    user = "del-stopped"
    url = f"/api/v1/sessions/sb-session-{user}"
    headers = {"X-User-Id": user}
    first = start_server("dev", "--data-dir", "data", SANDBOX_WORKSPACE_SANDBOX_MOUNT="none")
    with httpx.Client(base_url=first.url, headers=headers, timeout=30) as client:
        for cid in ("gone", "kept"):
            r = client.post(
                f"{url}/files/upload",
                files={"file": ("a.csv", b"1")},
                data={"conversation_id": cid},
            )
            assert r.status_code == 201, r.text
        gone = Path(r.json()["path"]).parents[3] / "gone"
    first.stop()
    assert gone.is_dir()
    second = start_server(
        "dev", "--data-dir", str(first.workdir / "data"), SANDBOX_WORKSPACE_SANDBOX_MOUNT="none"
    )
    with httpx.Client(base_url=second.url, headers=headers, timeout=30) as client:
        for _ in range(2):  # the repeat is a success too
            r = client.delete(f"{url}/conversations/gone")
            assert r.status_code == 200, r.text
            assert r.json() == {
                "session_id": f"sb-session-{user}",
                "conversation_id": "gone",
                "status": "deleted",
            }
            assert client.get(url).json()["status"] == "stopped"
        assert runtime_pids(second.workdir) == [] == runtime_pids(first.workdir)
        assert not gone.exists()
        # The other conversation, and the upload state the runtime keeps, are intact.
        r = client.get(f"{url}/files", params={"conversation_id": "kept"})
        assert r.json()["files"] == ["a.csv"]
        r = client.get(f"{url}/files", params={"conversation_id": "gone"})
        assert r.json()["files"] == []
    second.stop()  # now rather than at the end of the test session


def test_deleting_in_a_session_that_does_not_exist_creates_none(api, session_url):
    for _ in range(2):
        r = api.delete(f"{session_url}/conversations/c")
        assert r.status_code == 200 and r.json()["status"] == "deleted"
    assert api.get(session_url).status_code == 404


def test_foreign_session_is_still_404(api):
    r = api.delete("/api/v1/sessions/sb-session-someone-else/conversations/c")
    assert r.status_code == 404
