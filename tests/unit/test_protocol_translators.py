"""Run events → AI SDK UI message stream and AG-UI events: the pure translators, whole."""

from __future__ import annotations

import json

import pytest

from sandbox_workspace.api.chat.ag_ui import AgUiStream
from sandbox_workspace.api.chat.agents_stream import AgentsStream
from sandbox_workspace.api.chat.agents_stream import encode as encode_agents
from sandbox_workspace.api.chat.run_events import (
    RunEvent,
    encode_data,
    parse_approval_id,
    parse_frame,
    raw_delta,
    translation,
)
from sandbox_workspace.api.chat.ui_stream import UiMessageStream
from sandbox_workspace.api.sse import encode_event
from sandbox_workspace.contract.errors import BadRequest

RUN = "run_abc"


def events(*items: tuple[str, dict]) -> list[RunEvent]:
    return [RunEvent(i, kind, data) for i, (kind, data) in enumerate(items, 1)]


def feed(translator, evs) -> list[dict]:
    out = []
    for e in evs:
        out += translator.feed(e)
    return out


APPROVAL = events(
    ("run_started", {"run_id": RUN}),
    ("text", {"delta": "Let me "}),
    ("text", {"delta": "check."}),
    ("tool_approval", {"tool_call_id": "c1", "name": "bash", "arguments": '{"command":"ls"}'}),
    ("tool_start", {"tool_call_id": "c1", "name": "bash", "arguments": '{"command":"ls"}'}),
    ("tool_end", {"tool_call_id": "c1", "name": "bash", "ok": True, "output": "a.csv"}),
    ("text", {"delta": "Done"}),
    ("result", {"answer": "Done", "files": [], "presented": []}),
    ("done", {"run_id": RUN}),
)


def test_frames_parse_back_to_the_events_encoded():
    frame = encode_event(7, "text", {"delta": "é\nx"})
    assert parse_frame(frame) == RunEvent(7, "text", {"delta": "é\nx"})


def test_ui_stream_ends_a_response_at_an_approval_request():
    t = UiMessageStream(RUN, "msg_1", {"run_id": RUN})
    assert feed(t, APPROVAL[:4]) == [
        {"type": "start", "messageId": "msg_1", "messageMetadata": {"run_id": RUN}},
        {"type": "start-step"},
        {"type": "text-start", "id": "text-2"},
        {"type": "text-delta", "id": "text-2", "delta": "Let me "},
        {"type": "text-delta", "id": "text-2", "delta": "check."},
        {"type": "text-end", "id": "text-2"},
        {"type": "tool-input-available", "toolCallId": "c1", "toolName": "bash",
         "input": {"command": "ls"}},
        {"type": "tool-approval-request", "approvalId": f"{RUN}:c1", "toolCallId": "c1"},
        {"type": "finish-step"},
        {"type": "finish", "finishReason": "tool-calls"},
    ]  # fmt: skip
    assert t.ended and t.feed(APPROVAL[4]) == []


def test_ui_stream_continuation_does_not_announce_the_approved_call_again():
    t = UiMessageStream(RUN, "msg_1", announced={"c1"})
    assert feed(t, APPROVAL[4:]) == [
        {"type": "start", "messageId": "msg_1"},
        {"type": "start-step"},
        {"type": "tool-output-available", "toolCallId": "c1",
         "output": {"output": "a.csv", "duration_ms": 0}},
        {"type": "text-start", "id": "text-7"},
        {"type": "text-delta", "id": "text-7", "delta": "Done"},
        {"type": "text-end", "id": "text-7"},
        {"type": "data-outputs", "data": {"files": [], "presented": []}},
        {"type": "finish-step"},
        {"type": "finish", "finishReason": "stop"},
    ]  # fmt: skip


def test_ui_stream_replay_goes_past_answered_approvals():
    t = UiMessageStream(RUN, "msg_1", decided={"c1"})
    kinds = [c["type"] for c in feed(t, APPROVAL)]
    assert kinds.count("finish") == 1 and kinds[-1] == "finish"
    assert "tool-approval-request" in kinds and "tool-output-available" in kinds


