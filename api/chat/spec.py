"""What a run needs, resolved and validated before it starts: ``RunSpec``.

``spec_data`` / ``spec_from_data``: the JSON-able half of a ``RunSpec`` (the request and
its limits, with the deadline as a wall-clock time) and its inverse, given the
callbacks the resuming replica binds to its own services. The loop (``loop.py``) and the
progress a replicated store keeps (``progress.py``) both import from here, never the
reverse.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from ..backends.base import Session
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
    ensure_session: Callable[[], Awaitable[Session]]
    record_activity: Callable[[], Awaitable[None]] = field(default=lambda: _noop())
    # Before each tool call: raises when the conversation may no longer be written.
    before_tool: Callable[[], Awaitable[None]] = field(default=lambda: _noop())
    # /agents (seed 002): the table plan — its nodes as data.json files, merged back at
    # the end (chat/table_agent.py); None for every other route.
    table: dict | None = None
    # /agents with table_id: PUTs the merged table to the table source (not kept with the
    # run: it carries the caller's credential; a run resumed elsewhere has none).
    write_table: Callable[[Any], Awaitable[None]] | None = None
    # After each tool call and after the run's marks: the conversation may have changed
    # (store mode writes it back; the kubernetes backend re-checks a racing deletion).
    after_write: Callable[[], Awaitable[None]] = field(default=lambda: _noop())


async def _noop() -> None:
    return None


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


def spec_from_data(
    data: dict,
    ensure_session: Callable[[], Awaitable[Any]],
    record_activity: Callable[[], Awaitable[None]],
) -> RunSpec:
    remaining = data["deadline_at"] - time.time()
    return RunSpec(
        # A run stored before /agents existed has no "table".
        **{name: data[name] if name != "table" else data.get(name) for name in _SPEC_FIELDS},
        deadline_seconds=max(0.001, remaining),
        ensure_session=ensure_session,
        record_activity=record_activity,
    )
