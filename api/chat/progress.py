"""A run's progress through its ReAct loop, as a replicated run store keeps it.

Contract: ``Progress`` is everything the loop needs to carry on after its last completed
step — the iteration, the messages so far, the tool calls of the last model answer not yet
done, an approval already announced (and until when it may be answered), the outputs
listing taken before the first tool call and the files presented. ``snapshot()`` is its
JSON (taken at once: the loop mutates the object afterwards). ``in_flight`` names a tool
call that has started and not ended: such a step is never repeated by another replica.

``spec_data`` / ``spec_from_data``: the JSON-able half of a ``RunSpec`` (the request and
its limits, with the deadline as a wall-clock time) and its inverse, given the
callbacks the resuming replica binds to its own services.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Progress:
    iteration: int = 1
    messages: list[dict] = field(default_factory=list)
    calls: list[dict] = field(default_factory=list)  # {"id", "name", "arguments"}
    in_flight: str | None = None
    approval: str | None = None  # a tool call whose tool_approval event went out
    approval_deadline: float | None = None  # wall clock
    before: dict | None = None  # OutputList as JSON
    presented: list[dict] = field(default_factory=list)

    def snapshot(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), default=str)

    @classmethod
    def from_data(cls, data: dict) -> Progress:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


_SPEC_FIELDS = (
    "query",
    "history",
    "selected_files",
    "policies",
    "max_iterations",
    "approval_timeout",
    "tool_timeout",
    "table",  # /agents runs: the table plan (table_agent.make_plan), else None
)


def spec_data(spec: Any) -> dict:
    data = {name: getattr(spec, name) for name in _SPEC_FIELDS}
    data["deadline_at"] = time.time() + spec.deadline_seconds
    data["deadline_seconds"] = spec.deadline_seconds
    return data


def spec_from_data(
    data: dict,
    ensure_session: Callable[[], Awaitable[Any]],
    record_activity: Callable[[], Awaitable[None]],
):
    from .loop import RunSpec

    remaining = data["deadline_at"] - time.time()
    return RunSpec(
        # A run stored before /agents existed has no "table".
        **{name: data[name] if name != "table" else data.get(name) for name in _SPEC_FIELDS},
        deadline_seconds=max(0.001, remaining),
        ensure_session=ensure_session,
        record_activity=record_activity,
    )
