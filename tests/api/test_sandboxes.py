"""POST/GET /api/v1/sandboxes (seed 002's /api/sandbox): actions on one sandbox (a
conversation of the caller) answering {success, output, error, data}."""

from __future__ import annotations

import json
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from api_calls import execute
from hostile_code import HOLD_THE_CEILING

from sandbox_workspace.runtime import landlock

TABLE = {"rows": [{"a": 1}]}


def act(api: httpx.Client, action: str, sid: str = "sb1", **body) -> httpx.Response:
    return api.post("/api/v1/sandboxes", json={"action": action, "session_id": sid, **body})


def ok(response: httpx.Response) -> dict:
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == {"success", "output", "error", "data"}
    assert body["success"] is True, body
    return body


def test_start_exec_read_stop_status(api):
    started = ok(act(api, "start", data=TABLE))
    assert started["data"]["readonly"] is False
    assert started["data"]["path"].endswith("/sb1/data.json")
    out = ok(
        act(
            api,
            "exec",
            command="python3 -c \"import json; d=json.load(open('data.json')); "
            "d['rows'].append({'a': 2}); json.dump(d, open('data.json','w'))\" && echo hi",
        )
    )
    assert out["output"] == "hi\n" and out["data"]["exit_code"] == 0
    assert ok(act(api, "read"))["data"] == {"rows": [{"a": 1}, {"a": 2}]}
    status = ok(api.get("/api/v1/sandboxes", params={"session_id": "sb1"}))
    assert status["data"]["status"] == "running" and status["data"]["has_data"] is True
    assert ok(act(api, "status"))["data"] == status["data"]
    listing = ok(api.get("/api/v1/sandboxes"))["data"]
    assert {"session_id": "sb1"} in listing["sandboxes"]
    # stop: a command still running is killed (with its whole tree); the files stay.
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(act, api, "exec", command="echo begun > outputs/s; sleep 60")
        deadline = time.monotonic() + 20
        while "begun" not in act(api, "exec", command="cat outputs/s 2>/dev/null").text:
            assert time.monotonic() < deadline, "the command did not start"
            time.sleep(0.05)
        started = time.monotonic()
        ok(act(api, "stop"))
        killed = running.result(timeout=30).json()
    assert time.monotonic() - started < 10
    assert killed["success"] is False and "ConversationStopped" in killed["error"], killed
    assert ok(act(api, "read"))["data"]["rows"][-1] == {"a": 2}


def test_failed_command_is_success_false_with_stderr(api):
    ok(act(api, "start"))
    r = act(api, "exec", command="echo out; echo err >&2; exit 3")
    body = r.json()
    assert r.status_code == 200 and body["success"] is False
    assert (body["output"], body["error"], body["data"]["exit_code"]) == ("out\n", "err\n", 3)


def test_read_invalid_json_and_missing_data(api):
    ok(act(api, "start"))
    r = act(api, "read")
    assert r.status_code == 404 and r.json()["data"] == {"code": "data_not_found"}
    ok(act(api, "exec", command="echo '{' > data.json"))
    body = act(api, "read").json()
    assert body["success"] is False and "not valid JSON" in body["error"]


@pytest.mark.skipif(not landlock.abi_version(), reason="no Landlock here")
def test_readonly_sandbox_refuses_changes_to_data_json(api):
    ok(act(api, "start", data=TABLE, readonly=True))
    r = act(api, "exec", command="echo '{}' > data.json")
    assert r.json()["success"] is False and "Permission denied" in r.json()["error"]
    r = act(api, "exec", command="rm -f .sandbox.json data.json")
    assert r.json()["success"] is False
    assert ok(act(api, "read"))["data"] == TABLE
    assert ok(act(api, "status"))["data"]["readonly"] is True
    assert ok(act(api, "exec", command="echo x > outputs/x && cat outputs/x"))["output"] == "x\n"


