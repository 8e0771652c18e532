"""The runtime's own contract, against a real runtime process on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from polling import wait_for


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/stats"),
        ("PUT", "/v1/conversations/c"),
        ("GET", "/v1/conversations/c"),
        ("DELETE", "/v1/conversations/c"),
        ("POST", "/v1/uploads"),
        ("POST", "/v1/uploads/raw"),
        ("GET", "/v1/conversations/c/uploads"),
        ("GET", "/v1/conversations/c/uploads/a.csv"),
        ("DELETE", "/v1/conversations/c/uploads/a.csv"),
        ("PUT", "/v1/conversations/c/outputs/a/b.txt"),
        ("DELETE", "/v1/conversations/c/outputs/a/b.txt"),
    ],
)
def test_every_route_but_health_needs_the_token(runtime, method, path):
    for headers in (
        {},
        {"Authorization": "Bearer not-the-token"},
        {"Authorization": runtime.token},
    ):
        r = httpx.request(method, runtime.server.url + path, headers=headers)
        assert r.status_code == 401, (headers, r.text)
        assert r.json()["error"]["code"] == "unauthorized"
    assert httpx.get(runtime.server.url + "/healthz").status_code == 200


def test_conversation_lifecycle(runtime):
    c = runtime.client
    info = c.put("/v1/conversations/conv-1").json()
    assert info["exists"] is True and info["file_count"] == 0
    assert info["path"] == f"{runtime.root}/conv-1"
    assert info["uploads_path"] == f"{runtime.root}/conv-1/uploads/temparea"
    assert (runtime.root / "conv-1" / "outputs").is_dir()
    runtime.upload("conv-1", "a.csv", b"12345")
    (runtime.root / "conv-1" / "outputs" / "r.txt").write_text("abc")
    info = c.get("/v1/conversations/conv-1").json()
    assert (info["file_count"], info["total_bytes"]) == (2, 8)
    gone = c.delete("/v1/conversations/conv-1").json()
    assert gone == {"conversation_id": "conv-1", "deleted": True, "exists": False}
    assert not (runtime.root / "conv-1").exists()
    again = c.delete("/v1/conversations/conv-1").json()
    assert again["deleted"] is False and again["exists"] is False
    assert c.get("/v1/conversations/conv-1").json()["exists"] is False


def test_stats_report_activity(runtime):
    first = runtime.client.get("/v1/stats").json()
    runtime.upload("c", "x.csv", b"x")
    second = runtime.client.get("/v1/stats").json()
    assert second["active_operations"] == 0
    assert second["conversations"] == 1
    assert datetime.fromisoformat(second["last_activity_at"]) > datetime.fromisoformat(
        first["last_activity_at"]
    )
    assert second["workspace_path"] == str(runtime.root)
    # Reading the stats (what the idle reaper does) is not activity.
    third = runtime.client.get("/v1/stats").json()
    assert third["last_activity_at"] == second["last_activity_at"]


def test_refused_upload_keeps_the_old_file(runtime):
    runtime.upload("c", "keep.csv", b"original")
    r = runtime.upload("c", "keep.csv", b"x" * (1024 * 1024 + 1))
    assert r.status_code == 413
    assert (runtime.root / "c" / "uploads" / "temparea" / "keep.csv").read_bytes() == b"original"
    assert list((runtime.root / ".runtime" / "staging").iterdir()) == []


def test_query_and_form_conversation_must_agree(runtime):
    r = runtime.client.post(
        "/v1/uploads",
        params={"conversation_id": "a"},
        files={"file": ("x.csv", b"x")},
        data={"conversation_id": "b"},
    )
    assert r.status_code == 400 and "disagree" in r.json()["error"]["message"]
    r = runtime.client.post(
        "/v1/uploads", params={"conversation_id": "a"}, files={"file": ("x.csv", b"x")}
    )
    assert r.status_code == 201 and r.json()["conversation_id"] == "a"


def test_two_files_in_one_request_are_refused(runtime):
    r = runtime.client.post(
        "/v1/uploads",
        data={"conversation_id": "c"},
        files=[("file", ("a.csv", b"a")), ("file", ("b.csv", b"b"))],
    )
    assert r.status_code == 400 and "one file per request" in r.json()["error"]["message"]
    assert list((runtime.root / ".runtime" / "staging").iterdir()) == []


def _kernel_pids(root) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if b"kernel_main" in cmdline and cwd.startswith(str(root)):
            pids.append(int(entry))
    return pids


def _wait(predicate, what: str, timeout: float = 20.0):
    return wait_for(predicate, what, timeout)


def test_running_execution_counts_as_activity(runtime):
    gate = runtime.root / "c" / "go"
    code = f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.01)"
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(
            runtime.client.post,
            "/v1/conversations/c/execute",
            json={"language": "python", "code": code, "timeout": 60},
        )
        busy = _wait(
            lambda: (s := runtime.client.get("/v1/stats").json())["active_operations"] and s,
            "the execution to be counted",
        )
        assert busy["active_operations"] == 1
        gate.touch()
        assert future.result().json()["exit_code"] == 0
    assert runtime.client.get("/v1/stats").json()["active_operations"] == 0


def test_killed_runtime_leaves_no_interpreter_behind(runtime):
    runtime.client.post("/v1/conversations/c/execute", json={"language": "python", "code": "1"})
    assert _wait(lambda: _kernel_pids(runtime.root), "the interpreter to run")
    runtime.server.proc.send_signal(signal.SIGKILL)
    runtime.server.proc.wait()
    _wait(lambda: not _kernel_pids(runtime.root), "the interpreter to die with the runtime")


def test_deleting_a_conversation_stops_its_interpreter(runtime):
    runtime.client.post("/v1/conversations/c/execute", json={"language": "python", "code": "1"})
    assert _wait(lambda: _kernel_pids(runtime.root), "the interpreter to run")
    runtime.client.delete("/v1/conversations/c")
    _wait(lambda: not _kernel_pids(runtime.root), "the interpreter to stop")


@pytest.mark.parametrize("runtime_env", [{"SANDBOX_RUNTIME_KERNEL_IDLE_SECONDS": "1"}])
def test_idle_interpreter_is_reaped_and_restarts_on_next_use(runtime):
    c = runtime.client
    first = c.post("/v1/conversations/c/execute", json={"language": "python", "code": "v = 1"})
    assert first.json()["kernel_restarted"] is False  # nothing to lose yet
    _wait(lambda: not _kernel_pids(runtime.root), "the idle interpreter to be reaped")
    again = c.post(
        "/v1/conversations/c/execute", json={"language": "python", "code": "'v' in globals()"}
    ).json()
    assert again["kernel_restarted"] is True
    assert again["results"][0]["data"]["text/plain"] == "False"


@pytest.mark.parametrize("runtime_env", [{"SANDBOX_RUNTIME_MAX_CONCURRENT_EXECUTIONS": "1"}])
def test_execution_slots_are_capped_then_429(runtime):
    """A call past the cap waits for a slot up to its own timeout: it runs when one frees
    in time, else it is 429 (docs/api.md, "Limits")."""
    gate = runtime.root / "a" / "go"
    hold = f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.01)"
    with ThreadPoolExecutor(2) as pool:
        busy = pool.submit(
            runtime.client.post,
            "/v1/conversations/a/execute",
            json={"language": "python", "code": hold, "timeout": 60},
        )
        _wait(
            lambda: runtime.client.get("/v1/stats").json()["active_operations"],
            "the first execution to hold the only slot",
        )
        refused = runtime.client.post(
            "/v1/conversations/b/execute", json={"language": "bash", "code": "true", "timeout": 1}
        )
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "too_many_executions"
        queued = pool.submit(
            runtime.client.post,
            "/v1/conversations/b/execute",
            json={"language": "bash", "code": "echo ran", "timeout": 60},
        )
        gate.touch()
        assert busy.result().json()["exit_code"] == 0
        waited = queued.result()
        assert waited.status_code == 200 and waited.json()["stdout"] == "ran\n", waited.text
    ok = runtime.client.post(
        "/v1/conversations/b/execute", json={"language": "bash", "code": "true"}
    )
    assert ok.json()["exit_code"] == 0


def test_code_wrecking_the_workspace_does_not_break_the_runtime(runtime):
    runtime.upload("victim", "keep.csv", b"1")
    wreck = runtime.client.post(
        "/v1/conversations/c/execute",
        json={"language": "bash", "code": "rm -rf ../* ../.runtime; ls -A .. | wc -l"},
    )
    assert wreck.status_code == 200
    # The runtime rebuilds what it needs: uploads, listings and execution still work.
    assert runtime.upload("c", "new.csv", b"2").status_code == 201
    names = [f["name"] for f in runtime.client.get("/v1/conversations/c/uploads").json()["files"]]
    assert names == ["new.csv"]
    again = runtime.client.post(
        "/v1/conversations/c/execute", json={"language": "python", "code": "print('ok')"}
    )
    assert again.json()["stdout"] == "ok\n"
    assert runtime.client.get("/healthz").status_code == 200


def test_upload_cut_off_by_its_client_is_discarded_quietly(runtime):
    """A client that disconnects mid-upload (the API aborting a refused upload does) leaves
    no staged file and no error traceback in the runtime's log — it is not a fault."""
    import socket
    from urllib.parse import urlsplit

    url = urlsplit(runtime.server.url)
    boundary = "cutoffboundary"
    head = (
        f"--{boundary}\r\n"
        'Content-Disposition: form-data; name="conversation_id"\r\n\r\nconv-cut\r\n'
        f"--{boundary}\r\n"
        'Content-Disposition: form-data; name="file"; filename="cut.csv"\r\n'
        "Content-Type: text/csv\r\n\r\n"
    ).encode()
    declared = len(head) + 100_000
    with socket.create_connection((url.hostname, url.port)) as sock:
        sock.sendall(
            (
                "POST /v1/uploads HTTP/1.1\r\n"
                f"Host: {url.hostname}\r\nAuthorization: Bearer {runtime.token}\r\n"
                f"Content-Type: multipart/form-data; boundary={boundary}\r\n"
                f"Content-Length: {declared}\r\n\r\n"
            ).encode()
            + head
            + b"a,b\n" * 1000
        )
        staging = runtime.root / ".runtime" / "staging"
        deadline = time.monotonic() + 10
        while not any(staging.iterdir()):  # the runtime has started writing it
            assert time.monotonic() < deadline, "the upload never reached staging"
            time.sleep(0.02)
    deadline = time.monotonic() + 10
    while any(staging.iterdir()):
        assert time.monotonic() < deadline, list(staging.iterdir())
        time.sleep(0.02)
    assert runtime.client.get("/v1/conversations/conv-cut/uploads").json()["files"] == []
    assert "Traceback" not in runtime.server.log(), runtime.server.log()


