"""Approvals inside a run: the ordering that lets a client answer the moment it is asked."""

from __future__ import annotations

import json

import pytest
from fake_conversation import FakeConversation

from sandbox_workspace.api.chat.loop import RunSpec, _act
from sandbox_workspace.api.chat.runs import Run
from sandbox_workspace.api.chat.tools import SandboxTools
from sandbox_workspace.contract.errors import Conflict, NotFoundError


def _events(run: Run) -> list[tuple[str, dict]]:
    """The run's log as (kind, data), read back from its SSE frames."""
    events = []
    for frame in run.frames:
        fields = dict(line.split(": ", 1) for line in frame.decode().strip().split("\n"))
        events.append((fields["event"], json.loads(fields["data"])))
    return events


def _spec() -> RunSpec:
    return RunSpec(
        query="q",
        history=[],
        selected_files=[],
        policies={"bash": "require_approval"},
        max_iterations=15,
        deadline_seconds=60,
        approval_timeout=30,
        tool_timeout=30,
    )


async def test_an_approval_sent_as_soon_as_the_event_arrives_is_accepted():
    # The API records session activity (a Kubernetes PATCH, slow) after announcing the
    # approval; a client that answers during that PATCH must find the call pending.
    run = Run(user_id="u", session_id="s", conversation_id="c")
    answers = []

    async def record_activity():
        kind, data = _events(run)[-1]
        assert kind == "tool_approval"
        run.decide(data["tool_call_id"], approved=True)
        answers.append(data["tool_call_id"])

    # The arguments are not an object, so the approved tool fails fast without a sandbox.
    tools = SandboxTools(None, session_id="s", conversation_id="c", workspace_path="/w")
    # The session is not ensured by a single tool call (FakeConversation refuses it).
    conversation = FakeConversation(record_activity=record_activity)
    await _act(run, _spec(), conversation, tools, "call_1", "bash", "[]")

    assert answers == ["call_1"]
    assert [kind for kind, _ in _events(run)] == ["tool_approval", "tool_start", "tool_end"]
    assert "decision" not in _events(run)[-1][1]  # it ran; it was not rejected


async def test_deciding_an_open_approval_twice_is_a_conflict():
    run = Run(user_id="u", session_id="s", conversation_id="c")
    run.open_approval("call_1", "bash")
    run.decide("call_1", approved=False, reason="no")
    with pytest.raises(Conflict):
        run.decide("call_1", approved=True)
    decision = await run.decision("call_1", timeout=1)
    assert (decision.approved, decision.reason) == (False, "no")


async def test_deciding_a_call_that_was_never_opened_is_not_found():
    run = Run(user_id="u", session_id="s", conversation_id="c")
    with pytest.raises(NotFoundError):
        run.decide("call_unknown", approved=True)


async def test_no_decision_in_time_is_a_rejection_by_timeout():
    run = Run(user_id="u", session_id="s", conversation_id="c")
    run.open_approval("call_1", "bash")
    decision = await run.decision("call_1", timeout=0.01)
    assert decision.approved is False and decision.by_timeout
    with pytest.raises(Conflict):
        run.decide("call_1", approved=True)
