"""Agent chat end to end on the Anthropic provider: a real API started with
``SANDBOX_WORKSPACE_LLM_PROVIDER=anthropic``, a real runtime, and the scripted model
speaking the Messages streaming protocol over real HTTP (``/v1/messages``)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from scripted_llm import Reply, text_reply, tool_reply, tool_results
from scripted_messages import message_end, message_start, text_block
from sse_stream import Stream, kinds


@pytest.fixture(scope="module")
def anthropic_server(start_server, scripted_llm_server, chat_env_factory):
    return start_server(
        "dev",
        "--data-dir",
        "data",
        **chat_env_factory(
            scripted_llm_server,
            SANDBOX_WORKSPACE_LLM_PROVIDER="anthropic",
            SANDBOX_WORKSPACE_LLM_API_KEY="sk-scripted",
            SANDBOX_WORKSPACE_LLM_TIMEOUT_SECONDS="3",
        ),
    )


@pytest.fixture
def chat(anthropic_server, user) -> Iterator[httpx.Client]:
    headers = {"X-User-Id": user}
    with httpx.Client(base_url=anthropic_server.url, headers=headers, timeout=60) as client:
        yield client


def test_a_run_with_a_tool_call_reads_the_upload_and_answers(chat, user, scripted_llm):
    up = chat.post(
        f"/api/v1/sessions/sb-session-{user}/files/upload",
        files={"file": ("sales.csv", b"m,v\na,1\nb,2\n")},
        data={"conversation_id": "c"},
    )
    assert up.status_code == 201, up.text
    path = up.json()["path"]

    def respond(body: dict) -> Reply:
        results = tool_results(body)
        if not results:
            code = f"import pandas as pd\nprint(int(pd.read_csv({path!r})['v'].sum()))"
            return tool_reply("execute_code", {"code": code}, call_id="toolu_1")
        return text_reply("Total: " + results[-1]["content"].strip())

    scripted_llm.responder = respond
    body = {"query": "Total of v?", "conversation_id": "c", "selected_files": [path]}
    with chat.stream("POST", "/api/v1/chat", json=body) as r:
        assert r.status_code == 200
        events = Stream(r).rest()
    names = kinds(events)
    assert names[0] == "run_started" and names[-1] == "done" and "error" not in names
    tool_end = next(d for _, k, d in events if k == "tool_end")
    assert tool_end["ok"] is True and tool_end["output"].strip() == "3"
    result = next(d for _, k, d in events if k == "result")
    assert result["success"] is True and result["answer"] == "Total: 3"
    assert "".join(d["delta"] for _, k, d in events if k == "text") == "Total: 3"

    # What the model was told, in the Messages shape.
    first, second = scripted_llm.requests
    assert path in first["system"] and first["stream"] is True and first["max_tokens"] == 4096
    assert all(m["role"] in ("user", "assistant") for m in first["messages"])
    [turn] = first["messages"]  # the context message and the query: one user turn
    assert [b["text"] for b in turn["content"]][-1] == "Total of v?"
    assert f'- "sales.csv" ("{path}")' in turn["content"][0]["text"]
    assert {t["name"] for t in first["tools"]} >= {"execute_code", "bash", "read_file"}
    assert all("input_schema" in t for t in first["tools"])
    call, result_turn = second["messages"][-2:]
    assert call["role"] == "assistant"
    assert call["content"][0]["type"] == "tool_use" and call["content"][0]["id"] == "toolu_1"
    assert call["content"][0]["input"]["code"].startswith("import pandas")
    assert result_turn["role"] == "user"
    assert result_turn["content"][0]["type"] == "tool_result"
    assert result_turn["content"][0]["tool_use_id"] == "toolu_1"


def test_an_error_event_mid_stream_ends_the_run_with_its_code(chat, scripted_llm):
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    events = [message_start(), *text_block(0, ["par", "tial"])[:3], error]
    scripted_llm.responder = lambda body: Reply(events=events)
    with chat.stream("POST", "/api/v1/chat", json={"query": "hi", "conversation_id": "c"}) as r:
        got = Stream(r).rest()
    assert "".join(d["delta"] for _, k, d in got if k == "text") == "partial"
    [failure] = [d for _, k, d in got if k == "error"]
    assert failure["code"] == "llm_stream_error" and "overloaded_error" in failure["message"]
    assert kinds(got)[-1] == "done"


def test_a_529_answer_is_retried_then_the_run_completes(chat, scripted_llm):
    answers = iter(
        [Reply(status=529), Reply(events=[message_start(), *text_block(0, ["ok"]), *message_end()])]
    )
    scripted_llm.responder = lambda body: next(answers)
    with chat.stream("POST", "/api/v1/chat", json={"query": "hi", "conversation_id": "c"}) as r:
        result = Stream(r).until("result")
    assert result["answer"] == "ok" and len(scripted_llm.requests) == 2
