"""Session lifecycle on the local backend: create, status, ensure, resume, delete."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import pytest


def test_create_then_running_then_409(api, session_url, user, wait_status):
    r = api.post(
        "/api/v1/sessions",
        json={"user_id": user, "agent_id": "agent-1", "business_domain_id": "bd-1"},
    )
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["session_id"] == f"sb-session-{user}"
    assert body["status"] in ("pending", "running")
    assert (body["agent_id"], body["business_domain_id"]) == ("agent-1", "bd-1")
    assert body["file_upload_config"]["max_file_size_unit"] == "MB"
    # Seed 000 §4.2's CreateSessionResp carries an `info` map.
    assert body["info"] == {
        "workspace_path": body["workspace_path"],
        "user_id": user,
        "agent_id": "agent-1",
        "business_domain_id": "bd-1",
    }
    running = wait_status(api, session_url, "running")
    assert Path(running["workspace_path"]).is_dir()
    again = api.post("/api/v1/sessions", json={})
    assert again.status_code == 409 and again.json()["error"]["code"] == "session_exists"


def test_missing_session_is_404(api, session_url):
    r = api.get(session_url)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    assert api.delete(session_url).status_code == 404


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        pytest.param(
            {"config": {"session_id": "sb-session-someone-else"}},
            403,
            "invalid_session_id",
            id="foreign-session-id",
        ),
        pytest.param({"user_id": "someone-else"}, 403, "user_mismatch", id="foreign-user"),
        pytest.param(
            {"config": {"file_upload_config": {"max_file_size": 0}}},
            422,
            "invalid_request",
            id="zero-size",
        ),
        pytest.param(
            {"config": {"file_upload_config": {"max_file_size_unit": "PB"}}},
            422,
            "invalid_request",
            id="bad-unit",
        ),
        pytest.param(
            {"config": {"file_upload_config": {"allowed_file_types": ["../sh"]}}},
            422,
            "invalid_request",
            id="bad-extension",
        ),
        pytest.param(
            {"config": {"file_upload_config": {"max_file_size": 10, "max_file_size_unit": "GB"}}},
            400,
            "upload_limit_too_high",
            id="over-ceiling",
        ),
        pytest.param({"config": {"ttl": 5}}, 422, "invalid_request", id="ttl-too-short"),
    ],
)
def test_bad_create_requests(api, session_url, body, status, code):
    r = api.post("/api/v1/sessions", json=body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["code"] == code and r.json()["error"]["message"]
    assert api.get(session_url).status_code == 404, "a refused create must create nothing"


def test_malformed_json_is_422_not_500(api):
    r = api.post(
        "/api/v1/sessions", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"


@pytest.mark.local_backend
def test_crashed_runtime_is_reported_and_replaced_with_files_intact(
    api, session_url, dev_server, runtime_pids, wait_status
):
    api.post(
        f"{session_url}/files/upload",
        files={"file": ("keep.csv", b"1,2")},
        data={"conversation_id": "c"},
    )
    session_dir = Path(api.get(session_url).json()["workspace_path"]).parent
    [pid] = runtime_pids(session_dir)
    os.kill(pid, signal.SIGKILL)
    crashed = wait_status(api, session_url, "error")
    assert "exited" in crashed["message"]
    # The next file operation ensures the session: a new runtime, the same files.
    r = api.get(f"{session_url}/files", params={"conversation_id": "c"})
    assert r.status_code == 200 and r.json()["files"] == ["keep.csv"]
    assert api.get(session_url).json()["status"] == "running"
    [new_pid] = runtime_pids(session_dir)
    assert new_pid != pid


@pytest.mark.local_backend
def test_delete_session_stops_runtime_and_removes_files(api, session_url, runtime_pids):
    path = Path(
        api.post(
            f"{session_url}/files/upload",
            files={"file": ("a.csv", b"a")},
            data={"conversation_id": "c"},
        ).json()["path"]
    )
    session_dir = path.parents[4]
    assert runtime_pids(session_dir)
    r = api.delete(session_url)
    assert r.status_code == 200 and r.json() == {
        "session_id": session_url.rsplit("/", 1)[1],
        "deleted": True,
    }
    assert not session_dir.exists()
    assert runtime_pids(session_dir) == []
    assert api.get(session_url).status_code == 404


@pytest.mark.local_backend
def test_restarted_api_finds_sessions_stopped_and_resumes_them(
    start_server, runtime_pids, wait_status
):
    first = start_server("dev", "--data-dir", "data", SANDBOX_WORKSPACE_SANDBOX_MOUNT="none")
    headers = {"X-User-Id": "carol"}
    url = "/api/v1/sessions/sb-session-carol"
    with httpx.Client(base_url=first.url, headers=headers, timeout=30) as api:
        body = api.post(
            f"{url}/files/upload",
            files={"file": ("c.csv", b"carol")},
            data={"conversation_id": "c"},
        ).json()
    assert first.stop() in (0, -signal.SIGINT), first.log()
    assert runtime_pids(first.workdir) == [], "Ctrl-C must stop every runtime"

    second = start_server(
        "dev", "--data-dir", str(first.workdir / "data"), SANDBOX_WORKSPACE_SANDBOX_MOUNT="none"
    )
    with httpx.Client(base_url=second.url, headers=headers, timeout=30) as api:
        assert api.get(url).json()["status"] == "stopped"
        got = api.get(f"{url}/files/c.csv", params={"conversation_id": "c"})
        assert got.status_code == 200 and got.content == b"carol"
        assert api.get(url).json()["status"] == "running"
    assert Path(body["path"]).read_bytes() == b"carol"


def test_api_health_and_metrics(dev_server, api, session_url):
    assert api.get("/healthz").json() == {"status": "ok"}
    assert api.get("/readyz").json()["status"] == "ok"
    api.get(session_url)
    metrics = api.get("/metrics").text
    assert (
        'sandbox_api_requests_total{method="GET",route="/api/v1/sessions/{session_id}"' in metrics
    )
    # Collector pauses stall every stream of the process: they are exported, by generation.
    assert "sandbox_api_gc_pause_seconds_count{generation=" in metrics
