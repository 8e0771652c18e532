"""Small helpers for calling the API in tests."""

from __future__ import annotations

import httpx


def execute(
    api: httpx.Client, session_url: str, code: str, *, cid: str = "c", language="python", **extra
) -> dict:
    """Run code through ``POST {session_url}/execute``; the whole result, after a 200."""
    r = api.post(
        f"{session_url}/execute",
        json={"conversation_id": cid, "language": language, "code": code, **extra},
    )
    assert r.status_code == 200, r.text
    return r.json()


def required_api(start_server, service_token: str, **env: str):
    """A module's ``api`` server in ``required`` auth mode, trusting ``service_token``
    (``X-User-Id``/``X-Tenant-Id`` name the caller), data in its own directory, no
    bubblewrap (reported paths are host paths); ``env`` adds settings."""
    return start_server(
        "api",
        SANDBOX_WORKSPACE_AUTH_MODE="required",
        SANDBOX_WORKSPACE_SERVICE_TOKEN=service_token,
        SANDBOX_WORKSPACE_DATA_DIR="data",
        SANDBOX_WORKSPACE_SANDBOX_MOUNT="none",
        **env,
    )
