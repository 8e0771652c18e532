"""CORS: an allow-list setting; preflights and answers (errors included) carry the headers
a browser needs for allowed origins only; without the setting, no CORS headers at all."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.local_backend

ORIGIN = "https://app.example.com"


@pytest.fixture(scope="module")
def cors_server(start_server):
    return start_server(
        "dev",
        "--data-dir",
        "data",
        SANDBOX_WORKSPACE_SANDBOX_MOUNT="none",
        SANDBOX_WORKSPACE_CORS_ALLOW_ORIGINS=f'["{ORIGIN}"]',
    )


def preflight(url: str, origin: str, headers: str = "conversation_id, x-user-id") -> httpx.Response:
    return httpx.options(
        url,
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": "GET",
            "Access-Control-Request-Headers": headers,
        },
        timeout=30,
    )


def test_preflight_from_an_allowed_origin(cors_server):
    r = preflight(f"{cors_server.url}/api/v1/sessions/sb-session-u/files", ORIGIN)
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == ORIGIN
    allowed = {h.strip().lower() for h in r.headers["access-control-allow-headers"].split(",")}
    assert {"conversation_id", "x-user-id", "authorization", "last-event-id"} <= allowed
    assert "GET" in r.headers["access-control-allow-methods"]


def test_preflight_from_another_origin_is_refused(cors_server):
    r = preflight(f"{cors_server.url}/api/v1/sessions/sb-session-u/files", "https://evil.example")
    assert r.status_code == 400
    assert "access-control-allow-origin" not in r.headers
    # The API's error model, like every other refusal, saying what was refused.
    error = r.json()["error"]
    assert error["code"] == "cors_refused" and "origin" in error["message"], error


def test_preflight_of_every_route_a_browser_frontend_calls(cors_server):
    """PATCH (update_workspace), a tenant's X-Tenant-Id and W3C traceparent are allowed;
    X-File-Version (download_workspace_file) is readable."""
    r = httpx.options(
        f"{cors_server.url}/api/v1/sessions/sb-session-u/workspace/c1",
        headers={
            "Origin": ORIGIN,
            "Access-Control-Request-Method": "PATCH",
            "Access-Control-Request-Headers": "x-tenant-id, traceparent, content-type",
        },
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert "PATCH" in r.headers["access-control-allow-methods"]
    r = httpx.get(f"{cors_server.url}/healthz", headers={"Origin": ORIGIN})
    assert "x-file-version" in r.headers["access-control-expose-headers"].lower()


def test_answers_and_errors_carry_cors_headers(cors_server):
    headers = {"Origin": ORIGIN, "X-User-Id": "cors-user"}
    r = httpx.get(f"{cors_server.url}/api/v1/sessions/sb-session-cors-user", headers=headers)
    assert r.status_code == 404  # no session yet: the browser must still see this answer
    assert r.headers["access-control-allow-origin"] == ORIGIN
    r = httpx.get(f"{cors_server.url}/healthz", headers=headers)
    assert r.headers["access-control-allow-origin"] == ORIGIN
    exposed = r.headers["access-control-expose-headers"].lower()
    assert "x-run-id" in exposed and "retry-after" in exposed


def test_no_setting_no_cors_headers(dev_server):
    r = preflight(f"{dev_server.url}/api/v1/sessions/sb-session-u/files", ORIGIN)
    assert "access-control-allow-origin" not in r.headers
    assert r.status_code == 204 and "GET" in r.headers["allow"]  # a plain OPTIONS answer
