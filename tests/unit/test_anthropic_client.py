"""The Anthropic Messages client (api/chat/anthropic_messages.py) against a raw HTTP/1.1
server on loopback that speaks the Messages streaming protocol byte by byte
(tests/support/raw_http.py, events from tests/support/scripted_messages.py): text, a tool
call whose input JSON comes in fragments, stop reasons, 429/529 with retry-after, an
error event mid-stream, the stall watchdog — and the conversation it sends."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from raw_http import LAST_CHUNK, OK_HEAD, Script, chunk, collect, serve, stream_until_error
from scripted_messages import message_end, message_start, sse, text_block, tool_block

from sandbox_workspace.api.chat.anthropic_messages import _EARLIER, AnthropicClient, to_messages
from sandbox_workspace.api.chat.llm import Completion, LlmConfig, LlmError

_HI = {"role": "user", "content": "hi"}


def _events(*events: dict) -> bytes:
    return chunk(b"".join(sse(e) for e in events))


def _answer(*events: dict) -> list[bytes | float]:
    return [OK_HEAD, _events(*events), LAST_CHUNK]


def _text(*pieces: str, stop: str = "end_turn") -> list[bytes | float]:
    return _answer(
        message_start(), {"type": "ping"}, *text_block(0, list(pieces)), *message_end(stop)
    )


def _client(url: str, read_timeout: float = 5.0, retries: int = 2) -> AnthropicClient:
    return AnthropicClient(
        LlmConfig(
            base_url=url,
            model="claude-test",
            api_key="sk-test",
            read_timeout=read_timeout,
            connect_timeout=2.0,
            max_retries=retries,
            backoff_seconds=0.01,
            max_tokens=1234,
        )
    )


async def _collect(client: AnthropicClient, messages=None, tools=None):
    return await collect(client, messages or [_HI], tools)


def _run(script: Script, **client_args):
    async def go():
        server, url = await serve(script)
        async with server:
            return await _collect(_client(url, **client_args))

    return asyncio.run(go())


def _error(script: Script, **client_args) -> LlmError:
    with pytest.raises(LlmError) as caught:
        _run(script, **client_args)
    return caught.value


def test_text_streams_piece_by_piece_with_the_headers_and_body_of_the_messages_api():
    script = Script(_text("Hel", "lo ", "there"))
    texts, completion = _run(script)
    assert texts == ["Hel", "lo ", "there"]
    assert completion == Completion("Hello there", [], "stop")
    head = script.heads[0].decode().lower()
    assert head.startswith("post /v1/messages http/1.1")
    assert "x-api-key: sk-test" in head and "anthropic-version: 2023-06-01" in head
    assert "authorization" not in head
    body = json.loads(script.bodies[0])
    assert body == {
        "model": "claude-test",
        "max_tokens": 1234,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "stream": True,
    }


def test_a_tool_call_whose_input_json_comes_in_fragments_is_reassembled():
    args = {"code": 'print("a, b")\nprint(1)', "timeout": 5}
    text = json.dumps(args)
    pieces = ["", text[:7], text[7:15], text[15:16], text[16:]]  # cut inside strings
    events = [
        message_start(),
        *text_block(0, ["Let me ", "check."]),
        *tool_block(1, "toolu_01", "execute_code", pieces),
        *tool_block(2, "toolu_02", "list_files", [""]),  # a tool without input
        *message_end("tool_use"),
    ]
    # The body is written in 7-byte pieces: events split anywhere, even inside a line.
    raw = b"".join(sse(e) for e in events)
    steps: list[bytes | float] = [OK_HEAD]
    steps += [chunk(raw[i : i + 7]) for i in range(0, len(raw), 7)]
    steps.append(LAST_CHUNK)
    texts, completion = _run(Script(steps))
    assert texts == ["Let me ", "check."]
    assert completion.finish_reason == "tool_calls" and completion.content == "Let me check."
    assert [(c.id, c.name) for c in completion.tool_calls] == [
        ("toolu_01", "execute_code"),
        ("toolu_02", "list_files"),
    ]
    assert json.loads(completion.tool_calls[0].arguments) == args
    assert completion.tool_calls[1].arguments == "{}"


@pytest.mark.parametrize(
    ("stop_reason", "finish"),
    [
        pytest.param("end_turn", "stop", id="end_turn"),
        pytest.param("stop_sequence", "stop", id="stop_sequence"),
        pytest.param("max_tokens", "length", id="max_tokens"),
        pytest.param("tool_use", "tool_calls", id="tool_use"),
        pytest.param("refusal", "content_filter", id="refusal"),
        pytest.param("pause_turn", "pause_turn", id="unknown-kept"),
    ],
)
def test_stop_reasons_are_told_in_the_loops_vocabulary(stop_reason, finish):
    _, completion = _run(Script(_text("x", stop=stop_reason)))
    assert completion.finish_reason == finish


@pytest.mark.parametrize("status", [429, 529])
def test_429_and_529_are_retried_after_retry_after_then_stream(status):
    busy = (
        b"HTTP/1.1 %d Busy\r\nretry-after: 0.3\r\ncontent-type: application/json\r\n"
        b'content-length: 57\r\n\r\n{"type":"error","error":{"type":"x","message":"busy!!"}}'
        % status
    )
    script = Script([busy], _text("ok"))
    started = time.monotonic()
    texts, completion = _run(script)
    assert texts == ["ok"] and completion.content == "ok" and script.requests == 2
    assert time.monotonic() - started >= 0.3, "retry-after was not honoured"


def test_529_after_the_last_retry_is_llm_http_error_saying_so():
    overloaded = (
        b"HTTP/1.1 529 Overloaded\r\ncontent-length: 67\r\n\r\n"
        b'{"type":"error","error":{"type":"overloaded_error","message":"Ov"}}'
    )
    script = Script([overloaded])
    error = _error(script, retries=1)
    assert (
        error.code == "llm_http_error" and "529" in str(error) and "overloaded_error" in str(error)
    )
    assert script.requests == 2


def test_a_4xx_is_not_retried():
    bad = b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 11\r\n\r\nbad api key"
    script = Script([bad])
    error = _error(script)
    assert error.code == "llm_http_error" and "401" in str(error) and script.requests == 1


def test_an_error_event_mid_stream_ends_the_stream_after_the_text_before_it():
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    steps = [
        OK_HEAD,
        _events(message_start(), *text_block(0, ["partial "])[:2]),
        _events(error),
        LAST_CHUNK,
    ]

    texts, error, _ = stream_until_error(Script(steps), _client, [_HI])
    assert texts == ["partial "]
    assert error.code == "llm_stream_error" and "overloaded_error: Overloaded" in str(error)


def test_a_stall_mid_stream_ends_it_with_llm_timeout_after_the_timeout():
    steps: list[bytes | float] = [
        OK_HEAD,
        _events(message_start(), *text_block(0, ["before"])[:2]),
        30.0,
        _events(*message_end()),
    ]

    script = Script(steps)
    texts, error, took = stream_until_error(script, lambda url: _client(url, 0.4), [_HI])
    assert texts == ["before"]
    assert error.code == "llm_timeout" and "0.4s" in str(error)
    assert 0.4 <= took < 5, took


def test_pings_keep_a_slow_stream_alive_and_are_not_text():
    steps: list[bytes | float] = [OK_HEAD, _events(message_start())]
    for _ in range(4):
        steps += [0.15, _events({"type": "ping"})]
    steps += [_events(*text_block(0, ["done"]), *message_end()), LAST_CHUNK]
    texts, completion = _run(Script(steps), read_timeout=0.3)
    assert texts == ["done"] and completion.finish_reason == "stop"


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(_events(message_start(), *text_block(0, ["cut"])), id="no-message_stop"),
        pytest.param(b"40\r\nevent: content_block_delta\ndata: {", id="cut-inside-a-chunk"),
    ],
)
def test_a_stream_that_ends_unfinished_is_llm_stream_broken(body):
    assert _error(Script([OK_HEAD, *body]), retries=0).code == "llm_stream_broken"


def test_a_malformed_event_is_llm_malformed():
    body = _events(message_start()) + chunk(b'data: {"type":"content_block_delta","index":0}\n\n')
    assert _error(Script([OK_HEAD, body, LAST_CHUNK])).code == "llm_malformed"


def _call(call_id: str, name: str, arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_the_loops_conversation_goes_out_in_the_messages_shape():
    conversation = [
        {"role": "system", "content": "You are in a sandbox."},
        {"role": "assistant", "content": "Earlier answer"},  # a trimmed history opens so
        {"role": "user", "content": "   "},  # blank: the API refuses empty text blocks
        {"role": "user", "content": "context message"},
        {"role": "user", "content": "the query"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "bash", "arguments": '{"command":"ls"}'},
                },
                {
                    "id": "t2",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"pa'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "a.csv"},
        {"role": "tool", "tool_call_id": "t2", "content": ""},
    ]
    system, turns = to_messages(conversation)
    assert system == "You are in a sandbox."
    assert turns == [
        {"role": "user", "content": [{"type": "text", "text": _EARLIER}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Earlier answer"}]},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "context message"},
                {"type": "text", "text": "the query"},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "t1", "name": "bash", "input": {"command": "ls"}},
                {"type": "tool_use", "id": "t2", "name": "read_file", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "a.csv"},
                {"type": "tool_result", "tool_use_id": "t2", "content": "(no output)"},
            ],
        },
    ]


def test_tools_go_out_with_their_schema_as_input_schema():
    tool = {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run bash.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
    script = Script(_text("ok"))

    async def go():
        server, url = await serve(script)
        async with server:
            await _collect(_client(url), tools=[tool])

    asyncio.run(go())
    assert json.loads(script.bodies[0])["tools"] == [
        {
            "name": "bash",
            "description": "Run bash.",
            "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
        }
    ]
