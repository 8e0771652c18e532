"""Agent chat end to end: real API, real runtime, a scripted model over real HTTP streaming."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest
from api_calls import execute
from scripted_llm import Reply, text_reply, tool_reply, tool_results
from sse_stream import Stream, kinds


@pytest.fixture
def chat(chat_server, user) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=chat_server.url, headers={"X-User-Id": user}, timeout=60) as client:
        yield client


def start_chat(client: httpx.Client, **body):
    body.setdefault("conversation_id", "c")
    body.setdefault("query", "hi")
    return client.stream("POST", "/api/v1/chat", json=body)


def upload(client, user, cid, name, data) -> dict:
    r = client.post(
        f"/api/v1/sessions/sb-session-{user}/files/upload",
        files={"file": (name, data)},
        data={"conversation_id": cid},
    )
    assert r.status_code == 201, r.text
    return r.json()


def code_then_answer(code: str, answer_prefix: str = "Answer: "):
    def respond(body: dict) -> Reply:
        results = tool_results(body)
        if not results:
            return tool_reply("execute_code", {"code": code})
        return text_reply(answer_prefix + results[-1]["content"].strip())

    return respond


def test_run_reads_the_uploaded_csv_at_its_real_path(chat, user, scripted_llm):
    path = upload(chat, user, "c", "sales.csv", b"m,v\na,1\nb,2\n")["path"]
    scripted_llm.responder = code_then_answer(
        f"import pandas as pd\nprint(int(pd.read_csv({path!r})['v'].sum()))"
    )
    with start_chat(chat, query="What is the total of v?", selected_files=[path]) as r:
        assert r.status_code == 200 and r.headers["x-run-id"].startswith("run_")
        events = Stream(r).rest()
    names = kinds(events)
    assert names[0] == "run_started" and names[-1] == "done"
    assert names.index("tool_start") < names.index("tool_end") < names.index("result")
    ids = [i for i, _, _ in events]
    assert ids == list(range(1, len(ids) + 1))
    tool_end = next(d for _, k, d in events if k == "tool_end")
    assert tool_end["ok"] is True and tool_end["output"].strip() == "3"
    result = next(d for _, k, d in events if k == "result")
    assert result["success"] is True and result["answer"] == "Answer: 3"
    assert "".join(d["delta"] for _, k, d in events if k == "text") == "Answer: 3"
    # What the model was told: paths in the system prompt, the selection as its own
    # context message, and the query untouched.
    messages = scripted_llm.requests[0]["messages"]
    assert path in messages[0]["content"] and messages[0]["role"] == "system"
    assert messages[-2]["role"] == "user" and "Available files" in messages[-2]["content"]
    assert f'- "sales.csv" ("{path}")' in messages[-2]["content"]
    assert messages[-1] == {"role": "user", "content": "What is the total of v?"}
    assert {t["function"]["name"] for t in scripted_llm.requests[0]["tools"]} >= {
        "execute_code",
        "bash",
        "list_files",
        "read_file",
        "glob_search",
        "grep_search",
        "present_file",
    }


def test_present_file_and_outputs_reach_the_result(chat, user, scripted_llm):
    def respond(body: dict) -> Reply:
        done = len(tool_results(body))
        if done == 0:
            return tool_reply("bash", {"command": "mkdir -p outputs && echo hi > outputs/r.txt"})
        if done == 1:
            return tool_reply("present_file", {"path": "outputs/r.txt"}, call_id="call_2")
        return text_reply("Here is your report.")

    scripted_llm.responder = respond
    with start_chat(chat) as r:
        result = Stream(r).until("result")
    [presented] = result["presented"]
    assert presented["name"] == "r.txt" and presented["path"].endswith("/c/outputs/r.txt")
    assert [f["relative_path"] for f in result["files"]] == ["r.txt"]
    assert result["files"][0]["status"] == "created"
    got = chat.get(presented["download_url"])
    assert got.status_code == 200 and got.content == b"hi\n"


def approval_script(scripted_llm, command: str = "echo approved-run") -> None:
    def respond(body: dict) -> Reply:
        results = tool_results(body)
        if not results:
            return tool_reply("bash", {"command": command}, call_id="call_ok")
        return text_reply("final: " + results[-1]["content"][:60])

    scripted_llm.responder = respond


def test_a_run_that_only_talks_reports_no_changed_files(chat, user, scripted_llm):
    # outputs/ already holds a file from earlier work; a run without tool calls
    # changed nothing, and says so.
    made = execute(
        chat,
        f"/api/v1/sessions/sb-session-{user}",
        "mkdir -p outputs && echo old > outputs/old.txt",
        language="bash",
    )
    assert made["exit_code"] == 0
    scripted_llm.responder = lambda body: text_reply("Just words.")
    with start_chat(chat) as r:
        result = Stream(r).until("result")
    assert result["answer"] == "Just words." and result["files"] == []


def test_approval_pauses_then_runs_the_tool(chat, scripted_llm):
    approval_script(scripted_llm)
    with start_chat(chat, tool_policies={"bash": "require_approval"}) as r:
        stream = Stream(r)
        ask = stream.until("tool_approval")
        assert ask["tool_call_id"] == "call_ok" and ask["name"] == "bash"
        assert "tool_start" not in kinds(stream.events), "nothing runs before approval"
        run_id = r.headers["x-run-id"]
        ok = chat.post(
            f"/api/v1/runs/{run_id}/approvals", json={"tool_call_id": "call_ok", "approved": True}
        )
        assert ok.status_code == 200 and ok.json()["decision"] == "approved"
        again = chat.post(
            f"/api/v1/runs/{run_id}/approvals", json={"tool_call_id": "call_ok", "approved": False}
        )
        assert again.status_code == 409
        unknown = chat.post(
            f"/api/v1/runs/{run_id}/approvals", json={"tool_call_id": "nope", "approved": True}
        )
        assert unknown.status_code == 404
        events = stream.rest()
    end = next(d for _, k, d in events if k == "tool_end")
    assert end["ok"] is True and "approved-run" in end["output"]
    assert kinds(events)[-2:] == ["result", "done"]


def test_rejection_is_told_to_the_model_and_the_loop_goes_on(chat, scripted_llm):
    approval_script(scripted_llm)
    with start_chat(chat, tool_policies={"bash": "require_approval"}) as r:
        stream = Stream(r)
        stream.until("tool_approval")
        chat.post(
            f"/api/v1/runs/{r.headers['x-run-id']}/approvals",
            json={"tool_call_id": "call_ok", "approved": False, "reason": "too risky"},
        )
        events = stream.rest()
    assert "tool_start" not in kinds(events)
    end = next(d for _, k, d in events if k == "tool_end")
    assert end["decision"] == "rejected" and end["ok"] is False
    told = tool_results(scripted_llm.requests[-1])[-1]["content"]
    assert "rejected" in told and "too risky" in told
    assert next(d for _, k, d in events if k == "result")["success"] is True


def test_other_users_cannot_see_or_steer_a_run(chat, chat_server, user, scripted_llm):
    approval_script(scripted_llm)
    with start_chat(chat, tool_policies={"bash": "require_approval"}) as r:
        stream = Stream(r)
        stream.until("tool_approval")
        run_id = r.headers["x-run-id"]
        with httpx.Client(base_url=chat_server.url, headers={"X-User-Id": f"{user}-x"}) as other:
            assert other.get(f"/api/v1/runs/{run_id}/events").status_code == 404
            assert (
                other.post(
                    f"/api/v1/runs/{run_id}/approvals",
                    json={"tool_call_id": "call_ok", "approved": True},
                ).status_code
                == 404
            )
            assert other.post(f"/api/v1/runs/{run_id}/cancel").status_code == 404
        assert chat.post(f"/api/v1/runs/{run_id}/cancel").json()["status"] == "cancelling"
        events = stream.rest()
    assert kinds(events)[-2:] == ["error", "done"]
    assert events[-2][2]["code"] == "cancelled"


def test_reattach_with_last_event_id_gets_each_missed_event_once(chat, scripted_llm):
    approval_script(scripted_llm)
    with start_chat(chat, tool_policies={"bash": "require_approval"}) as r:
        first = Stream(r)
        first.until("tool_approval")
        run_id = r.headers["x-run-id"]
    seen = first.events  # the client drops here, mid-run
    with chat.stream(
        "GET", f"/api/v1/runs/{run_id}/events", headers={"Last-Event-ID": "2"}
    ) as again:
        second = Stream(again)
        replay = [second_event for second_event in _take(second, len(seen) - 2)]
        assert [e[0] for e in replay] == list(range(3, len(seen) + 1))
        assert replay == seen[2:]
        chat.post(
            f"/api/v1/runs/{run_id}/approvals", json={"tool_call_id": "call_ok", "approved": True}
        )
        rest = second.rest()
    ids = [e[0] for e in rest]
    assert ids == list(range(3, ids[-1] + 1)), "no gaps, no repeats"
    assert kinds(rest)[-1] == "done"


def _take(stream: Stream, n: int):
    it = iter(stream)
    return [next(it) for _ in range(n)]


def test_dropped_client_does_not_stop_the_run(chat, scripted_llm):
    def respond(body: dict) -> Reply:
        reply = text_reply("slowly " * 20, pieces=20)
        reply.pause_between = 0.02
        return reply

    scripted_llm.responder = respond
    with start_chat(chat) as r:
        run_id = r.headers["x-run-id"]
        Stream(r).until("status")
    deadline = time.monotonic() + 30
    while True:  # re-attach from the start until the run has finished on its own
        with chat.stream("GET", f"/api/v1/runs/{run_id}/events") as again:
            events = Stream(again).rest()
        if kinds(events)[-1] == "done":
            break
        assert time.monotonic() < deadline
    result = next(d for _, k, d in events if k == "result")
    assert result["answer"] == "slowly " * 20


@pytest.mark.parametrize(
    ("reply", "code"),
    [
        pytest.param(Reply(status=500), "llm_http_error", id="http-500"),
        pytest.param(Reply(chunks=["this is not json"]), "llm_malformed", id="malformed"),
        pytest.param(
            Reply(chunks=[{"choices": [{"delta": {"content": "cut"}}]}], finish=False),
            "llm_stream_broken",
            id="truncated",
        ),
        pytest.param(Reply(stall_seconds=5), "llm_timeout", id="stall"),
    ],
)
def test_model_failures_end_with_error_then_done(chat, scripted_llm, reply, code):
    scripted_llm.responder = lambda body: reply
    with start_chat(chat) as r:
        events = Stream(r).rest()
    assert kinds(events)[-2:] == ["error", "done"]
    assert events[-2][2]["code"] == code and events[-2][2]["message"]
    if code == "llm_http_error":
        assert len(scripted_llm.requests) == 2, "a 5xx is retried once (max_retries=1)"


def test_max_iterations_ends_the_run(chat, scripted_llm):
    scripted_llm.responder = lambda body: tool_reply(
        "list_files", {}, call_id=f"c{len(body['messages'])}"
    )
    with start_chat(chat, max_iterations=2) as r:
        events = Stream(r).rest()
    assert kinds(events).count("tool_end") == 2
    assert kinds(events)[-2:] == ["error", "done"]
    assert events[-2][2]["code"] == "max_iterations"


def test_selected_files_must_be_this_conversations_uploads(chat, user, scripted_llm):
    mine = upload(chat, user, "c", "a.csv", b"1")["path"]
    other = upload(chat, user, "other", "b.csv", b"2")["path"]
    workspace = mine.rsplit("/c/uploads/", 1)[0]
    for bad in (
        other,
        "/etc/passwd",
        f"{workspace}/c/uploads/temparea/../../other/x.csv",
        f"{workspace}/c/outputs/x.csv",
    ):
        r = chat.post(
            "/api/v1/chat",
            json={"query": "q", "conversation_id": "c", "selected_files": [{"file_name": bad}]},
        )
        assert r.status_code == 400, (bad, r.text)
    # A well-formed name that is not an upload of a running session is refused before
    # any stream, as docs/api.md says (404, not an error inside a 200).
    r = chat.post(
        "/api/v1/chat",
        json={"query": "q", "conversation_id": "c", "selected_files": ["missing.csv"]},
    )
    assert (r.status_code, r.json()["error"]["code"]) == (404, "file_not_found"), r.text


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        pytest.param({"query": " "}, 422, "invalid_request", id="blank-query"),
        pytest.param({"conversation_id": "../x"}, 400, "invalid_conversation_id", id="bad-cid"),
        pytest.param({"tool_policies": {"rm_rf": "deny"}}, 400, "unknown_tool", id="unknown-tool"),
        pytest.param({"tool_policies": {"bash": "maybe"}}, 422, "invalid_request", id="bad-policy"),
        # Six turns each within their own cap, 1.2 M characters in all: past the total.
        pytest.param(
            {"history": [{"role": "user", "content": "x" * 200_000}] * 6},
            422,
            "invalid_request",
            id="history-total",
        ),
    ],
)
def test_bad_chat_requests(chat, body, status, code):
    r = chat.post("/api/v1/chat", json={"query": "q", "conversation_id": "c", **body})
    assert r.status_code == status, r.text
    assert r.json()["error"]["code"] == code
    if "history" in body:
        assert "history holds 1200000 characters" in r.text and "latest turns" in r.text


def test_chat_without_a_model_says_which_settings_to_set(api):
    r = api.post("/api/v1/chat", json={"query": "q", "conversation_id": "c"})
    assert r.status_code == 503 and r.json()["error"]["code"] == "llm_not_configured"
    assert "SANDBOX_WORKSPACE_LLM_BASE_URL" in r.json()["error"]["message"]


def _sample(metrics: str, prefix: str) -> float:
    found = [line for line in metrics.splitlines() if line.startswith(prefix)]
    return float(found[0].split()[-1]) if found else 0.0


def test_runs_show_in_metrics_by_state_and_by_how_they_ended(chat, scripted_llm):
    completed = 'sandbox_chat_runs_ended_total{outcome="completed"}'
    failed = 'sandbox_chat_runs_ended_total{outcome="llm_http_error"}'
    before = chat.get("/metrics").text
    with start_chat(chat) as r:
        Stream(r).rest()
    scripted_llm.responder = lambda body: Reply(status=401)
    with start_chat(chat) as r:
        assert Stream(r).rest()[-2][2]["code"] == "llm_http_error"
    metrics = chat.get("/metrics").text
    assert _sample(metrics, 'sandbox_chat_runs{state="finished"}') >= 2
    assert _sample(metrics, completed) == _sample(before, completed) + 1
    assert _sample(metrics, failed) == _sample(before, failed) + 1


def test_unknown_run_is_404(chat):
    assert chat.get("/api/v1/runs/run_nope/events").status_code == 404
    assert chat.post("/api/v1/runs/run_nope/cancel").status_code == 404


def test_approval_timeout_rejects_and_stricter_only(
    start_server, scripted_llm_server, chat_env_factory
):
    server = start_server(
        "dev",
        "--data-dir",
        "data",
        **chat_env_factory(
            scripted_llm_server,
            SANDBOX_WORKSPACE_CHAT_APPROVAL_TIMEOUT_SECONDS="1",
            SANDBOX_WORKSPACE_CHAT_KEEPALIVE_SECONDS="0.2",
            SANDBOX_WORKSPACE_TOOL_POLICIES='{"bash": "require_approval"}',
        ),
    )
    scripted_llm_server.requests.clear()
    approval_script(scripted_llm_server)
    with httpx.Client(base_url=server.url, headers={"X-User-Id": "timeouts"}, timeout=60) as client:
        looser = client.post(
            "/api/v1/chat",
            json={"query": "q", "conversation_id": "c", "tool_policies": {"bash": "auto"}},
        )
        assert looser.status_code == 400 and looser.json()["error"]["code"] == "policy_too_loose"
        with start_chat(client) as r:
            stream = Stream(r)
            events = stream.rest()
        end = next(d for _, k, d in events if k == "tool_end")
        assert end["decision"] == "timeout" and end["ok"] is False
        assert stream.comments >= 1, "keep-alive comments while waiting"
        assert kinds(events)[-2:] == ["result", "done"]


def test_hundred_concurrent_runs(chat_server, user, scripted_llm):
    def respond(body: dict) -> Reply:
        if not tool_results(body):
            return tool_reply("list_files", {})
        return text_reply("ok " + body["messages"][-3]["content"][-12:])

    scripted_llm.responder = respond

    async def one(client: httpx.AsyncClient, i: int) -> list[str]:
        async with client.stream(
            "POST", "/api/v1/chat", json={"query": f"q{i}", "conversation_id": f"conv-{i % 10}"}
        ) as r:
            found = []
            async for line in r.aiter_lines():
                if line.startswith("event: "):
                    found.append(line[7:])
            return found

    async def main():
        limits = httpx.Limits(max_connections=200)
        async with httpx.AsyncClient(
            base_url=chat_server.url, headers={"X-User-Id": user}, timeout=120, limits=limits
        ) as client:
            await client.post("/api/v1/sessions", json={})
            return await asyncio.gather(*(one(client, i) for i in range(100)))

    runs = asyncio.run(main())
    assert all(r[-2:] == ["result", "done"] for r in runs), [r[-3:] for r in runs][:5]


def test_run_deadline_and_bounded_retention(start_server, scripted_llm_server, chat_env_factory):
    server = start_server(
        "dev",
        "--data-dir",
        "data",
        **chat_env_factory(
            scripted_llm_server,
            SANDBOX_WORKSPACE_CHAT_RUN_DEADLINE_SECONDS="1",
            SANDBOX_WORKSPACE_CHAT_RUN_RETENTION_SECONDS="0",
        ),
    )

    def slow(body: dict) -> Reply:
        reply = text_reply("x" * 200, pieces=200)
        reply.pause_between = 0.05  # 10 s of streaming: far past the deadline
        return reply

    scripted_llm_server.responder = slow
    with httpx.Client(base_url=server.url, headers={"X-User-Id": "deadline"}, timeout=60) as client:
        with start_chat(client) as r:
            first = r.headers["x-run-id"]
            events = Stream(r).rest()
        assert kinds(events)[-2:] == ["error", "done"]
        assert events[-2][2]["code"] == "deadline_exceeded"
        scripted_llm_server.responder = lambda body: text_reply("quick")
        with start_chat(client) as r:
            Stream(r).rest()
        # Finished runs are kept only for the retention period (0 here).
        assert client.get(f"/api/v1/runs/{first}/events").status_code == 404
