"""POST /api/v1/agents (seed 002): a table's nodes as data.json, merged back; seed 002's
events. Real API, real runtime, the scripted model over real HTTP streaming."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from scripted_llm import Reply, text_reply, tool_reply, tool_results

from sandbox_workspace.runtime import landlock

TABLE = {"users": [{"name": "ann", "age": 30}, {"name": "bob", "age": 40}], "meta": {"v": 1}}
SEED_EVENTS = {"status", "tool_start", "tool_end", "text", "result", "error"}


@pytest.fixture
def agents(chat_server, user) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=chat_server.url, headers={"X-User-Id": user}, timeout=60) as client:
        yield client


def events_of(response: httpx.Response) -> list[dict]:
    """Seed 002's stream: each frame's ``event:`` equals its data's ``type``."""
    out, kind = [], None
    for line in response.iter_lines():
        if line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            data = json.loads(line[6:])
            assert data["type"] == kind
            out.append(data)
    return out


def run(client: httpx.Client, **body) -> list[dict]:
    body.setdefault("prompt", "do it")
    body.setdefault("conversation_id", "c")
    with client.stream("POST", "/api/v1/agents", json=body) as r:
        assert r.status_code == 200, r.read()
        events = events_of(r)
    assert {e["type"] for e in events} <= SEED_EVENTS
    assert events[-1]["type"] == "result"
    return events


def bash_then_answer(*commands: str):
    def respond(body: dict) -> Reply:
        done = len(tool_results(body))
        if done < len(commands):
            return tool_reply("bash", {"command": commands[done]}, call_id=f"call_{done}")
        return text_reply("done: " + tool_results(body)[-1]["content"].strip()[:200])

    return respond


def edit(expr: str, name: str = "data.json") -> str:
    return (
        f"python3 -c \"import json; d = json.load(open('{name}')); {expr}; "
        f"json.dump(d, open('{name}', 'w'))\""
    )


def test_full_node_is_edited_and_merged_back(agents, scripted_llm):
    scripted_llm.responder = bash_then_answer("cat data.json", edit("d['name'] = 'ANN'"))
    events = run(agents, tableData=TABLE, bashAccessPoints=[{"path": "/users/0", "mode": "full"}])
    starts = [e for e in events if e["type"] == "tool_start"]
    ends = [e for e in events if e["type"] == "tool_end"]
    assert starts[0]["name"] == "bash" and starts[0]["input"] == {"command": "cat data.json"}
    assert ends[0]["id"] == starts[0]["id"] and ends[0]["success"] is True
    assert json.loads(ends[0]["output"]) == {"name": "ann", "age": 30}
    assert "".join(e["content"] for e in events if e["type"] == "text").startswith("done")
    result = events[-1]
    assert result["success"] is True and result["modifiedPath"] == "/users/0"
    expected = json.loads(json.dumps(TABLE))
    expected["users"][0]["name"] = "ANN"
    assert result["updatedData"] == expected
    # The model had only bash, and was told where the node is.
    request = scripted_llm.requests[0]
    assert [t["function"]["name"] for t in request["tools"]] == ["bash"]
    assert "/c/data.json: the node at JSON pointer /users/0" in request["messages"][0]["content"]
    first = events[0]
    assert first["type"] == "status" and first["conversation_id"] == "c" and first["run_id"]


def test_several_access_points_map_to_numbered_files(agents, scripted_llm):
    scripted_llm.responder = bash_then_answer(
        edit("d.append(3)", "data_2.json") + " && " + edit("d['v'] = 2")
    )
    events = run(
        agents,
        tableData={"meta": {"v": 1}, "list": [1, 2], "gone": None},
        bashAccessPoints=[
            {"path": "/meta", "mode": "full"},
            {"path": "/missing", "mode": "full"},
            {"path": "/list", "mode": "full"},
        ],
    )
    result = events[-1]
    assert result["success"] is True, result
    assert result["updatedData"] == {"meta": {"v": 2}, "list": [1, 2, 3], "gone": None}
    assert result["modifiedPath"] == ["/meta", "/list"]


