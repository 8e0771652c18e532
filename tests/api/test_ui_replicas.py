"""The frontend protocols across replicas: two API processes sharing a Redis-protocol run
store (started by the tests), the AI SDK (/ui/chat) and AG-UI (/ag-ui) routes and the
page's run list answer alike on either — a turn started on A is resumed, approved,
superseded and listed on B, and every error is the one A gives."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest
from ui_script import SLOW_WORDS, ui_replicas

__all__ = ["ui_replicas"]  # the fixture

pytestmark = pytest.mark.local_backend


@pytest.fixture
def ab(ui_replicas):
    """Clients of replica A and B (ui_script's model: ``run bash`` asks for approval,
    ``count slowly`` streams for ~3 s) for a user of the test's own."""
    user = f"u-{uuid.uuid4().hex[:8]}"
    clients = [
        httpx.Client(base_url=s.url, headers={"X-User-Id": user}, timeout=60) for s in ui_replicas
    ]
    yield clients
    clients[0].delete(f"/api/v1/sessions/sb-session-{user}")
    for client in clients:
        client.close()


def data_lines(response: httpx.Response) -> list[str]:
    return [line[6:] for line in response.text.split("\n") if line.startswith("data: ")]


def ui_chunks(response: httpx.Response) -> list[dict]:
    assert response.status_code == 200, response.text
    lines = data_lines(response)
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def ag_events(response: httpx.Response) -> list[dict]:
    assert response.status_code == 200, response.text
    return [json.loads(line) for line in data_lines(response)]


def user_message(text: str) -> dict:
    return {
        "id": f"u-{uuid.uuid4().hex[:6]}",
        "role": "user",
        "parts": [{"type": "text", "text": text}],
    }


def approval_response(approval_id: str, approved: bool = True) -> dict:
    part = {
        "type": "tool-bash",
        "toolCallId": "call_bash",
        "state": "approval-responded",
        "input": {"command": "echo approved-ran"},
        "approval": {"id": approval_id, "approved": approved},
    }
    return {"id": "a1", "role": "assistant", "parts": [part]}


def ui_chat(client: httpx.Client, chat_id: str, *messages: dict) -> httpx.Response:
    body = {"id": chat_id, "messages": list(messages), "conversation_id": "c"}
    return client.post("/api/v1/ui/chat", json=body)


def ag_ui(client: httpx.Client, **body) -> httpx.Response:
    return client.post("/api/v1/ag-ui", json={"threadId": "c", "runId": "r1", **body})


def of_type(chunks: list[dict], kind: str) -> list[dict]:
    return [c for c in chunks if c["type"] == kind]


def text_of(chunks: list[dict]) -> str:
    return "".join(c["delta"] for c in of_type(chunks, "text-delta"))


def test_a_ui_chat_stream_dropped_on_a_resumes_on_b(ab):
    a, b = ab
    message = user_message("count slowly")
    body = {"id": "chat-drop", "messages": [message], "conversation_id": "c"}
    with a.stream("POST", "/api/v1/ui/chat", json=body) as response:
        assert response.status_code == 200
        run_id = response.headers["x-run-id"]
        for line in response.iter_lines():  # drop once the answer is under way
            if '"text-delta"' in line:
                break
    # Replica B knows the chat's run (the index is in the store) and replays it from its
    # start, then follows it live to the end.
    resumed = ui_chunks(b.get("/api/v1/ui/chat/chat-drop/stream"))
    assert resumed[0] == {
        "type": "start",
        "messageId": f"msg_{run_id}",
        "messageMetadata": {"run_id": run_id, "conversation_id": "c"},
    }
    assert text_of(resumed) == "".join(w + " " for w in SLOW_WORDS)
    assert resumed[-1] == {"type": "finish", "finishReason": "stop"}
    for client in (a, b):  # over: nothing to resume, on either
        assert client.get("/api/v1/ui/chat/chat-drop/stream").status_code == 204


def test_a_ui_chat_approval_asked_on_a_is_answered_on_b(ab):
    a, b = ab
    question = user_message("run bash")
    asked = ui_chunks(ui_chat(a, "chat-approve", question))
    request = of_type(asked, "tool-approval-request")[0]
    assert asked[-1] == {"type": "finish", "finishReason": "tool-calls"}
    # Resumed on B while it waits: the same response, ending at the same approval.
    assert ui_chunks(b.get("/api/v1/ui/chat/chat-approve/stream")) == asked
    # Approved on B (the AI SDK's approval response): the continuation streams from B.
    answer = approval_response(request["approvalId"])
    continued = ui_chunks(ui_chat(b, "chat-approve", question, answer))
    output = of_type(continued, "tool-output-available")[0]
    assert output["toolCallId"] == request["toolCallId"]
    assert "approved-ran" in output["output"]["output"]
    assert "bash said: approved-ran" in text_of(continued)
    assert continued[-1] == {"type": "finish", "finishReason": "stop"}
    # The same answer again is stale wherever it is sent.
    for client in (a, b):
        stale = ui_chat(client, "chat-approve", question, answer)
        assert stale.status_code == 409, stale.text
        assert stale.json()["error"]["code"] == "already_decided"


