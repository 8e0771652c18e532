"""SSE frames (api/sse.py): the one-token fast path writes what ``json.dumps`` writes."""

from __future__ import annotations

import datetime
import json

import pytest

from sandbox_workspace.api.sse import encode_event

_TEXTS = ["", "plain", "a\nb\r\t", '"quoted" \\ /', "\x00\x1f\x7f", "é中😀", "\u2028\u2029"]


def _reference(event_id, kind, data) -> bytes:
    payload = json.dumps(data, separators=(",", ":"), ensure_ascii=False, default=str)
    return f"id: {event_id}\nevent: {kind}\ndata: {payload}\n\n".encode()


@pytest.mark.parametrize("text", _TEXTS)
def test_a_token_event_is_byte_for_byte_the_json_encoders(text):
    assert encode_event(7, "text", {"delta": text}) == _reference(7, "text", {"delta": text})
    assert encode_event(8, "x", {text: "v"}) == _reference(8, "x", {text: "v"})


@pytest.mark.parametrize(
    "data",
    [{}, {"n": 1}, {"a": "b", "c": "d"}, {1: "one"}, {"at": datetime.date(2026, 1, 2)}, [1]],
)
def test_every_other_shape_goes_through_the_encoder(data):
    assert encode_event("9", "k", data) == _reference("9", "k", data)


def test_a_lone_surrogate_fails_as_before():
    with pytest.raises(UnicodeEncodeError):
        encode_event(1, "text", {"delta": "\ud800"})