def test_root_pointer_and_escapes(agents, scripted_llm):
    scripted_llm.responder = bash_then_answer(edit("d['x'] = 1"))
    table = {"a/b": {"c~d": {"k": 0}}}
    events = run(agents, tableData=table, bashAccessPoints=[{"path": "/a~1b/c~0d", "mode": "full"}])
    assert events[-1]["updatedData"] == {"a/b": {"c~d": {"k": 0, "x": 1}}}
    scripted_llm.responder = bash_then_answer(edit("d['top'] = True"))
    events = run(agents, tableData=table, bashAccessPoints=[{"path": "", "mode": "full"}])
    assert events[-1]["updatedData"] == {**table, "top": True}
    assert events[-1]["modifiedPath"] == "/"


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        pytest.param("echo '{\"name\": ' > data.json", "is not valid JSON", id="invalid-json"),
        pytest.param("rm data.json", "was deleted", id="deleted"),
    ],
)
def test_what_the_agent_broke_leaves_the_table_untouched(agents, scripted_llm, command, reason):
    scripted_llm.responder = bash_then_answer(command)
    events = run(agents, tableData=TABLE, bashAccessPoints=[{"path": "/users/1", "mode": "full"}])
    error, result = events[-2], events[-1]
    assert error["type"] == "error" and reason in error["error"]
    assert result["success"] is False and result["updatedData"] is None
    assert reason in result["error"] and "data.json" in result["error"]


def test_readonly_node_is_not_merged(agents, scripted_llm):
    scripted_llm.responder = bash_then_answer("cat data.json")
    events = run(agents, tableData=TABLE, bashAccessPoints=[{"path": "/meta", "mode": "readonly"}])
    assert json.loads(next(e for e in events if e["type"] == "tool_end")["output"]) == {"v": 1}
    assert events[-1] == {
        "type": "result",
        "success": True,
        "updatedData": None,
        "modifiedPath": None,
        "answer": events[-1]["answer"],
    }
    assert "READ-ONLY" in scripted_llm.requests[0]["messages"][0]["content"]


@pytest.mark.skipif(not landlock.abi_version(), reason="no Landlock here")
def test_readonly_node_holds_beside_a_full_one(agents, scripted_llm):
    scripted_llm.responder = bash_then_answer(
        "echo '{}' > data.json; rm -f data.json; mv data_2.json data.json; cat data.json",
        edit("d.append('x')", "data_2.json"),
    )
    events = run(
        agents,
        tableData={"meta": {"v": 1}, "list": [1]},
        bashAccessPoints=[{"path": "/meta", "mode": "readonly"}, {"path": "/list", "mode": "full"}],
        conversation_id="ro",
    )
    attack = next(e for e in events if e["type"] == "tool_end")
    assert attack["output"].count("Permission denied") >= 3, attack["output"]
    assert '{"v": 1}' in attack["output"]  # cat: still the node as written
    result = events[-1]
    assert result["success"] is True and result["modifiedPath"] == "/list"
    assert result["updatedData"] == {"meta": {"v": 1}, "list": [1, "x"]}