def test_an_ag_ui_interrupt_on_a_is_resumed_on_b(ab):
    a, b = ab
    messages = [{"id": "m1", "role": "user", "content": "run bash"}]
    first = ag_events(ag_ui(a, messages=messages))
    finished = first[-1]
    assert finished["type"] == "RUN_FINISHED" and finished["outcome"]["type"] == "interrupt"
    interrupt = finished["outcome"]["interrupts"][0]
    resume = [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"approved": True}}]
    second = ag_events(ag_ui(b, runId="r2", messages=messages, resume=resume))
    assert second[0]["type"] == "RUN_STARTED"
    result = next(e for e in second if e["type"] == "TOOL_CALL_RESULT")
    assert result["toolCallId"] == interrupt["toolCallId"] and "approved-ran" in result["content"]
    assert second[-1]["type"] == "RUN_FINISHED" and second[-1]["outcome"] == {"type": "success"}
    assert "bash said: approved-ran" in second[-1]["result"]["answer"]
    for client in (a, b):
        stale = ag_ui(client, runId="r3", messages=messages, resume=resume)
        assert stale.status_code == 409 and stale.json()["error"]["code"] == "already_decided"


def test_b_lists_the_runs_of_a_and_a_new_message_on_b_supersedes_one(ab):
    a, b = ab
    question = user_message("run bash")
    asked = ui_chat(a, "chat-list", question)
    run_id = asked.headers["x-run-id"]
    listings = [
        c.get(f"/api/v1/sessions/sb-session-{c.headers['X-User-Id']}/conversations/c/runs")
        for c in (a, b)
    ]
    for listing in listings:
        assert listing.status_code == 200, listing.text
    on_a, on_b = (r.json()["runs"] for r in listings)
    assert [r["run_id"] for r in on_b] == [run_id]
    assert on_b == on_a  # the page sees the same on every replica
    assert on_b[0]["state"] == "awaiting_approval" and on_b[0]["last_event_id"] > 1
    # A new user message on B supersedes the chat's run still waiting on A: cancelled.
    hello = ui_chunks(ui_chat(b, "chat-list", question, user_message("say hello")))
    assert text_of(hello) == "Hello from the sandbox"
    frames = a.get(f"/api/v1/runs/{run_id}/events").text.strip().split("\n\n")
    assert [f.split("\n")[1] for f in frames[-2:]] == ["event: error", "event: done"]
    assert json.loads(frames[-2].split("data: ")[1])["code"] == "cancelled"


def test_errors_on_b_are_as_on_a(ab):
    a, b = ab
    hello = ui_chat(a, "chat-errors", user_message("say hello"))
    run_id = hello.headers["x-run-id"]
    ui_chunks(hello)
    stranger = {"X-User-Id": f"other-{uuid.uuid4().hex[:6]}"}
    cases = [  # (what, request on a client, status, error code)
        (
            "unknown run",
            lambda c: ui_chat(c, "x", approval_response("run_nope:call_bash")),
            404,
            "not_found",
        ),
        (
            "call never asked",
            lambda c: ui_chat(c, "x", approval_response(f"{run_id}:call_zz")),
            404,
            "unknown_tool_call",
        ),
        (
            "another user's run",
            lambda c: c.post(
                "/api/v1/ui/chat",
                headers=stranger,
                json={
                    "id": "x",
                    "messages": [approval_response(f"{run_id}:call_bash")],
                    "conversation_id": "c",
                },
            ),
            404,
            "not_found",
        ),
        (
            "unknown interrupt",
            lambda c: ag_ui(
                c, messages=[], resume=[{"interruptId": "run_nope:call", "status": "cancelled"}]
            ),
            404,
            "not_found",
        ),
        ("unknown chat", lambda c: c.get("/api/v1/ui/chat/never-used/stream"), 204, None),
        ("finished chat", lambda c: c.get("/api/v1/ui/chat/chat-errors/stream"), 204, None),
    ]
    for what, call, status, code in cases:
        on_a, on_b = call(a), call(b)
        assert on_a.status_code == status, (what, on_a.text)
        if code is not None:
            assert on_a.json()["error"]["code"] == code, (what, on_a.text)
        assert (on_b.status_code, on_b.content) == (on_a.status_code, on_a.content), what
