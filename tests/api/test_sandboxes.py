"""POST/GET /api/v1/sandboxes (seed 002's /api/sandbox): actions on one sandbox (a
conversation of the caller) answering {success, output, error, data}."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

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
