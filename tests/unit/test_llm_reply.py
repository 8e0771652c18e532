"""The model stream's lines assembled into a reply (api/chat/llm.py ``_Reply``)."""

from __future__ import annotations

import pytest

from sandbox_workspace.api.chat.llm import LlmError
from sandbox_workspace.api.chat.openai_chat import _Reply


def _data(delta: str, finish: str = "null") -> bytes:
    return b'data: {"choices":[{"delta":%s,"finish_reason":%s}]}' % (
        delta.encode(),
        finish.encode(),
    )


def test_text_comes_line_by_line_and_crlf_comments_and_blanks_are_skipped():
    reply = _Reply()
    lines = [b": comment", _data('{"content":"he"}') + b"\r", b"", _data('{"content":"y"}')]
    assert [reply.feed(line) for line in lines] == [None, "he", None, "y"]
    reply.feed(b"data: [DONE]")
    assert reply.done and reply.completion().content == "hey"


def test_tool_call_fragments_are_joined_in_index_order():
    reply = _Reply()
    reply.feed(_data('{"tool_calls":[{"index":1,"id":"b","function":{"name":"g"}}]}'))
    reply.feed(_data('{"tool_calls":[{"index":0,"function":{"name":"f","arguments":"{\\"a\\""}}]}'))
    reply.feed(_data('{"tool_calls":[{"index":0,"function":{"arguments":":1}"}}]}', '"tool_calls"'))
    completion = reply.completion()
    assert [(c.id, c.name, c.arguments) for c in completion.tool_calls] == [
        ("call_0", "f", '{"a":1}'),
        ("b", "g", ""),
    ]
    assert completion.finish_reason == "tool_calls"


def test_a_malformed_tool_call_fails_only_after_the_text_beside_it():
    reply = _Reply()
    assert reply.feed(_data('{"content":"shown","tool_calls":["not an object"]}')) == "shown"
    with pytest.raises(LlmError, match="malformed tool call"):
        reply.feed(b"")


def test_a_stream_without_finish_or_done_is_broken():
    reply = _Reply()
    reply.feed(_data('{"content":"x"}'))
    with pytest.raises(LlmError) as e:
        reply.completion()
    assert e.value.code == "llm_stream_broken"


def test_content_that_is_not_text_is_malformed():
    reply = _Reply()
    with pytest.raises(LlmError) as caught:
        reply.feed(_data('{"content":{"nested":1}}'))
    assert caught.value.code == "llm_malformed"
