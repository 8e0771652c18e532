"""A snapshot before each chat turn (``SANDBOX_WORKSPACE_CHAT_AUTO_SNAPSHOT``): the last N
are kept, a user's own snapshots are never pruned, and restoring the one taken before
turn N brings back turn N's files (real API, runtime and scripted model)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest
from scripted_llm import Reply, text_reply, tool_reply, tool_results

pytestmark = pytest.mark.local_backend


@pytest.fixture(scope="module")
def server(start_server, scripted_llm_server, chat_env_factory):
    env = chat_env_factory(
        scripted_llm_server,
        SANDBOX_WORKSPACE_CHAT_AUTO_SNAPSHOT="true",
        SANDBOX_WORKSPACE_CHAT_AUTO_SNAPSHOT_KEEP="2",
    )
    return start_server("dev", "--data-dir", "data", **env)


@pytest.fixture
def chat(server) -> Iterator[tuple[str, httpx.Client]]:
    user = f"u-{uuid.uuid4().hex[:10]}"
    with httpx.Client(base_url=server.url, headers={"X-User-Id": user}, timeout=120) as client:
        yield user, client
        client.delete(f"/api/v1/sessions/sb-session-{user}")


def writes(turn: int):
    def respond(body: dict) -> Reply:
        if not tool_results(body):
            code = f"open('outputs/turn.txt', 'w').write('{turn}')"
            return tool_reply("execute_code", {"code": code})
        return text_reply(f"turn {turn} done")

    return respond


def test_each_turn_starts_with_a_snapshot_and_the_last_n_are_kept(chat, scripted_llm):
    user, api = chat
    snapshots = f"/api/v1/sessions/sb-session-{user}/conversations/c/snapshots"
    for turn in (1, 2, 3):
        scripted_llm.responder = writes(turn)
        r = api.post("/api/v1/chat", json={"conversation_id": "c", "query": f"turn {turn}"})
        assert r.status_code == 200 and "event: done" in r.text, r.text
        if turn == 1:  # a user's own snapshot: never pruned
            assert api.post(snapshots, json={"name": "mine"}).status_code == 201
    listed = api.get(snapshots).json()["snapshots"]
    autos = [s for s in listed if s["name"].startswith("auto: before turn ")]
    assert len(autos) == 2 and [s["name"] for s in listed if s["name"] == "mine"] == ["mine"]

    before_turn_3 = autos[-1]["snapshot_id"]
    r = api.post(f"{snapshots}/{before_turn_3}/restore")
    assert r.status_code == 200, r.text
    body = {"conversation_id": "c", "language": "python",
            "code": "print(open('outputs/turn.txt').read())"}  # fmt: skip
    out = api.post(f"/api/v1/sessions/sb-session-{user}/execute", json=body).json()
    assert out["stdout"].strip() == "2"  # the files as turn 3 found them