@pytest.mark.parametrize(
    ("end", "expected"),
    [
        pytest.param(
            {"decision": "rejected", "ok": False, "output": "no"},
            {"type": "tool-output-denied", "toolCallId": "c1"},
            id="rejected",
        ),
        pytest.param(
            {"decision": "timeout", "ok": False, "output": "late"},
            {"type": "tool-output-denied", "toolCallId": "c1"},
            id="timeout",
        ),
        pytest.param(
            {"decision": "denied", "ok": False, "output": "denied by policy"},
            {"type": "tool-output-error", "toolCallId": "c1", "errorText": "denied by policy"},
            id="policy",
        ),
        pytest.param(
            {"ok": False, "output": "exit 1"},
            {"type": "tool-output-error", "toolCallId": "c1", "errorText": "exit 1"},
            id="failed",
        ),
    ],
)
def test_ui_stream_tool_outcomes(end, expected):
    t = UiMessageStream(RUN, "m")
    out = t.feed(RunEvent(1, "tool_end", {"tool_call_id": "c1", "name": "bash", **end}))
    assert out[2]["type"] == "tool-input-available" and out[3] == expected


def test_ui_stream_presents_files_and_reports_errors():
    t = UiMessageStream(RUN, "m")
    presented = [{"name": "chart.png", "path": "/w/c/outputs/chart.png", "download_url": "/dl"}]
    out = t.feed(RunEvent(1, "result", {"answer": "", "files": [], "presented": presented}))
    assert {"type": "file", "url": "/dl", "mediaType": "image/png"} in out
    t = UiMessageStream(RUN, "m")
    out = t.feed(RunEvent(1, "error", {"code": "max_iterations", "message": "no answer"}))
    assert out[2:] == [
        {"type": "error", "errorText": "no answer (max_iterations)"},
        {"type": "finish-step"},
        {"type": "finish", "finishReason": "error"},
    ]
    t = UiMessageStream(RUN, "m")
    out = t.feed(RunEvent(1, "error", {"code": "cancelled", "message": "the run was cancelled"}))
    assert out[2] == {"type": "abort", "reason": "the run was cancelled"}


def test_ui_chunks_are_sse_data_lines():
    assert encode_data({"type": "text-delta", "delta": "a\nb"}) == (
        b'data: {"type":"text-delta","delta":"a\\nb"}\n\n'
    )


def test_ag_ui_approval_ends_the_run_with_an_interrupt():
    t = AgUiStream("conv", "client-run", RUN)
    out = feed(t, APPROVAL[:4])
    assert [e["type"] for e in out] == [
        "RUN_STARTED",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "RUN_FINISHED",
    ]
    assert out[0] == {
        "type": "RUN_STARTED",
        "threadId": "conv",
        "runId": "client-run",
        "metadata": {"sandbox_run_id": RUN},
    }
    interrupt = out[-1]["outcome"]["interrupts"][0]
    assert out[-1]["outcome"]["type"] == "interrupt"
    assert (interrupt["id"], interrupt["reason"], interrupt["toolCallId"]) == (
        f"{RUN}:c1",
        "tool_approval",
        "c1",
    )
    assert t.ended


def test_ag_ui_resumed_run_carries_the_result_and_succeeds():
    t = AgUiStream("conv", "run-2", RUN, announced={"c1"})
    out = feed(t, APPROVAL[4:])
    assert [e["type"] for e in out] == [
        "RUN_STARTED",
        "TOOL_CALL_RESULT",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "RUN_FINISHED",
    ]
    assert out[1]["content"] == "a.csv" and out[1]["role"] == "tool"
    assert out[-1]["outcome"] == {"type": "success"}
    assert out[-1]["result"] == {"answer": "Done", "files": [], "presented": []}


@pytest.mark.parametrize(
    ("error", "terminal"),
    [
        ({"code": "cancelled", "message": "x"}, {"type": "cancelled"}),
        ({"code": "llm_error", "message": "model down"}, None),
    ],
)
def test_ag_ui_errors(error, terminal):
    t = AgUiStream("conv", "r", RUN)
    out = t.feed(RunEvent(1, "error", error))
    if terminal:
        assert out[-1]["type"] == "RUN_FINISHED" and out[-1]["outcome"] == terminal
    else:
        assert out[-1] == {"type": "RUN_ERROR", "message": "model down", "code": "llm_error"}
    assert t.ended


def test_ag_ui_skips_empty_deltas_it_would_otherwise_send_invalid():
    t = AgUiStream("conv", "r", RUN)
    assert [e["type"] for e in t.feed(RunEvent(1, "text", {"delta": ""}))] == ["RUN_STARTED"]


