"""Tool arguments from the model: checked against each tool's schema, never fatal.

Models add keys a tool does not declare (``language`` on ``execute_code``), send numbers
as strings, negative timeouts, or JSON cut in half. Each is answered to the model as the
tool's result — naming the field and what is expected — and the run goes on; none ends
it with ``internal_error``. End to end with the scripted model; the checker's table of
cases as unit tests.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from scripted_llm import Reply, text_reply, tool_reply, tool_results
from sse_stream import Stream

from sandbox_workspace.api.chat.arguments import InvalidArguments, check_arguments
from sandbox_workspace.api.chat.tools import TOOL_SPECS


def params(tool: str) -> dict:
    return TOOL_SPECS[tool]["function"]["parameters"]


@pytest.fixture
def chat(chat_server, user) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=chat_server.url, headers={"X-User-Id": user}, timeout=60) as client:
        yield client


def one_call_then_answer(scripted_llm, name: str, arguments: str) -> None:
    """The model calls ``name`` with raw ``arguments`` once, then answers."""

    def respond(body: dict) -> Reply:
        results = tool_results(body)
        if not results:
            return tool_reply(name, arguments)
        return text_reply("model saw: " + results[-1]["content"])

    scripted_llm.responder = respond


def run(chat) -> tuple[dict, list[tuple[int, str, dict]]]:
    with chat.stream("POST", "/api/v1/chat", json={"query": "go", "conversation_id": "c"}) as r:
        events = Stream(r).rest()
    tool_end = next(d for _, k, d in events if k == "tool_end")
    return tool_end, events


def test_undeclared_language_key_is_ignored(chat, scripted_llm):
    one_call_then_answer(
        scripted_llm, "execute_code", '{"code": "print(6 * 7)", "language": "python"}'
    )
    end, events = run(chat)
    assert end["ok"] is True and end["output"].strip() == "42"
    assert [k for _, k, _ in events][-2:] == ["result", "done"]


@pytest.mark.parametrize(
    ("tool", "arguments", "says"),
    [
        pytest.param("execute_code", '{"code": 42}', ["'code'", "a string", "42"], id="int-code"),
        pytest.param(
            "execute_code",
            '{"code": "print(1)", "timeout": -5}',
            ["'timeout'", "greater than 0", "-5"],
            id="negative-timeout",
        ),
        pytest.param(
            "execute_code",
            '{"code": "print(1)", "timeout": "soon"}',
            ["'timeout'", "a number"],
            id="string-timeout",
        ),
        pytest.param("execute_code", '{"code": "print(', ["not valid JSON"], id="truncated-json"),
        pytest.param("execute_code", "[1, 2]", ["JSON object"], id="array"),
        pytest.param("execute_code", "{}", ["'code'", "missing"], id="missing-code"),
        pytest.param("bash", '{"command": ""}', ["'command'", "empty"], id="empty-command"),
        pytest.param(
            "read_file",
            '{"path": "x", "max_bytes": 1e9}',
            ["'max_bytes'", "at most 65536"],
            id="huge-max-bytes",
        ),
        pytest.param("execute_code", '{"code": "x = 1\\u0000"}', ["code", "NUL"], id="nul-in-code"),
        pytest.param("present_file", '{"path": "../../etc/passwd"}', ["present_file"], id="escape"),
    ],
)
def test_bad_arguments_are_told_to_the_model(chat, scripted_llm, tool, arguments, says):
    one_call_then_answer(scripted_llm, tool, arguments)
    end, events = run(chat)
    assert end["ok"] is False
    for word in says:
        assert word in end["output"], end["output"]
    kinds = [k for _, k, _ in events]
    assert "error" not in kinds and kinds[-2:] == ["result", "done"]
    told = tool_results(scripted_llm.requests[-1])[-1]["content"]
    assert told == end["output"]  # the model gets the same explanation, and can retry


@pytest.mark.parametrize(
    ("tool", "raw", "expected"),
    [
        pytest.param("execute_code", '{"code": "x", "timeout": 5}', {"code": "x", "timeout": 5}),
        pytest.param("execute_code", '{"code": "x", "timeout": null}', {"code": "x"}, id="null"),
        pytest.param(
            "read_file", '{"path": "p", "max_bytes": 10.0}', {"path": "p", "max_bytes": 10}
        ),
        pytest.param("list_files", "", {}, id="no-arguments"),
        pytest.param("bash", '{"command": "ls", "cwd": "/"}', {"command": "ls"}, id="extra-key"),
    ],
)
def test_accepted_arguments(tool, raw, expected):
    assert check_arguments(tool, raw, params(tool)) == expected


@pytest.mark.parametrize(
    "raw",
    [
        '{"code": true}',
        '{"code": "x", "timeout": true}',
        '{"code": "x", "timeout": 0}',
        '{"code": "x", "timeout": NaN}',
        '{"code": "x", "timeout": Infinity}',
        '"just a string"',
        "null",
        "{",
    ],
)
def test_refused_arguments(raw):
    with pytest.raises(InvalidArguments):
        check_arguments("execute_code", raw, params("execute_code"))
