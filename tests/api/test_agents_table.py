"""/agents with ``table_id``: the table comes from the platform's table source and goes
back to it (api/table_source.py) — against a real HTTP table source on loopback."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest
from agents_script import ANSWER, double_ages
from doc_blocks import REPO_ROOT, shell_block
from scripted_llm import Reply, text_reply, tool_reply, tool_results
from table_source import TableSource

EDIT = "python3 -c \"import json; d = json.load(open('data.json')); d['v'] = 2; json.dump(d, open('data.json', 'w'))\""  # noqa: E501


@pytest.fixture(scope="module")
def source() -> Iterator[TableSource]:
    table_source = TableSource().start()
    yield table_source
    table_source.stop()


@pytest.fixture(scope="module")
def server(start_server, scripted_llm_server, chat_env_factory, source):
    return start_server(
        "dev",
        "--data-dir",
        "data",
        **chat_env_factory(
            scripted_llm_server,
            SANDBOX_WORKSPACE_TABLE_SOURCE_URL=source.url,
            SANDBOX_WORKSPACE_TABLE_SOURCE_TIMEOUT_SECONDS="1",
        ),
    )


@pytest.fixture
def fresh(source) -> TableSource:
    source.tables.clear()
    source.forbidden.clear()
    source.requests.clear()
    source.delay = 0.0
    source.tables["7"] = {"meta": {"v": 1}, "rows": [1, 2]}
    return source


@pytest.fixture
def client(server, user) -> Iterator[httpx.Client]:
    headers = {"X-User-Id": user, "Authorization": "Bearer platform-jwt"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=60) as c:
        yield c


def edit_then_answer(before_answer=lambda: None):
    def respond(body: dict) -> Reply:
        if not tool_results(body):
            return tool_reply("bash", {"command": EDIT})
        before_answer()
        return text_reply("edited")

    return respond


def stream(client, on_result=None, **body) -> list[dict]:
    body = {"prompt": "edit", "conversation_id": "c", **body}
    events = []
    with client.stream("POST", "/api/v1/agents", json=body) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
                if events[-1]["type"] == "result" and on_result:
                    on_result()
    assert events[-1]["type"] == "result"
    return events


def test_table_is_read_and_written_back_before_the_result(client, user, fresh, scripted_llm):
    scripted_llm.responder = edit_then_answer()
    seen_at_result = []
    events = stream(
        client,
        on_result=lambda: seen_at_result.append(json.loads(json.dumps(fresh.tables["7"]))),
        table_id=7,
        bashAccessPoints=[{"path": "/meta", "mode": "full"}],
    )
    result = events[-1]
    assert result["success"] is True, result
    assert result["updatedData"] == {"meta": {"v": 2}, "rows": [1, 2]}
    # Written back before the result event went out, and forwarded as the caller.
    assert seen_at_result == [{"meta": {"v": 2}, "rows": [1, 2]}]
    assert [(m, t) for m, t, _ in fresh.requests] == [("GET", "7"), ("PUT", "7")]
    for _, _, headers in fresh.requests:
        assert headers["x-user-id"] == user
        assert headers["x-tenant-id"] == "default"  # a user id may repeat across tenants
        assert headers["authorization"] == "Bearer platform-jwt"


def test_readonly_run_writes_nothing_back(client, fresh, scripted_llm):
    scripted_llm.responder = lambda body: text_reply("looked")
    events = stream(client, table_id=7, bashAccessPoints=[{"path": "/meta", "mode": "readonly"}])
    assert events[-1]["success"] is True and events[-1]["updatedData"] is None
    assert [m for m, _, _ in fresh.requests] == ["GET"]


@pytest.mark.parametrize("table_id", ["8", "forbidden"])
def test_unknown_or_refused_table_is_404(client, fresh, table_id):
    fresh.forbidden.add("forbidden")
    fresh.tables["forbidden"] = {}
    r = client.post("/api/v1/agents", json={"prompt": "p", "table_id": table_id})
    assert (r.status_code, r.json()["error"]["code"]) == (404, "table_not_found")


def test_slow_source_on_read_ends_the_stream_with_error_and_result(client, fresh, scripted_llm):
    fresh.delay = 3
    started = time.monotonic()
    events = stream(client, table_id=7, bashAccessPoints=[{"path": "/meta", "mode": "full"}])
    assert time.monotonic() - started < 2.5
    assert [e["type"] for e in events] == ["error", "result"]
    assert events[0]["code"] == "table_source_unavailable" and "within 1s" in events[0]["error"]
    assert events[1]["success"] is False and events[1]["updatedData"] is None
    assert not scripted_llm.requests  # no run started


def test_slow_source_on_write_leaves_the_table_whole(client, fresh, scripted_llm):
    def slow() -> None:
        fresh.delay = 3

    scripted_llm.responder = edit_then_answer(slow)
    events = stream(client, table_id=7, bashAccessPoints=[{"path": "/meta", "mode": "full"}])
    error, result = events[-2], events[-1]
    assert error["type"] == "error" and "not written back" in error["error"]
    assert "within 1s" in error["error"]
    assert result["success"] is False and result["updatedData"] is None
    deadline = time.monotonic() + 10  # the source finishes the PUT its client gave up on
    while fresh.answered < len(fresh.requests):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert fresh.tables["7"] == {"meta": {"v": 1}, "rows": [1, 2]}


def test_source_down_on_write(
    start_server, scripted_llm_server, scripted_llm, chat_env_factory, user
):
    source = TableSource().start()
    source.tables["7"] = {"meta": {"v": 1}}
    server = start_server(
        "dev",
        "--data-dir",
        "data",
        **chat_env_factory(scripted_llm_server, SANDBOX_WORKSPACE_TABLE_SOURCE_URL=source.url),
    )
    scripted_llm.responder = edit_then_answer(source.stop)
    with httpx.Client(base_url=server.url, headers={"X-User-Id": user}, timeout=60) as c:
        events = stream(c, table_id=7, bashAccessPoints=[{"path": "/meta", "mode": "full"}])
        assert "unreachable" in events[-2]["error"] and events[-1]["success"] is False
        # And down from the start: the stream ends at once the same way.
        events = stream(c, table_id=7, bashAccessPoints=[{"path": "/meta", "mode": "full"}])
        assert [e["type"] for e in events] == ["error", "result"]
        assert "unreachable" in events[0]["error"]
    assert source.tables["7"] == {"meta": {"v": 1}}


def test_table_id_and_table_data_together_is_400(client):
    r = client.post("/api/v1/agents", json={"prompt": "p", "table_id": 7, "tableData": {}})
    assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_table")


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_docs_curl_example_works_as_written(server, fresh, scripted_llm, tmp_path):
    script = shell_block(REPO_ROOT / "docs" / "api.md", "agents-example").replace(
        "http://127.0.0.1:8000", server.url
    )
    fresh.tables["42"] = [{"name": "ann", "age": 30}, {"name": "bob", "age": 41}]
    scripted_llm.responder = double_ages
    out = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    events = [json.loads(line[6:]) for line in out.stdout.splitlines() if line.startswith("data: ")]
    assert events[-1]["type"] == "result" and events[-1]["success"] is True, out.stdout
    doubled = [{"name": "ann", "age": 60}, {"name": "bob", "age": 82}]
    assert events[-1]["updatedData"] == doubled and events[-1]["modifiedPath"] == "/"
    assert "".join(e["content"] for e in events if e["type"] == "text") == ANSWER
    assert fresh.tables["42"] == doubled


@pytest.mark.parametrize("credential", [False, True], ids=["user-id", "authorization"])
def test_a_run_carried_on_by_another_replica_writes_back_as_the_caller(
    tmp_path,
    start_server,
    scripted_llm_server,
    scripted_llm,
    chat_env_factory,
    redis_url,
    credential,
):
    """Two replicas on a Redis run store (and one data directory: the session outlives
    its API, as a pod does): the owner is killed while the model answers after the edit;
    the other carries the run on and PUTs the merged table with the caller's X-User-Id —
    unless the caller sent an Authorization header, which is never stored: then the
    result says nothing was written, and nothing is."""
    import asyncio
    import signal
    import uuid

    from run_follower import start_and_follow

    source = TableSource().start()
    source.tables["7"] = {"meta": {"v": 1}, "rows": [1, 2]}
    env = chat_env_factory(
        scripted_llm_server,
        SANDBOX_WORKSPACE_TABLE_SOURCE_URL=source.url,
        SANDBOX_WORKSPACE_CHAT_RUN_STORE="redis",
        SANDBOX_WORKSPACE_CHAT_REDIS_URL=redis_url,
        SANDBOX_WORKSPACE_CHAT_REDIS_PREFIX=f"t{uuid.uuid4().hex[:8]}:",
        SANDBOX_WORKSPACE_CHAT_RUN_LEASE_SECONDS="1.5",
        SANDBOX_WORKSPACE_CHAT_KEEPALIVE_SECONDS="0.5",
    )
    a, b = (start_server("dev", "--data-dir", str(tmp_path / "data"), **env) for _ in range(2))

    def respond(body: dict) -> Reply:
        if not tool_results(body):
            return tool_reply("bash", {"command": EDIT})
        reply = text_reply("x" * 40, pieces=40)
        reply.pause_between = 0.1  # a 4 s answer: the owner is killed in the middle of it
        return reply

    scripted_llm.responder = respond
    user = f"u-{uuid.uuid4().hex[:10]}"
    headers = {"X-User-Id": user, "X-Tenant-Id": "acme"}
    headers |= {"Authorization": "Bearer jwt"} if credential else {}
    body = {
        "prompt": "edit",
        "conversation_id": "c",
        "table_id": 7,
        "bashAccessPoints": [{"path": "/meta", "mode": "full"}],
    }
    try:
        with (
            httpx.Client(base_url=a.url, headers=headers, timeout=60) as c,
            c.stream("POST", "/api/v1/agents", json=body) as r,
        ):
            run_id = r.headers["x-run-id"]
            for line in r.iter_lines():
                if line.startswith("data: ") and json.loads(line[6:])["type"] == "text":
                    break  # the edit is done, the answer is streaming
            a.stop(signal.SIGKILL)
        followed = asyncio.run(
            start_and_follow(lambda: [b.url], user, run_id=run_id, tenant="acme")
        )
        assert followed.done, followed.kinds()
        result = [d for _, kind, d in followed.events if kind == "result"][-1]
        resumed = [d for _, k, d in followed.events if k == "status" and d["stage"] == "resumed"]
        assert resumed, followed.kinds()
        if credential:
            assert result["success"] is False and "never stored" in result["error"], result
            assert source.tables["7"] == {"meta": {"v": 1}, "rows": [1, 2]}
            assert [m for m, _, _ in source.requests] == ["GET"]
        else:
            assert result["success"] is True, result
            assert source.tables["7"] == {"meta": {"v": 2}, "rows": [1, 2]}
            assert [m for m, _, _ in source.requests] == ["GET", "PUT"]
            assert source.requests[-1][2]["x-user-id"] == user
            assert source.requests[-1][2]["x-tenant-id"] == "acme"  # the run's, carried on
            assert "authorization" not in source.requests[-1][2]
    finally:
        b.stop(signal.SIGTERM)
        source.stop()