def test_another_users_sandbox_is_404(api, dev_server):
    ok(act(api, "start", data=TABLE))
    other = f"u-{uuid.uuid4().hex[:10]}"
    with httpx.Client(base_url=dev_server.url, headers={"X-User-Id": other}, timeout=60) as c:
        for action in ("exec", "read", "stop", "status"):
            r = act(c, action, command="cat data.json")
            assert r.status_code == 404, (action, r.text)
            body = r.json()
            assert body["success"] is False and body["data"] == {"code": "sandbox_not_found"}
        r = c.get("/api/v1/sandboxes", params={"session_id": "sb1"})
        assert r.status_code == 404 and r.json()["success"] is False
        c.delete(f"/api/v1/sessions/sb-session-{other}")


def test_unstarted_sandbox_is_404_and_not_created(api, user):
    ok(act(api, "start", sid="real"))
    r = act(api, "exec", sid="never", command="true")
    assert r.status_code == 404 and r.json()["data"]["code"] == "sandbox_not_found"
    listing = ok(api.get("/api/v1/sandboxes"))["data"]["sandboxes"]
    assert {"session_id": "never"} not in listing


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"action": "fly", "session_id": "x"}, 422),
        ({"action": "exec", "session_id": "x"}, 422),
        ({"action": "exec", "session_id": "x", "command": "  "}, 422),
        ({"action": "start", "session_id": "../x"}, 400),
        ({"action": "start"}, 422),
        ({"action": "start", "session_id": "x", "readonly": "yes"}, 422),
    ],
)
def test_malformed_requests(api, body, status):
    r = api.post("/api/v1/sandboxes", json=body)
    assert r.status_code == status, r.text
    assert "code" in r.json()["error"]


def test_in_store_mode_a_sandbox_is_written_back_and_comes_back(
    tmp_path, start_server, seaweedfs, s3_bucket
):
    """SANDBOX_WORKSPACE_STORE=s3 (a real SeaweedFS): what ``start`` and ``exec`` write —
    data.json and the marker (mirrored under outputs/.sandbox/), an output — is in the
    bucket when they answer; an API whose data directory is gone reads it all back."""
    import asyncio
    import shutil

    from sandbox_workspace.store import S3Store
    from sandbox_workspace.store.layout import Layout, Scope
    from sandbox_workspace.store.metadata import Metadata

    user = f"store-{uuid.uuid4().hex[:8]}"

    def stored() -> dict[str, bytes]:
        async def read():
            store = S3Store(seaweedfs.settings(s3_bucket))
            layout, scope = Layout(), Scope("default", f"sb-session-{user}")
            manifest = await Metadata(store, layout).get(scope, "sb1")
            out = {}
            for f in manifest.files if manifest else []:
                if f.active:
                    got, _ = await store.read(layout.file(scope, "sb1", f.file_path))
                    out[f.file_path] = got
            await store.aclose()
            return out

        return asyncio.run(read())

    data = tmp_path / "data"
    env = {"SANDBOX_WORKSPACE_SANDBOX_MOUNT": "none", **seaweedfs.env(s3_bucket)}
    server = start_server("dev", "--data-dir", str(data), **env)
    with httpx.Client(base_url=server.url, headers={"X-User-Id": user}, timeout=60) as api:
        ok(act(api, "start", data=TABLE))
        assert json.loads(stored()["outputs/.sandbox/data.json"]) == TABLE
        edit = (
            "python3 -c \"import json; d=json.load(open('data.json')); "
            "d['rows'].append({'a': 2}); json.dump(d, open('data.json','w'))\" "
            "&& echo made > outputs/r.txt"
        )
        ok(act(api, "exec", command=edit))
    edited = {"rows": [{"a": 1}, {"a": 2}]}
    files = stored()
    assert json.loads(files["outputs/.sandbox/data.json"]) == edited
    assert json.loads(files["outputs/.sandbox/.sandbox.json"]) == {"readonly": False}
    assert files["outputs/r.txt"] == b"made\n"

    server.stop()
    shutil.rmtree(data)
    server = start_server("dev", "--data-dir", str(data), **env)
    with httpx.Client(base_url=server.url, headers={"X-User-Id": user}, timeout=60) as api:
        assert ok(act(api, "read"))["data"] == edited
        assert ok(act(api, "exec", command="cat outputs/r.txt"))["output"] == "made\n"
        assert ok(act(api, "status"))["data"]["has_data"] is True


