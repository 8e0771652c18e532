"""Conversation state, runs after a reload, stream tokens and bare-name downloads.

Seed 003's workspace information (``GET …/conversations/{cid}``), the session's
conversation list, a conversation's runs with what a reloaded page needs to re-attach,
the EventSource path (``?token=``), and seed 000 §6.4's download by bare name resolved
within the session — all against the live API with real runtimes and the scripted model.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime

import httpx
import pytest
from api_calls import execute
from scripted_llm import Reply, text_reply, tool_reply, tool_results
from sse_stream import Stream, kinds

from sandbox_workspace.api.backends.base import ConversationPhase
from sandbox_workspace.api.identity import StreamTokens
from sandbox_workspace.api.routes.conversation_state import build_state
from sandbox_workspace.contract.errors import Unauthorized
from sandbox_workspace.runtime.schemas import ConversationInfo


def upload(client: httpx.Client, session_url: str, cid: str, name: str, data: bytes) -> dict:
    r = client.post(
        f"{session_url}/files/upload", files={"file": (name, data)}, data={"conversation_id": cid}
    )
    assert r.status_code == 201, r.text
    return r.json()


# -- download by bare name (seed 000 §6.4) ------------------------------------------------


def test_bare_name_download_resolves_within_the_session(api, session_url):
    upload(api, session_url, "only-here", "report.csv", b"one")
    r = api.get(f"{session_url}/files/report.csv")  # the seed's downloadFile: no conversation
    assert r.status_code == 200 and r.content == b"one"

    upload(api, session_url, "and-here", "report.csv", b"two")
    r = api.get(f"{session_url}/files/report.csv")
    assert r.status_code == 409 and r.json()["error"]["code"] == "ambiguous_file_name"
    assert "only-here" in r.json()["error"]["message"]
    assert "and-here" in r.json()["error"]["message"]
    named = api.get(f"{session_url}/files/report.csv", params={"conversation_id": "and-here"})
    assert named.content == b"two"

    r = api.get(f"{session_url}/files/missing.csv")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


def test_bare_name_delete_resolves_the_same_way(api, session_url):
    upload(api, session_url, "c1", "x.csv", b"1")
    upload(api, session_url, "c2", "x.csv", b"2")
    assert api.delete(f"{session_url}/files/x.csv").status_code == 409
    assert api.delete(f"{session_url}/files/x.csv", params={"conversation_id": "c1"}).json()[
        "deleted"
    ]
    r = api.delete(f"{session_url}/files/x.csv")  # now exactly one holds it
    assert r.status_code == 200 and r.json()["conversation_id"] == "c2"
    assert api.delete(f"{session_url}/files/x.csv").status_code == 404


def test_bare_name_lookup_ignores_outputs_and_other_users(api, dev_server, session_url, user):
    execute(api, session_url, "mkdir -p outputs && echo o > outputs/made.csv", language="bash")
    assert api.get(f"{session_url}/files/made.csv").status_code == 404, "outputs are not uploads"
    upload(api, session_url, "mine", "secret.csv", b"s")
    other = f"{user}-other"
    with httpx.Client(base_url=dev_server.url, headers={"X-User-Id": other}, timeout=30) as c:
        r = c.get(f"/api/v1/sessions/sb-session-{other}/files/secret.csv")
        assert r.status_code == 404
        c.delete(f"/api/v1/sessions/sb-session-{other}")


# -- conversation state (seed 003) ----------------------------------------------------------


def test_conversation_state_lists_uploads_and_outputs(api, session_url):
    up = upload(api, session_url, "c", "data.csv", b"a,b\n1,2\n")
    execute(
        api,
        session_url,
        "mkdir -p outputs/sub && printf 12345 > outputs/sub/r.txt",
        language="bash",
    )
    r = api.get(f"{session_url}/conversations/c")
    assert r.status_code == 200, r.text
    state = r.json()
    assert state["status"] == "ready" and state["conversation_id"] == "c"
    assert state["path"].endswith("/c") and up["path"].startswith(state["path"] + "/")
    assert state["file_count"] == 2 and state["total_size"] == 8 + 5
    [u] = state["uploads"]
    assert u["name"] == "data.csv" and u["source"] == "user_upload" and u["sha256"] == up["sha256"]
    assert u["is_presented"] is False and u["path"] == up["path"]
    [o] = state["outputs"]
    assert o["name"] == "sub/r.txt" and o["source"] == "ai_created" and o["size"] == 5
    assert o["is_presented"] is False and o["path"] == state["path"] + "/outputs/sub/r.txt"


def test_unknown_conversation_is_absent_and_reading_creates_nothing(api, session_url):
    upload(api, session_url, "real", "a.csv", b"a")
    r = api.get(f"{session_url}/conversations/never-used")
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "absent" and body["file_count"] == 0
    assert body["uploads"] == [] and body["outputs"] == []
    listed = api.get(f"{session_url}/conversations").json()["conversations"]
    assert listed == [{"conversation_id": "real", "status": "ready"}]


def test_deleted_conversation_reads_deleting_then_absent(api, session_url):
    upload(api, session_url, "gone", "a.csv", b"a")
    assert api.delete(f"{session_url}/conversations/gone").status_code in (200, 202)
    # 200: verified gone at once (local); 202: a finalizer finishes it (kubernetes), and
    # meanwhile the conversation reads `deleting`.
    seen = []
    deadline = time.monotonic() + 60
    while not seen or seen[-1] != "absent":
        assert time.monotonic() < deadline, seen
        seen.append(api.get(f"{session_url}/conversations/gone").json()["status"])
        time.sleep(0.1 if seen[-1] != "absent" else 0)
    assert set(seen) <= {"deleting", "absent"}
    assert api.get(f"{session_url}/conversations").json()["conversations"] == []


@pytest.mark.parametrize("bad", ["%2E%2E", ".hidden", "a\u200bb", " x"])
def test_bad_conversation_ids_are_400(api, session_url, bad):
    r = api.get(f"{session_url}/conversations/{bad}")
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_conversation_id"


def test_foreign_session_is_404(api, user):
    r = api.get(f"/api/v1/sessions/sb-session-{user}-x/conversations/c")
    assert r.status_code == 404
    assert api.get(f"/api/v1/sessions/sb-session-{user}-x/conversations/c/runs").status_code == 404


def test_build_state_reports_deleting_without_listing():
    info = ConversationInfo(
        conversation_id="c",
        exists=True,
        path="/w/c",
        uploads_path="/w/c/uploads/temparea",
        outputs_path="/w/c/outputs",
        file_count=3,
        total_bytes=10,
    )
    state = build_state("s", ConversationPhase.DELETING, info, None, None)
    assert state.status == "deleting" and state.uploads == [] and state.file_count == 3


# -- with the agent: sources, presented files, runs, stream tokens ---------------------------


@pytest.fixture
def chat(chat_server, user) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=chat_server.url, headers={"X-User-Id": user}, timeout=60) as client:
        yield client


def _modify_old_and_present_new(client: httpx.Client, user: str, scripted_llm) -> str:
    """An agent run that appends to an existing output and presents a new one; returns
    the session URL."""
    session_url = f"/api/v1/sessions/sb-session-{user}"
    execute(client, session_url, "mkdir -p outputs && echo v1 > outputs/old.txt", language="bash")

    def respond(body: dict) -> Reply:
        done = len(tool_results(body))
        if done == 0:
            command = "echo v2 >> outputs/old.txt && echo new > outputs/new.txt"
            return tool_reply("bash", {"command": command})
        if done == 1:
            return tool_reply("present_file", {"path": "outputs/new.txt"}, call_id="call_2")
        return text_reply("done")

    scripted_llm.responder = respond
    with client.stream("POST", "/api/v1/chat", json={"query": "go", "conversation_id": "c"}) as r:
        Stream(r).until("done")
    return session_url


def _assert_sources(client: httpx.Client, session_url: str) -> None:
    state = client.get(f"{session_url}/conversations/c").json()
    by_name = {o["name"]: o for o in state["outputs"]}
    assert by_name["old.txt"]["source"] == "ai_modified"
    assert by_name["old.txt"]["is_presented"] is False
    assert by_name["new.txt"]["source"] == "ai_created"
    assert by_name["new.txt"]["is_presented"] is True


def test_agent_files_carry_source_and_presented(chat, user, scripted_llm):
    _assert_sources(chat, _modify_old_and_present_new(chat, user, scripted_llm))


def test_sources_and_presented_survive_an_api_restart(
    start_server, scripted_llm_server, scripted_llm, chat_env_factory, user
):
    """They are kept with the files (the runtime's marks), not in the API process that
    saw the run: after a restart (or on another replica) the page shows the same."""
    server = start_server("dev", "--data-dir", "data", **chat_env_factory(scripted_llm_server))
    with httpx.Client(base_url=server.url, headers={"X-User-Id": user}, timeout=60) as client:
        session_url = _modify_old_and_present_new(client, user, scripted_llm)
        _assert_sources(client, session_url)
    server.stop()
    server.start()
    with httpx.Client(base_url=server.url, headers={"X-User-Id": user}, timeout=60) as client:
        _assert_sources(client, session_url)


def test_runs_list_lets_a_reloaded_page_reattach(chat, chat_server, user, scripted_llm):
    def respond(body: dict) -> Reply:
        if not tool_results(body):
            return tool_reply("bash", {"command": "echo ok"}, call_id="call_ok")
        return text_reply("finished")

    scripted_llm.responder = respond
    session_url = f"/api/v1/sessions/sb-session-{user}"
    before = datetime.now(UTC)
    with chat.stream(
        "POST",
        "/api/v1/chat",
        json={"query": "go", "conversation_id": "c", "tool_policies": {"bash": "require_approval"}},
    ) as r:
        Stream(r).until("tool_approval")
        run_id = r.headers["x-run-id"]
    # The page reloads: the stream is gone; what is there to re-attach to?
    runs = chat.get(f"{session_url}/conversations/c/runs").json()["runs"]
    [run] = runs
    assert run["run_id"] == run_id and run["state"] == "awaiting_approval"
    assert run["awaiting_approval"] is True and run["finished"] is False
    assert datetime.fromisoformat(run["started_at"]) >= before.replace(microsecond=0)
    assert run["last_event_id"] >= 3
    # EventSource cannot send headers: a stream token stands in for them.
    token = chat.post(f"/api/v1/runs/{run_id}/stream-token").json()
    assert token["expires_at"] > before.timestamp()
    browser = httpx.Client(base_url=chat_server.url, timeout=60)  # no X-User-Id
    with browser, browser.stream("GET", token["events_url"]) as events:
        assert events.status_code == 200
        stream = Stream(events)
        first = next(iter(stream))
        assert first[1] == "run_started" and first[2]["run_id"] == run_id
        ok = chat.post(
            f"/api/v1/runs/{run_id}/approvals",
            json={"tool_call_id": "call_ok", "approved": True},
        )
        assert ok.status_code == 200
        assert kinds(stream.rest())[-2:] == ["result", "done"]
    [run] = chat.get(f"{session_url}/conversations/c/runs").json()["runs"]
    assert run["state"] == "finished" and run["finished"] is True
    assert chat.get(f"{session_url}/conversations/other/runs").json()["runs"] == []


def test_stream_tokens_are_run_scoped(chat, chat_server, scripted_llm):
    scripted_llm.responder = lambda body: text_reply("hi")
    ids = []
    for _ in range(2):
        with chat.stream("POST", "/api/v1/chat", json={"query": "q", "conversation_id": "c"}) as r:
            Stream(r).until("done")
            ids.append(r.headers["x-run-id"])
    token = chat.post(f"/api/v1/runs/{ids[0]}/stream-token").json()["token"]
    with httpx.Client(base_url=chat_server.url, timeout=30) as browser:
        r = browser.get(f"/api/v1/runs/{ids[1]}/events", params={"token": token})
        assert r.status_code == 401 and "another run" in r.json()["error"]["message"]
        r = browser.get(f"/api/v1/runs/{ids[0]}/events", params={"token": token[:-2] + "xx"})
        assert r.status_code == 401
        r = browser.get(f"/api/v1/runs/{ids[0]}/events", params={"token": "garbage"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
        r = browser.get(f"/api/v1/runs/{ids[0]}/events", params={"token": token})
        assert r.status_code == 200 and "event: done" in r.text
    assert chat.post("/api/v1/runs/run_nope/stream-token").status_code == 404


def test_stream_token_expires():
    tokens = StreamTokens(b"k" * 32, ttl=60)
    token, expires = tokens.issue("run_1", "alice", now=1000.0)
    assert expires == 1060
    assert tokens.verify(token, "run_1", now=1059.0).user_id == "alice"
    with pytest.raises(Unauthorized, match="expired"):
        tokens.verify(token, "run_1", now=1061.0)
    with pytest.raises(Unauthorized, match="invalid"):
        StreamTokens(b"other" * 8, ttl=60).verify(token, "run_1", now=1000.0)
