"""An E2B sandbox through the official SDK for a test, and its user's session deleted
after (the key's user: docs/e2b.md), so nothing of the test stays on the server."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator

import httpx
from e2b_code_interpreter import Sandbox


def key_user(key: str) -> str:
    return "e2b-" + hashlib.sha256(key.encode()).hexdigest()[:16]


@contextlib.contextmanager
def e2b_sandbox(url: str, key: str) -> Iterator[Sandbox]:
    sbx = Sandbox.create(api_url=f"{url}/e2b", sandbox_url=f"{url}/e2b/envd", api_key=key)
    try:
        yield sbx
    finally:
        try:
            sbx.kill()
        finally:
            httpx.delete(
                f"{url}/api/v1/sessions/sb-session-{key_user(key)}",
                headers={"X-User-Id": key_user(key)},
                timeout=60,
            )
