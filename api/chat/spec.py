"""What a run needs, resolved and validated before it starts: ``RunSpec``, plain data.

``spec_data`` / ``spec_from_data``: a ``RunSpec`` as JSON (the deadline as a wall-clock
time) and back, for the replica that carries a run on. What a run reaches outside the
model — its session, files and activity — is not data: the engine gets it as a
``RunConversation`` (``conversation.py``). The loop (``loop.py``) and the progress a
replicated store keeps (``progress.py``) both import from here, never the reverse.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from .policy import Policy


@dataclass
class RunSpec:
    """Everything a run needs, resolved and validated before it starts."""

    query: str
    history: list[dict]
    selected_files: list[str]  # upload names, already checked to be this conversation's
    policies: dict[str, Policy]
    max_iterations: int
    deadline_seconds: float
    approval_timeout: float
    tool_timeout: float
    # /agents (seed 002): the table plan — its nodes as data.json files, merged back at
    # the end (chat/table_agent.py); None for every other route.
    table: dict | None = None


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


def spec_data(spec: RunSpec) -> dict:
    data = {name: getattr(spec, name) for name in _SPEC_FIELDS}
    data["deadline_at"] = time.time() + spec.deadline_seconds
    data["deadline_seconds"] = spec.deadline_seconds
    return data


def spec_from_data(data: dict) -> RunSpec:
    remaining = data["deadline_at"] - time.time()
    return RunSpec(
        # A run stored before /agents existed has no "table".
        **{name: data[name] if name != "table" else data.get(name) for name in _SPEC_FIELDS},
        deadline_seconds=max(0.001, remaining),
    )
