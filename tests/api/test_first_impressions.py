"""What a newcomer meets on `sandbox-workspace dev` before reading any code (issue 41):
the banner's command works, `/` leads somewhere, the API docs load with no network, each
request is logged, overridden settings are named, answers end with a newline, and a bad
setting or a busy port is one line, not a traceback."""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys

import httpx
import pytest
from polling import wait_for

pytestmark = pytest.mark.local_backend


def test_the_banners_try_command_works_on_a_fresh_start(dev_server):
    line = wait_for(
        lambda: next((x for x in dev_server.log().splitlines() if "try:" in x), None),
        "the banner",
    )
    command = line.split("try:", 1)[1].strip()
    assert dev_server.url in command  # the real port, also when started with --port 0
    argv = shlex.split(command)
    assert argv[0] == "curl"
    argv += ["-w", "\n%{http_code}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    body, _, status = done.stdout.rpartition("\n")
    assert status == "200", done.stdout
    assert json.loads(body)["files"] == []
    assert f"page:   {dev_server.url}/ui/" in dev_server.log()


def test_root_leads_to_the_page_or_the_docs(dev_server, start_server):
    r = httpx.get(f"{dev_server.url}/", timeout=30)
    assert r.status_code == 307 and r.headers["location"] == "/ui/"
    no_page = start_server(
        "dev", "--data-dir", "data", SANDBOX_WORKSPACE_SANDBOX_MOUNT="none",
        SANDBOX_WORKSPACE_WEB_UI="false",
    )  # fmt: skip
    r = httpx.get(f"{no_page.url}/", timeout=30)
    assert r.status_code == 307 and r.headers["location"] == "/docs"


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_api_docs_load_everything_from_the_api_itself(dev_server, page):
    html = httpx.get(dev_server.url + page, timeout=30).text
    sources = re.findall(r'(?:src|href)\s*[=:]\s*["\']([^"\']+)["\']', html)
    assert sources, html
    external = [s for s in sources if re.match(r"(https?:)?//", s)]
    assert not external, f"{page} needs the network for {external}"
    for source in sources:
        r = httpx.get(dev_server.url + source, timeout=30)
        assert r.status_code == 200 and len(r.content) > 1000, source


def test_answers_end_with_a_newline(api, session_url):
    assert httpx.get(api.base_url.join("/healthz")).content.endswith(b"}\n")
    missing = api.get(session_url)
    assert missing.status_code == 404 and missing.content.endswith(b"}\n")
    created = api.post("/api/v1/sessions", json={})
    assert created.status_code == 201 and created.content.endswith(b"}\n")


def test_dev_logs_each_request_and_names_what_it_overrides(start_server):
    server = start_server(
        "dev", "--data-dir", "data", SANDBOX_WORKSPACE_SANDBOX_MOUNT="none",
        SANDBOX_WORKSPACE_AUTH_MODE="required", SANDBOX_WORKSPACE_LOG_FORMAT="json",
    )  # fmt: skip
    httpx.get(f"{server.url}/healthz?from=newcomer", timeout=30)
    log = wait_for(
        lambda: server.log() if "/healthz?from=newcomer" in server.log() else None,
        "the request's log line",
    )
    assert "ignoring SANDBOX_WORKSPACE_AUTH_MODE=required" in log
    [access] = [x for x in log.splitlines() if "/healthz?from=newcomer" in x]
    assert json.loads(access)["logger"] == "uvicorn.access"  # LOG_FORMAT=json is honoured


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_")}
    return subprocess.run(
        [sys.executable, "-m", "sandbox_workspace", *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("SANDBOX_WORKSPACE_CORS_ALLOW_ORIGINS", "http://localhost:3000"),
        ("SANDBOX_WORKSPACE_FILE_UPLOAD__ALLOWED_FILE_TYPES", "csv,txt"),
        ("SANDBOX_WORKSPACE_TOOL_POLICIES", "{bad"),
    ],
)
def test_a_setting_that_is_not_json_is_one_line(tmp_path, name, value):
    done = _cli("dev", "--port", "0", "--data-dir", str(tmp_path), **{name: value})
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert f"invalid setting {name}: not valid JSON" in line and "Traceback" not in line


def test_a_busy_port_is_one_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _cli("dev", "--port", str(port), "--data-dir", str(tmp_path))
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert line == (
        f"sandbox-workspace: cannot listen on http://127.0.0.1:{port}: the port is in use "
        "(another server? stop it, or choose another port: --port, or PORT= with make dev)"
    )
