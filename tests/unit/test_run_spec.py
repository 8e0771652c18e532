"""api/chat/spec.py: a RunSpec is plain data — it survives JSON unchanged, so the replica
that carries a run on rebuilds it from the run store alone (what a run reaches outside the
model comes as a RunConversation, not inside the spec)."""

from __future__ import annotations

import dataclasses
import json

from sandbox_workspace.api.chat.spec import RunSpec, spec_data, spec_from_data


def test_a_spec_comes_back_from_json_as_it_was():
    spec = RunSpec(
        query="q",
        history=[{"role": "user", "content": "hi"}],
        selected_files=["a.csv"],
        policies={"bash": "require_approval"},
        max_iterations=3,
        deadline_seconds=600,
        approval_timeout=30,
        tool_timeout=20,
        table={"tools": ["bash"], "table_id": None},
    )
    back = spec_from_data(json.loads(json.dumps(spec_data(spec))))
    assert 599 < back.deadline_seconds <= 600  # a wall-clock deadline: time went by
    assert dataclasses.replace(back, deadline_seconds=600) == spec


def test_a_spec_holds_no_callable():
    hints = {f.name: str(f.type) for f in dataclasses.fields(RunSpec)}
    assert not [name for name, hint in hints.items() if "Callable" in hint]