def test_an_output_is_written_back_at_its_path_and_listed(runtime):
    c = runtime.client
    body = os.urandom(300_000)
    r = c.put("/v1/conversations/w/outputs/deep/er/r.bin", content=body)
    assert r.status_code == 200, r.text
    assert r.json()["relative_path"] == "deep/er/r.bin" and r.json()["size"] == len(body)
    assert (runtime.root / "w" / "outputs" / "deep" / "er" / "r.bin").read_bytes() == body
    again = c.put("/v1/conversations/w/outputs/deep/er/r.bin", content=b"new")
    assert again.status_code == 200
    assert (runtime.root / "w" / "outputs" / "deep" / "er" / "r.bin").read_bytes() == b"new"
    listed = c.get("/v1/conversations/w/outputs").json()["files"]
    assert [f["relative_path"] for f in listed] == ["deep/er/r.bin"]
    # Nothing is left in staging, and no upload appeared.
    assert c.get("/v1/conversations/w/uploads").json()["files"] == []
    assert not [p for p in (runtime.root / ".runtime" / "staging").glob("*")]


def test_an_output_write_never_follows_a_link_nor_leaves_outputs(runtime, tmp_path):
    c = runtime.client
    c.put("/v1/conversations/w")
    outputs = runtime.root / "w" / "outputs"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outputs / "link").symlink_to(outside)
    (outputs / "file-link").symlink_to(outside / "target")
    (outputs / "dir").mkdir()
    hostile = {
        "link/x.txt": 400,  # a planted directory link on the way
        # Encoded, so no client normalises them away: the runtime sees the dots.
        "%2e%2e%2fuploads%2ftemparea%2fx.csv": 400,
        "a/%2e%2e/%2e%2e/x": 400,
        "%2e%2e/x": 400,
        "a%5cb": 400,
        "a//b": 400,
        "dir": 409,  # a directory where the file would go
        "/".join(["d"] * 40) + "/x": 400,  # deeper than allowed
    }
    for path, status in hostile.items():
        r = c.put(f"/v1/conversations/w/outputs/{path}", content=b"evil")
        assert r.status_code == status, (path, r.status_code, r.text)
    # A link at the final name is replaced by the file, never written through.
    assert c.put("/v1/conversations/w/outputs/file-link", content=b"ok").status_code == 200
    assert not (outputs / "file-link").is_symlink()
    assert (outputs / "file-link").read_bytes() == b"ok"
    assert list(outside.iterdir()) == []
    assert not (runtime.root / "w" / "uploads" / "temparea" / "x.csv").exists()
    assert not (runtime.root / "x").exists()
    assert not [p for p in (runtime.root / ".runtime" / "staging").glob("*")]


