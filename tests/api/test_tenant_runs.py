"""Runs are the session's — tenant and user — on every replica (security review H6): where
user ids repeat across tenants, another tenant's user of the same id can neither find,
replay, approve, cancel nor stream a run, nor reach it through the chat index; the
owner, on either replica, can (also with a stream token, which carries the tenant).
Two ``dev`` API processes sharing a Redis-protocol run store (ui_script's model: ``run
bash`` waits for an approval)."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest
from ui_script import ui_replicas

__all__ = ["ui_replicas"]  # the fixture

pytestmark = pytest.mark.local_backend


def client(server, user: str, tenant: str) -> httpx.Client:
    headers = {"X-User-Id": user, "X-Tenant-Id": tenant}
    return httpx.Client(base_url=server.url, headers=headers, timeout=60)


def ask(c: httpx.Client, chat_id: str, text: str) -> httpx.Response:
    message = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": text}]}
    body = {"id": chat_id, "messages": [message], "conversation_id": "c"}
    return c.post("/api/v1/ui/chat", json=body)


def chunks(r: httpx.Response) -> list[dict]:
    assert r.status_code == 200, r.text
    lines = [line[6:] for line in r.text.split("\n") if line.startswith("data: ")]
    return [json.loads(line) for line in lines[:-1]]


def test_a_user_id_repeated_in_another_tenant_reaches_none_of_the_runs(ui_replicas):
    a, b = ui_replicas
    user = f"u-{uuid.uuid4().hex[:8]}"  # the same id in both tenants
    acme_a, acme_b = client(a, user, "acme"), client(b, user, "acme")
    globex_b = client(b, user, "globex")
    default_b = httpx.Client(base_url=b.url, headers={"X-User-Id": user}, timeout=60)
    try:
        asked = ask(acme_a, "chat-1", "run bash")  # waits for its approval
        run_id = asked.headers["x-run-id"]
        call = next(c for c in chunks(asked) if c["type"] == "tool-approval-request")
        for other in (globex_b, default_b):
            assert other.get("/api/v1/ui/chat/chat-1/stream").status_code == 204
            for method, path, body in (
                ("GET", f"/api/v1/runs/{run_id}/events", None),
                ("POST", f"/api/v1/runs/{run_id}/stream-token", None),
                ("POST", f"/api/v1/runs/{run_id}/cancel", None),
                ("POST", f"/api/v1/runs/{run_id}/approvals",
                 {"tool_call_id": call["toolCallId"], "approved": True}),
            ):  # fmt: skip
                r = other.request(method, path, json=body)
                assert r.status_code == 404, (method, path, r.text)
        # The owner, on the other replica: the chat resumes, a stream token reads it.
        assert chunks(acme_b.get("/api/v1/ui/chat/chat-1/stream")) == chunks(asked)
        token = acme_b.post(f"/api/v1/runs/{run_id}/stream-token").json()
        with httpx.stream("GET", b.url + token["events_url"], timeout=30) as r:
            assert r.status_code == 200  # the token's caller is acme's user, not default's
        r = acme_b.post(f"/api/v1/runs/{run_id}/cancel")
        assert r.status_code == 200 and r.json()["status"] == "cancelling"
    finally:
        for c in (acme_a, acme_b, globex_b, default_b):
            c.close()