def test_a_readonly_sandbox_mirror_is_rewritten_from_the_protected_file(
    start_server, seaweedfs, s3_bucket
):
    """s3 mode: code of a readonly sandbox may change the mirror under outputs/ (not
    protected), never what it holds once the exec has answered: the mirror is copied
    again from the read-only data.json — and a link planted there is replaced, not
    written through."""
    env = {"SANDBOX_WORKSPACE_SANDBOX_MOUNT": "none", **seaweedfs.env(s3_bucket)}
    server = start_server("dev", **env)
    user = f"ro-{uuid.uuid4().hex[:8]}"
    with httpx.Client(base_url=server.url, headers={"X-User-Id": user}, timeout=60) as api:
        ok(act(api, "start", data=TABLE, readonly=True))
        tamper = (
            "echo '{\"rows\": []}' > outputs/.sandbox/data.json; rm -f "
            "outputs/.sandbox/.sandbox.json; ln -s ../../data.json outputs/.sandbox/.sandbox.json"
        )
        act(api, "exec", command=tamper)
        check = (
            "cat outputs/.sandbox/data.json; "
            "test -L outputs/.sandbox/.sandbox.json && echo link; true"
        )
        out = ok(act(api, "exec", command=check))["output"]
        assert json.loads(out) == TABLE
        assert ok(act(api, "read"))["data"] == TABLE


def test_local_mode_keeps_no_mirror(api, session_url):
    """Local mode: data.json and the marker live on the session's volume, so nothing is
    mirrored under outputs/ (no second command per exec) — and a marker that code puts
    where s3 mode's mirror would be does not make a sandbox of a conversation."""
    ok(act(api, "start", data=TABLE, readonly=True))
    ok(act(api, "exec", command="echo hi > outputs/r.txt"))
    assert ok(act(api, "exec", command="ls -A outputs"))["output"].split() == ["r.txt"]
    assert ok(act(api, "read"))["data"] == TABLE

    plant = (
        "mkdir -p outputs/.sandbox && echo '{\"readonly\": false}' > outputs/.sandbox/.sandbox.json"
    )
    execute(api, session_url, plant, cid="sb-planted", language="bash")
    r = act(api, "exec", "sb-planted", command="true")
    assert r.status_code == 404, r.text
    assert r.json()["data"] == {"code": "sandbox_not_found"}


@pytest.mark.skipif(
    os.geteuid() == 0 and not os.access("/sys/fs/cgroup/pids", os.W_OK),
    reason="root without a writable pids cgroup: code has no process ceiling to fill here",
)
def test_stop_works_when_code_filled_the_process_ceiling(api):
    """A fork bomb (here: sleepers up to the ceiling) leaves no room for any command, so
    stop must not need one: it kills first, and the sandbox works again afterwards."""
    ok(act(api, "start"))
    with ThreadPoolExecutor(1) as pool:
        filling = pool.submit(act, api, "exec", command=HOLD_THE_CEILING, timeout=300)
        deadline = time.monotonic() + 60
        while act(api, "exec", command="true").json()["success"]:
            ended = filling.result().json() if filling.done() else "still running"
            assert time.monotonic() < deadline, f"the ceiling was never reached; filler: {ended}"
            time.sleep(0.1)
        ok(act(api, "stop"))
        filling.result(timeout=30)
    assert ok(act(api, "exec", command="echo back"))["output"] == "back\n"
