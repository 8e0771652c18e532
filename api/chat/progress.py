"""A run's progress through its ReAct loop, as a replicated run store keeps it.

Contract: ``Progress`` is everything the loop needs to carry on after its last completed
step — the iteration, the messages so far, the tool calls of the last model answer not yet
done, an approval already announced (and until when it may be answered), the outputs
listing taken before the first tool call and the files presented. ``snapshot()`` is its
JSON (taken at once: the loop mutates the object afterwards). ``in_flight`` names a tool
call that has started and not ended: such a step is never repeated by another replica.

(The JSON-able half of the run's ``RunSpec`` is ``spec.spec_data``.)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field


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
