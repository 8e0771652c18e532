"""The review's smaller holes, each attacked through a real API process: malformed run
ids and stream tokens answer 4xx (never 500); downloads by file_id are attachments that
no browser renders; dev mode refuses other Host names (DNS rebinding) and JSON bodies
without a JSON content type (cross-site requests)."""

from __future__ import annotations

import base64
import json
import time
import uuid

import httpx
import pytest
from scripted_llm import Reply, text_reply, tool_reply, tool_results
from sse_stream import Stream

pytestmark = pytest.mark.local_backend

RUN = "run_" + "0" * 32


@pytest.fixture(scope="module")
def redis_api(start_server, scripted_llm_server, chat_env_factory, redis_url):
    env = chat_env_factory(
        scripted_llm_server,
        SANDBOX_WORKSPACE_CHAT_RUN_STORE="redis",
        SANDBOX_WORKSPACE_CHAT_REDIS_URL=redis_url,
    )
    return start_server("dev", "--data-dir", "data", **env)


def waiting_run(llm) -> dict:
    """A chat body whose run waits for an approval (its Redis keys exist meanwhile)."""

    def respond(body: dict) -> Reply:
        if not tool_results(body):
            return tool_reply("bash", {"command": "echo hi"}, call_id="call_ok")
        return text_reply("done")

    llm.responder = respond
    body = {"conversation_id": "c", "query": "hi", "tool_policies": {"bash": "require_approval"}}
    return body


def test_a_malformed_run_id_is_not_found(redis_api, scripted_llm):
    """An existing run's id with a suffix named another key of the run (its lease, a
    string): the store's read failed with WRONGTYPE, a 500."""
    user = f"u-{uuid.uuid4().hex[:8]}"
    body = waiting_run(scripted_llm)
    with (
        httpx.Client(base_url=redis_api.url, headers={"X-User-Id": user}, timeout=60) as c,
        c.stream("POST", "/api/v1/chat", json=body) as run,
    ):
        try:
            Stream(run).until("tool_approval")
            run_id = run.headers["x-run-id"]
            for bad in (f"{run_id}:lease", f"{run_id}:log", "run_x"):
                for method, action in (("GET", "events"), ("POST", "stream-token")):
                    r = c.request(method, f"/api/v1/runs/{bad}/{action}")
                    assert r.status_code == 404, (bad, action, r.text)
        finally:
            c.post(f"/api/v1/runs/{run.headers['x-run-id']}/cancel")
            c.delete(f"/api/v1/sessions/sb-session-{user}")


def test_a_non_ascii_stream_token_is_refused_with_401(redis_api):
    """A well-formed token body with a MAC of non-ASCII characters: hmac.compare_digest
    refused to compare the str (TypeError, a 500)."""
    payload = json.dumps([RUN, "u", int(time.time()) + 60], separators=(",", ":")).encode()
    body = base64.urlsafe_b64encode(payload).rstrip(b"=").decode()
    for mac in ("\u00fc\u00fc", "\u00e9" * 43):
        r = httpx.get(
            f"{redis_api.url}/api/v1/runs/{RUN}/events", params={"token": f"{body}.{mac}"}
        )
        assert r.status_code == 401, r.text


def test_downloads_by_file_id_are_attachments_no_browser_renders(
    tmp_path, start_server, seaweedfs, s3_bucket
):
    """An uploaded HTML file, fetched by file_id (and by name): an attachment, never
    sniffed, and sandboxed should a browser render it anyway — no script in our origin."""
    env = {"SANDBOX_WORKSPACE_SANDBOX_MOUNT": "none", **seaweedfs.env(s3_bucket)}
    server = start_server("dev", "--data-dir", str(tmp_path / "data"), **env)
    user = f"u-{uuid.uuid4().hex[:8]}"
    url = f"/api/v1/sessions/sb-session-{user}"
    limits = {"file_upload_config": {"allowed_file_types": []}}
    with httpx.Client(base_url=server.url, headers={"X-User-Id": user}, timeout=60) as api:
        assert api.post("/api/v1/sessions", json={"config": limits}).status_code == 201
        page = b"<script>alert(sessionStorage.getItem('token'))</script>"
        r = api.post(f"{url}/workspace/c/files", files={"file": ("x.html", page, "text/html")})
        assert r.status_code == 201, r.text
        for path in (f"{url}/workspace/c/files/{r.json()['file_id']}", f"{url}/files/x.html"):
            got = api.get(path, params={"conversation_id": "c"})
            assert got.status_code == 200 and got.content == page
            assert got.headers["content-disposition"].startswith("attachment;"), path
            assert got.headers["x-content-type-options"] == "nosniff"
            assert got.headers["content-security-policy"] == "sandbox"
        api.delete(url)


def test_dev_mode_refuses_other_hosts_and_json_without_its_type(dev_server):
    """DNS rebinding: a page of evil.example whose name now resolves to 127.0.0.1 sends
    Host: evil.example — refused. A cross-site form or typeless fetch sends JSON without
    `application/json` (a "simple" request, no preflight) — refused."""
    base = dev_server.url
    port = base.rsplit(":", 1)[1]
    r = httpx.get(
        f"{base}/api/v1/sessions/sb-session-dev", headers={"Host": f"evil.example:{port}"}
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_host", r.text
    for host in (f"localhost:{port}", f"127.0.0.1:{port}"):
        assert httpx.get(f"{base}/healthz", headers={"Host": host}).status_code == 200
    body = b'{"conversation_id": "c", "language": "python", "code": "1"}'
    url = f"{base}/api/v1/sessions/sb-session-dev/execute"
    for content_type in (None, "text/plain", "application/x-www-form-urlencoded"):
        headers = {"X-User-Id": "dev", **({"Content-Type": content_type} if content_type else {})}
        r = httpx.post(url, content=body, headers=headers, timeout=60)
        assert r.status_code == 415, (content_type, r.status_code, r.text)