@pytest.mark.parametrize("bad", ["", "x", "run_abc", ":c1", "abc:c1", "run_abc:"])
def test_approval_ids_not_issued_here_are_refused(bad):
    with pytest.raises(BadRequest) as e:
        parse_approval_id(bad)
    assert e.value.code == "invalid_approval_id"


def test_approval_id_round_trip_keeps_colons_in_call_ids():
    assert parse_approval_id(f"{RUN}:call:1") == (RUN, "call:1")
    assert json.loads(json.dumps(parse_approval_id(f"{RUN}:c")))  # plain strings


@pytest.mark.parametrize(
    ("make", "encode"),
    [
        pytest.param(lambda: UiMessageStream(RUN, "m1"), encode_data, id="ai-sdk"),
        pytest.param(lambda: AgUiStream("t", "r", RUN), encode_data, id="ag-ui"),
        pytest.param(AgentsStream, encode_agents, id="agents"),
    ],
)
def test_the_short_way_of_text_deltas_gives_the_same_bytes(make, encode):
    """A delta continuing an open text part is built from the log's frame directly
    (run_events.raw_delta / delta_frame): byte for byte the general way's output."""
    deltas = ["plain", 'quote " and \\ back', "line\nbreak\ttab", "é ✓ 🎉", "</script>", "", "x"]
    frames = [encode_event(1, "run_started", {"run_id": RUN})] + [
        encode_event(i, "text", {"delta": d}) for i, d in enumerate(deltas, 2)
    ]
    general, short = make(), make()
    short_way = 0
    for frame in frames:
        expected = [encode(m) for m in general.feed(parse_frame(frame))]
        raw = raw_delta(frame)
        fast = None if raw is None else short.delta_frame(raw)
        if fast is None:
            got = [encode(m) for m in short.feed(parse_frame(frame))]
        else:
            got, short_way = [fast], short_way + 1
        assert got == expected, frame
    # Every non-empty delta after the first (which opens the text part) went the short way.
    assert short_way == 5 if make is not AgentsStream else short_way == 6
    assert raw_delta(encode_event(3, "status", {"delta": "x"})) is None


@pytest.mark.parametrize(
    ("make", "encode"),
    [
        pytest.param(lambda: UiMessageStream(RUN, "m1"), encode_data, id="ai-sdk"),
        pytest.param(lambda: AgUiStream("t", "r", RUN), encode_data, id="ag-ui"),
        pytest.param(AgentsStream, encode_agents, id="agents"),
    ],
)
@pytest.mark.parametrize("per_batch", [1, 3, 100], ids=["batch1", "batch3", "batch100"])
def test_a_translated_stream_is_byte_for_byte_the_general_way(make, encode, per_batch):
    """What the routes write (``translation``: the short way for deltas, a text part's
    prefix built once) against every event parsed, translated and encoded: the same
    bytes, across text parts closed by a tool step and opened again (a new part, a new
    prefix), whatever the batches; a batch stops at the segment's end."""
    frames = [
        encode_event(i, kind, data)
        for i, (kind, data) in enumerate(
            [
                ("run_started", {"run_id": RUN}),
                ("status", {"stage": "thinking", "message": "m", "iteration": 1}),
                ("text", {"delta": "one "}),
                ("text", {"delta": 'two "quoted"'}),
                ("text", {"delta": ""}),
                ("tool_start", {"tool_call_id": "c1", "name": "bash", "arguments": "{}"}),
                ("tool_end", {"tool_call_id": "c1", "name": "bash", "output": "ok", "ok": True}),
                ("text", {"delta": "three\n"}),
                ("text", {"delta": "four ✓"}),
                ("result", {"answer": "one two", "files": [], "presented": [], "success": True}),
                ("done", {}),
            ],
            1,
        )
    ]
    general = make()
    expected = []
    for frame in frames:
        expected += [encode(m) for m in general.feed(parse_frame(frame))]
        if general.ended:
            break
    step = translation(make(), encode)
    got, ended = [], False
    for start in range(0, len(frames), per_batch):
        out, ended = step(frames[start : start + per_batch])
        got += out
        if ended:  # as EventStream: the segment's last batch
            break
    assert ended
    assert b"".join(got) == b"".join(expected)
    assert got == expected
