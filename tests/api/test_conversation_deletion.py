"""Deleting a conversation (local backend): writes refused while it is deleted, its chat
runs cancelled, and the same id starting afresh once it is gone.

The deletion window is made wide enough to hit from the outside by giving the
conversation tens of thousands of files (the runtime deletes them one by one).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from api_calls import execute
from scripted_llm import Reply, text_reply, tool_reply, tool_results

pytestmark = pytest.mark.local_backend

MANY_FILES = """
import os
for d in range(200):
    os.makedirs(f"outputs/many/{d}", exist_ok=True)
    for f in range(200):
        open(f"outputs/many/{d}/{f}", "w").close()
"""


@pytest.fixture
def chat_api(chat_server, user) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=chat_server.url, headers={"X-User-Id": user}, timeout=60) as client:
        yield client


def _upload(client: httpx.Client, session_url: str, cid: str, name: str) -> httpx.Response:
    return client.post(
        f"{session_url}/files/upload",
        files={"file": (name, b"data")},
        data={"conversation_id": cid},
    )


def _write_attempts(client: httpx.Client, session_url: str, cid: str):
    """The three kinds of writes, each as (kind, response)."""
    yield "upload", _upload(client, session_url, cid, "late.txt")
    yield (
        "execute",
        client.post(
            f"{session_url}/execute",
            json={"conversation_id": cid, "language": "bash", "code": "echo x > outputs/late"},
        ),
    )
    yield "chat", client.post("/api/v1/chat", json={"query": "q", "conversation_id": cid})


def test_writes_are_refused_while_the_conversation_is_being_deleted(
    chat_api, session_url, scripted_llm
):
    cid = "doomed"
    execute(chat_api, session_url, MANY_FILES, cid=cid)
    assert _upload(chat_api, session_url, cid, "a.txt").status_code == 201
    deleted: list[httpx.Response] = []
    deleter = threading.Thread(
        target=lambda: deleted.append(
            chat_api.delete(f"{session_url}/conversations/{cid}", timeout=120)
        )
    )
    deleter.start()
    refused: dict[str, httpx.Response] = {}
    while deleter.is_alive() and len(refused) < 3:
        for kind, r in _write_attempts(chat_api, session_url, cid):
            if r.status_code == 409:
                refused.setdefault(kind, r)
            elif kind == "chat":
                r.close()
    deleter.join(120)
    assert deleted and deleted[0].status_code == 200, deleted
    assert set(refused) == {"upload", "execute", "chat"}, "every kind of write was refused"
    for kind, r in refused.items():
        error = r.json()["error"]
        assert error["code"] == "conversation_deleting", (kind, error)
        assert "retry" in error["message"].lower()
        assert int(r.headers["retry-after"]) >= 1, (kind, error)


def test_the_same_id_starts_a_fresh_conversation_once_deleted(api, session_url):
    cid = "reborn"
    old = _upload(api, session_url, cid, "old.txt")
    assert old.status_code == 201
    assert api.delete(f"{session_url}/conversations/{cid}").status_code == 200
    new = _upload(api, session_url, cid, "new.txt")
    assert new.status_code == 201, new.text
    listing = api.get(f"{session_url}/files", params={"conversation_id": cid}).json()
    assert listing["files"] == ["new.txt"]


def test_open_chat_runs_of_a_deleted_conversation_are_cancelled(
    chat_api, session_url, scripted_llm
):
    def respond(body: dict) -> Reply:
        if not tool_results(body):
            return tool_reply("bash", {"command": "echo hi"}, call_id="call_wait")
        return text_reply("done")

    scripted_llm.responder = respond
    body = {"query": "q", "conversation_id": "c-run", "tool_policies": {"bash": "require_approval"}}
    other = {**body, "conversation_id": "c-other"}
    with (
        chat_api.stream("POST", "/api/v1/chat", json=body) as doomed,
        chat_api.stream("POST", "/api/v1/chat", json=other) as kept,
    ):
        doomed_events, kept_events = _events(doomed), _events(kept)
        assert _until(doomed_events, "tool_approval") and _until(kept_events, "tool_approval")
        r = chat_api.delete(f"{session_url}/conversations/c-run")
        assert r.status_code == 200, r.text
        rest = list(doomed_events)
        assert [k for k, _ in rest[-2:]] == ["error", "done"]
        assert rest[-2][1]["code"] == "conversation_deleted"
        # The other conversation's run is untouched: still open, waiting for its approval.
        cancel = chat_api.post(f"/api/v1/runs/{kept.headers['x-run-id']}/cancel")
        assert cancel.json()["status"] == "cancelling"


def _events(response: httpx.Response) -> Iterator[tuple[str, dict]]:
    kind = None
    for line in response.iter_lines():
        if line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            yield kind or "", json.loads(line[6:])


def _until(events: Iterator[tuple[str, dict]], wanted: str, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    for kind, _ in events:
        if kind == wanted:
            return True
        assert time.monotonic() < deadline
    return False
