"""Bad input to /ui/chat, /ag-ui and /ui/: a clear 4xx that says what to change, never a 5xx
(plain HTTP, no npm client needed); and the page's on/off setting."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest

from sandbox_workspace.api.app import create_app
from sandbox_workspace.api.settings import ApiSettings


@pytest.fixture
def client(ui_server):
    user = f"err-{uuid.uuid4().hex[:8]}"
    with httpx.Client(base_url=ui_server.url, headers={"X-User-Id": user}, timeout=30) as c:
        yield c
    httpx.delete(f"{ui_server.url}/api/v1/sessions/sb-session-{user}", headers={"X-User-Id": user})


def user_message(text: str) -> dict:
    return {"id": "u1", "role": "user", "parts": [{"type": "text", "text": text}]}


def answered(approval_id: str, approved: bool = True) -> dict:
    part = {
        "type": "tool-bash",
        "toolCallId": "call_bash",
        "state": "approval-responded",
        "input": {},
        "approval": {"id": approval_id, "approved": approved},
    }
    return {"id": "a1", "role": "assistant", "parts": [part]}


def ui_chat(client, *messages, **extra):
    body = {"id": "chat", "messages": list(messages), "conversation_id": "c", **extra}
    return client.post("/api/v1/ui/chat", json=body)


def chunks(response: httpx.Response) -> list[dict]:
    lines = [ln[6:] for ln in response.text.split("\n") if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(ln) for ln in lines[:-1]]


@pytest.mark.parametrize(
    ("messages", "extra", "status", "code"),
    [
        pytest.param([], {}, 422, "invalid_request", id="no-messages"),
        pytest.param([user_message("  ")], {}, 400, "invalid_messages", id="blank-text"),
        pytest.param(
            [{"id": "a", "role": "assistant", "parts": [{"type": "text", "text": "hi"}]}],
            {},
            400,
            "nothing_to_continue",
            id="assistant-last-without-approval",
        ),
        pytest.param([answered("forged")], {}, 400, "invalid_approval_id", id="forged-approval"),
        pytest.param([answered("run_00000000:call_bash")], {}, 404, "not_found", id="unknown-run"),
        pytest.param(
            [user_message("hi")], {"conversation_id": "../x"}, 400, None, id="bad-conversation"
        ),
        pytest.param(
            [user_message("hi")],
            {"selected_files": ["/etc/passwd"]},
            400,
            "invalid_selected_file",
            id="foreign-selected-file",
        ),
    ],
)
def test_ui_chat_refuses_bad_turns(client, messages, extra, status, code):
    r = ui_chat(client, *messages, **extra)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["message"]
    if code:
        assert error["code"] == code


def test_ui_chat_approval_answered_twice_is_a_conflict(client):
    first = chunks(ui_chat(client, user_message("run bash")))
    request = next(c for c in first if c["type"] == "tool-approval-request")
    assert first[-1] == {"type": "finish", "finishReason": "tool-calls"}
    approval = answered(request["approvalId"], approved=False)
    rest = chunks(ui_chat(client, user_message("run bash"), approval))
    assert {"type": "tool-output-denied", "toolCallId": "call_bash"} in rest
    again = ui_chat(client, user_message("run bash"), approval)
    assert again.status_code == 409 and again.json()["error"]["code"] == "already_decided"


def test_another_users_approval_is_not_found(client, ui_server):
    first = chunks(ui_chat(client, user_message("run bash")))
    approval_id = next(c for c in first if c["type"] == "tool-approval-request")["approvalId"]
    intruder = {"X-User-Id": f"other-{uuid.uuid4().hex[:6]}"}
    body = {"id": "chat", "messages": [answered(approval_id)], "conversation_id": "c"}
    r = httpx.post(f"{ui_server.url}/api/v1/ui/chat", json=body, headers=intruder)
    assert r.status_code == 404
    # The owner's run still waits for its owner's answer.
    assert chunks(ui_chat(client, answered(approval_id, approved=False)))[-1]["type"] == "finish"


def test_a_new_message_supersedes_the_chats_open_run(client):
    waiting = ui_chat(client, user_message("run bash"))
    run_id = waiting.headers["x-run-id"]
    assert chunks(waiting)[-1] == {"type": "finish", "finishReason": "tool-calls"}
    hello = chunks(ui_chat(client, user_message("run bash"), user_message("say hello")))
    assert "".join(c.get("delta", "") for c in hello) == "Hello from the sandbox"
    # The run that waited for an approval nobody will give was cancelled, not left open.
    with client.stream("GET", f"/api/v1/runs/{run_id}/events") as events:
        lines = [ln for ln in events.iter_lines() if ln.startswith("data: ")]
    assert json.loads(lines[-2][6:])["code"] == "cancelled"


def test_resume_without_an_active_run_is_204(client):
    assert client.get("/api/v1/ui/chat/never-started/stream").status_code == 204


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        pytest.param({"runId": "r", "messages": []}, 422, "invalid_request", id="no-thread"),
        pytest.param({"threadId": "c", "runId": "r", "messages": []}, 400, "invalid_messages"),
        pytest.param(
            {
                "threadId": "c",
                "runId": "r",
                "messages": [
                    {"id": "1", "role": "user", "content": "hi"},
                    {"id": "2", "role": "assistant", "content": "hello"},
                ],
            },
            400,
            "invalid_messages",
            id="assistant-last",
        ),
        pytest.param(
            {
                "threadId": "c",
                "runId": "r",
                "messages": [{"id": "1", "role": "user", "content": "hi"}],
                "forwardedProps": {"selected_files": "x.csv"},
            },
            422,
            "invalid_request",
            id="selected-not-a-list",
        ),
        pytest.param(
            {
                "threadId": "c",
                "runId": "r",
                "resume": [{"interruptId": "run_1:c", "status": "resolved"}],
            },
            400,
            "invalid_resume",
            id="resolved-without-decision",
        ),
        pytest.param(
            {"threadId": "c", "runId": "r", "resume": [{"interruptId": "x", "status": "maybe"}]},
            422,
            "invalid_request",
            id="unknown-status",
        ),
    ],
)
def test_ag_ui_refuses_bad_input(client, body, status, code):
    r = client.post("/api/v1/ag-ui", json=body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["code"] == code


def test_page_is_served_in_dev(client):
    page = client.get("/ui/")
    assert page.status_code == 200 and "<title>Sandbox Workspace</title>" in page.text
    assert client.get("/ui/app.js").headers["content-type"].startswith("text/javascript")
    # What the page asks for, and which model answers chat (named before the first message).
    assert client.get("/ui/config.json").json() == {"auth_mode": "dev", "model": "scripted"}


@pytest.mark.parametrize(("web_ui", "served"), [(None, False), (True, True), (False, False)])
async def test_page_outside_dev_only_when_turned_on(tmp_path, web_ui, served):
    settings = ApiSettings(
        auth_mode="required", service_token="s" * 20, data_dir=tmp_path, web_ui=web_ui
    )
    transport = httpx.ASGITransport(app=create_app(settings))  # no lifespan: no backend
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        response = await client.get("/ui/")
    assert response.status_code == (200 if served else 404)
