"""Runs: background agent loops whose events are kept in an append-only log.

Contract:
- ``Run.emit`` appends an event with the next id (1, 2, 3, …) and wakes every follower.
  ``Run.follow(after)`` yields every event with id > ``after`` exactly once, in order, then
  waits for more until the run is finished — which is how a client that dropped and comes
  back with ``Last-Event-ID`` receives every missed event once. Events that arrived
  together are handed over as one batch (one write to the client, not one per token).
  The run itself never depends on anyone following it.
- Approvals: ``open_approval`` registers a pending tool call — before the
  ``tool_approval`` event goes out, so a client that answers at once is never told the
  call is unknown — and ``decision`` waits (bounded) for ``decide``; no decision in time
  counts as a rejection. Deciding twice is a 409, an unknown call a 404.
- ``RunRegistry`` owns runs per process: only the user who started a run can see it (any
  other answers 404), finished runs are dropped after ``retention`` seconds.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from sandbox_workspace.runtime.errors import Conflict, NotFoundError


@dataclass(frozen=True)
class RunEvent:
    id: int
    kind: str
    data: dict[str, Any]


@dataclass
class Decision:
    approved: bool
    reason: str = ""
    by_timeout: bool = False


@dataclass
class _Pending:
    name: str
    future: asyncio.Future
    decided: bool = False


@dataclass
class Run:
    user_id: str
    session_id: str
    conversation_id: str
    id: str = field(default_factory=lambda: f"run_{uuid.uuid4().hex}")
    events: list[RunEvent] = field(default_factory=list)
    finished_at: float | None = None
    task: asyncio.Task | None = None
    _wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    _pending: dict[str, _Pending] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.finished_at is not None

    @property
    def awaiting_approval(self) -> bool:
        return any(not p.decided for p in self._pending.values())

    def emit(self, kind: str, data: dict[str, Any] | None = None) -> RunEvent:
        event = RunEvent(len(self.events) + 1, kind, data or {})
        self.events.append(event)
        self._notify()
        return event

    def finish(self) -> None:
        if self.finished_at is None:
            self.finished_at = time.monotonic()
        self._notify()

    def _notify(self) -> None:
        self._wakeup.set()
        self._wakeup = asyncio.Event()

    async def follow(
        self, after: int = 0, idle: float | None = None
    ) -> AsyncIterator[list[RunEvent]]:
        """Batches of the events after ``after`` as they come; an empty batch each time
        ``idle`` seconds pass without one (the caller's cue for a keep-alive)."""
        position = max(0, after)
        while True:
            wakeup = self._wakeup
            if position < len(self.events):
                batch = self.events[position:]
                position += len(batch)
                yield batch
                continue
            if self.finished:
                return
            try:
                async with asyncio.timeout(idle):
                    await wakeup.wait()
            except TimeoutError:
                yield []

    def open_approval(self, call_id: str, name: str) -> None:
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._pending[call_id] = _Pending(name=name, future=future)

    async def decision(self, call_id: str, timeout: float) -> Decision:
        future = self._pending[call_id].future
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        except TimeoutError:
            self._pending[call_id].decided = True
            return Decision(False, f"no decision within {timeout:g}s", by_timeout=True)

    def decide(self, call_id: str, approved: bool, reason: str = "") -> None:
        pending = self._pending.get(call_id)
        if pending is None:
            raise NotFoundError(
                f"run '{self.id}' has no tool call '{call_id}' awaiting approval",
                code="unknown_tool_call",
            )
        if pending.decided:
            raise Conflict(f"tool call '{call_id}' was already decided", code="already_decided")
        pending.decided = True
        pending.future.set_result(Decision(approved, reason))

    def cancel(self) -> bool:
        if self.finished or self.task is None:
            return False
        self.task.cancel()
        return True


class RunRegistry:
    def __init__(self, retention_seconds: float) -> None:
        self.retention = retention_seconds
        self._runs: dict[str, Run] = {}

    def add(self, run: Run) -> Run:
        self._prune()
        self._runs[run.id] = run
        return run

    def get(self, run_id: str, user_id: str) -> Run:
        run = self._runs.get(run_id)
        if run is None or run.user_id != user_id:
            raise NotFoundError(f"run '{run_id}' not found")
        return run

    def all(self) -> list[Run]:
        return list(self._runs.values())

    def _prune(self) -> None:
        now = time.monotonic()
        for run_id in [
            i
            for i, r in self._runs.items()
            if r.finished_at is not None and now - r.finished_at > self.retention
        ]:
            del self._runs[run_id]

    async def aclose(self) -> None:
        tasks = [r.task for r in self._runs.values() if r.task and not r.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
