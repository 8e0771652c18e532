"""The local backend stops an idle runtime as the operator stops an idle pod, and seed
000 §3.2's own client (its Go ported literally) recovers the session unchanged, files
kept. The idle timeout is ``SANDBOX_WORKSPACE_SESSION_IDLE_TIMEOUT_SECONDS`` on both
backends; the rule (``runtime/idleness.py``) is the operator's: an operation in flight is
never idle. The kubernetes backend's idle stop is the cluster tier's
(``tests/cluster/test_api_on_kubernetes.py::test_seed_client_recovers_a_session_stopped_for_idleness``).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest
from polling import wait_for
from seed_client import SeedClient, assert_recovered

pytestmark = pytest.mark.local_backend

IDLE_SECONDS = "1"


@pytest.fixture
def idle_api(start_server):
    server = start_server(
        "dev",
        SANDBOX_WORKSPACE_SANDBOX_MOUNT="none",
        SANDBOX_WORKSPACE_SESSION_IDLE_TIMEOUT_SECONDS=IDLE_SECONDS,
    )
    yield server
    server.stop()


def _client(server, user: str) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"X-User-Id": user}, timeout=30)


def _upload(client: httpx.Client, session_url: str, name: str, data: bytes) -> None:
    r = client.post(
        f"{session_url}/files/upload", files={"file": (name, data)}, data={"conversation_id": "c"}
    )
    assert r.status_code == 201, r.text


def test_the_seed_client_recovers_a_session_stopped_for_idleness(
    idle_api, runtime_pids, wait_status
):
    user = "idle-seed"
    session_url = f"/api/v1/sessions/sb-session-{user}"
    with _client(idle_api, user) as client:
        _upload(client, session_url, "keep.csv", b"1,2\n")
        session_dir = Path(client.get(session_url).json()["workspace_path"]).parent
        assert runtime_pids(session_dir), "the upload started a runtime"

        wait_status(client, session_url, "stopped")
        wait_for(lambda: runtime_pids(session_dir) == [], "the idle runtime's process to end")

        seed = SeedClient(client, user)
        assert seed.ensure(f"sb-session-{user}") == f"sb-session-{user}"
        assert_recovered(seed, "stopped")
        r = client.get(f"{session_url}/files", params={"conversation_id": "c"})
        assert r.status_code == 200 and r.json()["files"] == ["keep.csv"]
        download = client.get(f"{session_url}/files/keep.csv", params={"conversation_id": "c"})
        assert download.status_code == 200 and download.content == b"1,2\n"


def test_an_execution_longer_than_the_idle_timeout_is_not_stopped(
    idle_api, runtime_pids, wait_status
):
    """Four idle timeouts long, and checked every quarter of one: the session reads
    ``running`` throughout. (Without the rule a stop still lets the request finish — the
    runtime drains on SIGTERM — so the status seen during it is what tells.)"""
    user = "idle-busy"
    session_url = f"/api/v1/sessions/sb-session-{user}"
    with _client(idle_api, user) as client, _client(idle_api, user) as watcher:
        assert client.post("/api/v1/sessions", json={}).status_code == 201
        body = wait_status(client, session_url, "running")
        [pid] = runtime_pids(Path(body["workspace_path"]).parent)
        seen: list[str] = []
        executing = threading.Event()
        executing.set()

        def watch() -> None:
            while executing.is_set():
                status = watcher.get(session_url).json()["status"]
                if executing.is_set():  # answered while the execution still ran
                    seen.append(status)
                time.sleep(0.05)

        thread = threading.Thread(target=watch)
        thread.start()
        try:
            r = client.post(
                f"{session_url}/execute",
                json={"conversation_id": "c", "language": "bash", "code": "sleep 4; echo done"},
            )
        finally:
            executing.clear()
            thread.join()
        assert r.status_code == 200, r.text
        assert r.json()["stdout"].strip() == "done"
        assert seen and set(seen) == {"running"}, seen
        assert pid in runtime_pids(Path(body["workspace_path"]).parent), "the same runtime"
