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