def test_an_output_is_deleted_by_its_path_never_through_a_link(runtime, tmp_path):
    c = runtime.client
    c.put("/v1/conversations/d")
    outputs = runtime.root / "d" / "outputs"
    (outputs / "deep").mkdir()
    (outputs / "deep" / "r.txt").write_text("r")
    outside = tmp_path / "outside-d"
    outside.mkdir()
    (outside / "target").write_text("kept")
    (outputs / "link").symlink_to(outside)
    (outputs / "file-link").symlink_to(outside / "target")
    for path, status in {
        "link/target": 400,  # a directory link on the way is refused
        "%2e%2e/uploads": 400,
        "deep": 409,  # a directory
        "missing.txt": 404,
    }.items():
        r = c.delete(f"/v1/conversations/d/outputs/{path}")
        assert r.status_code == status, (path, r.status_code, r.text)
    assert c.delete("/v1/conversations/d/outputs/deep/r.txt").status_code == 204
    assert not (outputs / "deep" / "r.txt").exists()
    assert c.delete("/v1/conversations/d/outputs/file-link").status_code == 204
    assert not (outputs / "file-link").is_symlink()
    assert (outside / "target").read_text() == "kept"


def test_an_output_write_over_the_size_limit_is_refused(runtime):
    limit = 1048576  # SANDBOX_RUNTIME_MAX_FILE_SIZE_BYTES of the fixture
    r = runtime.client.put("/v1/conversations/w/outputs/big", content=b"x" * (limit + 1))
    assert r.status_code == 413
    assert not (runtime.root / "w" / "outputs" / "big").exists()
