"""Runs: background agent loops whose events are kept in an append-only log.

Contract:
- ``Run.emit`` appends an event with the next id (1, 2, 3, …) and wakes every follower.
  ``Run.follow(after)`` yields every event with id > ``after`` exactly once, in order, then
  waits for more until the run is finished — which is how a client that dropped and comes
  back with ``Last-Event-ID`` receives every missed event once. Events that arrived
  together are handed over as one batch (one write to the client, not one per token).
  The run itself never depends on anyone following it.
- The log holds each event as its SSE frame (bytes), encoded once at ``emit``: however
  many clients follow, nothing is encoded twice, and bytes are invisible to the garbage
  collector — a log of objects made full collections walk every event of every open run
  (measured: 30–110 ms pauses with 200 runs streaming, the whole p99 of bench/chat.py).
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

from ..sse import encode_event


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


def _idle(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(False)


@dataclass
class Run:
    user_id: str
    session_id: str
    conversation_id: str
    id: str = field(default_factory=lambda: f"run_{uuid.uuid4().hex}")
    frames: list[bytes] = field(default_factory=list)  # frames[i] is event i + 1
    finished_at: float | None = None
    started_at: float = field(default_factory=time.time)  # wall clock, for listings
    task: asyncio.Task | None = None
    _followers: list[asyncio.Future] = field(default_factory=list)  # waiting for events
    _pending: dict[str, _Pending] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.finished_at is not None

    @property
    def awaiting_approval(self) -> bool:
        return any(not p.decided for p in self._pending.values())

    def emit(self, kind: str, data: dict[str, Any] | None = None) -> int:
        """Append an event; returns its id."""
        event_id = len(self.frames) + 1
        self.frames.append(encode_event(event_id, kind, data or {}))
        self._notify()
        return event_id

    def finish(self) -> None:
        if self.finished_at is None:
            self.finished_at = time.monotonic()
        self._notify()

    def _notify(self) -> None:
        # A plain future per waiting follower (not an Event per emit): on a busy run most
        # emits find nobody waiting — the followers are still writing — and cost nothing.
        followers, self._followers = self._followers, []
        for waiter in followers:
            if not waiter.done():
                waiter.set_result(True)

    async def follow(self, after: int = 0, idle: float | None = None) -> AsyncIterator[list[bytes]]:
        """Batches of the frames after event ``after`` as they come; an empty batch each
        time ``idle`` seconds pass without one (the caller's cue for a keep-alive)."""
        position = max(0, after)
        loop = asyncio.get_running_loop()
        while True:
            if position < len(self.frames):
                batch = self.frames[position:]
                position += len(batch)
                yield batch
                continue
            if self.finished:
                return
            waiter = loop.create_future()
            self._followers.append(waiter)
            timer = None if idle is None else loop.call_later(idle, _idle, waiter)
            try:
                woken = await waiter
            finally:
                if timer is not None:
                    timer.cancel()
            if not woken:
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


_PRUNE_EVERY = 1.0


class RunRegistry:
    def __init__(self, retention_seconds: float) -> None:
        self.retention = retention_seconds
        self._runs: dict[str, Run] = {}
        self._pruned_at = 0.0

    def add(self, run: Run) -> Run:
        self._prune()
        self._runs[run.id] = run
        return run

    def get(self, run_id: str, user_id: str) -> Run:
        run = self._runs.get(run_id)
        if run is not None and self._expired(run, time.monotonic()):
            del self._runs[run_id]
            run = None
        if run is None or run.user_id != user_id:
            raise NotFoundError(f"run '{run_id}' not found")
        return run

    def _expired(self, run: Run, now: float) -> bool:
        return run.finished_at is not None and now - run.finished_at > self.retention

    def all(self) -> list[Run]:
        return list(self._runs.values())

    def _prune(self) -> None:
        # A walk over every kept run, so at most once a second, not once per new run.
        now = time.monotonic()
        if now - self._pruned_at < _PRUNE_EVERY:
            return
        self._pruned_at = now
        for run_id in [i for i, r in self._runs.items() if self._expired(r, now)]:
            del self._runs[run_id]

    async def aclose(self) -> None:
        tasks = [r.task for r in self._runs.values() if r.task and not r.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