def test_without_nodes_the_file_tools_work_in_the_working_directory(
    agents, user, scripted_llm, chat_server
):
    r = agents.post(
        f"/api/v1/sessions/sb-session-{user}/files/upload",
        files={"file": ("notes.txt", b"alpha\nbeta\n")},
        data={"conversation_id": "c"},
    )
    assert r.status_code == 201
    calls = [
        ("grep_search", {"pattern": "bet"}),
        ("read_file", {"path": "notes.txt"}),
        ("read_file", {"path": "../../outputs/x"}),
        ("read_file", {"path": "/etc/hostname"}),
        ("glob_search", {"pattern": "../../*"}),
    ]

    def respond(body: dict) -> Reply:
        done = len(tool_results(body))
        if done < len(calls):
            return tool_reply(*calls[done], call_id=f"call_{done}")
        return text_reply("ok")

    scripted_llm.responder = respond
    events = run(
        agents,
        tableData=TABLE,
        bashAccessPoints=[{"path": "/nobody", "mode": "full"}],
        workingDirectory="uploads/temparea",
    )
    tools = [t["function"]["name"] for t in scripted_llm.requests[0]["tools"]]
    assert tools == ["read_file", "glob_search", "grep_search"]
    ends = [e for e in events if e["type"] == "tool_end"]
    assert "notes.txt:2: beta" in ends[0]["output"] and ends[0]["success"]
    assert ends[1]["output"] == "alpha\nbeta\n"
    for outside in ends[2:4]:
        assert not outside["success"] and "outside the working directory" in outside["output"]
    assert ends[4]["output"].strip() == "(no matches)"
    assert events[-1]["success"] is True and events[-1]["updatedData"] is None


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        pytest.param({"prompt": " "}, 422, "invalid_request", id="blank-prompt"),
        pytest.param(
            {"bashAccessPoints": [{"path": "x", "mode": "full"}]},
            422,
            "invalid_request",
            id="pointer-without-slash",
        ),
        pytest.param(
            {"bashAccessPoints": [{"path": "/a~2", "mode": "full"}]},
            422,
            "invalid_request",
            id="bad-escape",
        ),
        pytest.param(
            {"bashAccessPoints": [{"path": "/a", "mode": "write"}]},
            422,
            "invalid_request",
            id="bad-mode",
        ),
        pytest.param(
            {
                "bashAccessPoints": [
                    {"path": "/a", "mode": "full"},
                    {"path": "/a/b", "mode": "readonly"},
                ]
            },
            400,
            "overlapping_access_points",
            id="overlap",
        ),
        pytest.param(
            {"workingDirectory": "../other"}, 400, "invalid_working_directory", id="dotdot"
        ),
        pytest.param(
            {"workingDirectory": "/etc"}, 400, "invalid_working_directory", id="absolute-outside"
        ),
        pytest.param(
            {"workingDirectory": "a\\b"}, 400, "invalid_working_directory", id="backslash"
        ),
        pytest.param({"conversation_id": "../x"}, 400, "invalid_conversation_id", id="bad-cid"),
        pytest.param({"table_id": 7}, 503, "table_source_not_configured", id="no-table-source"),
        pytest.param(
            {"chatHistory": [{"role": "tool", "content": "x"}]},
            422,
            "invalid_request",
            id="bad-history",
        ),
    ],
)
def test_bad_requests(agents, body, status, code):
    r = agents.post("/api/v1/agents", json={"prompt": "p", "conversation_id": "c", **body})
    assert (r.status_code, r.json()["error"]["code"]) == (status, code), r.text
    assert "retry-after" not in r.headers  # none of these is cured by waiting


def test_run_failure_ends_with_error_then_result(agents, scripted_llm):
    scripted_llm.responder = lambda body: Reply(status=400)
    events = run(agents, tableData=TABLE, bashAccessPoints=[{"path": "/meta", "mode": "full"}])
    assert [e["type"] for e in events[-2:]] == ["error", "result"]
    assert events[-1]["success"] is False and events[-1]["updatedData"] is None


def test_without_conversation_id_a_conversation_of_its_own(agents, scripted_llm):
    with agents.stream("POST", "/api/v1/agents", json={"prompt": "hi"}) as r:
        events = events_of(r)
    cid = events[0]["conversation_id"]
    assert cid.startswith("agent-") and events[-1]["success"] is True
    history = [{"role": "user", "content": "before"}, {"role": "assistant", "content": "ok"}]
    run(agents, chatHistory=history)
    assert scripted_llm.requests[-1]["messages"][1:3] == history


def test_readonly_is_refused_where_it_cannot_be_enforced(
    start_server, scripted_llm_server, scripted_llm, chat_env_factory, user
):
    server = start_server(
        "dev",
        "--data-dir",
        "data",
        **chat_env_factory(scripted_llm_server, SANDBOX_WORKSPACE_CONFINEMENT="none"),
    )
    with httpx.Client(base_url=server.url, headers={"X-User-Id": user}, timeout=60) as client:
        events = run(
            client, tableData=TABLE, bashAccessPoints=[{"path": "/meta", "mode": "readonly"}]
        )
        assert events[-2]["code"] == "read_only_unavailable"
        assert events[-1]["success"] is False and not scripted_llm.requests
        r = client.post(
            "/api/v1/sandboxes", json={"action": "start", "session_id": "s", "readonly": True}
        )
        assert r.status_code == 503 and r.json()["data"] == {"code": "read_only_unavailable"}
        # A full node needs no enforcement: that run goes ahead.
        scripted_llm.responder = lambda body: text_reply("fine")
        events = run(client, tableData=TABLE, bashAccessPoints=[{"path": "/meta", "mode": "full"}])
        assert events[-1]["success"] is True
        client.delete(f"/api/v1/sessions/sb-session-{user}")
