"""A run: one background agent loop and its append-only log of events.

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
- A replicated run store (``runstore/``) gets every event, checkpoint and approval
  through ``Run.sink`` and sets ``durable``: followers see an event only once it is
  stored. This module knows no store (the stores import it, never the reverse).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from sandbox_workspace.contract.errors import Conflict, NotFoundError

from ..sse import encode_event


class RunFailed(Exception):
    """The run ends with an ``error`` event of this code and message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


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


class _IdleTimer:
    """Resolves a follower's pending wait with ``False`` once it has lasted ``idle``
    seconds. One timer, re-armed only when it fires — not one armed and cancelled per
    wait: a busy follower waits once per event, and a timer each time cost as much as the
    rest of the hand-over (measured with 200 runs streaming)."""

    __slots__ = ("_armed_for", "_handle", "_idle", "_loop", "_since", "_waiter")

    def __init__(self, loop: asyncio.AbstractEventLoop, idle: float) -> None:
        self._loop, self._idle = loop, idle
        self._waiter: asyncio.Future | None = None
        self._since = self._armed_for = 0.0
        self._handle: asyncio.TimerHandle | None = None

    def waiting(self, waiter: asyncio.Future) -> None:
        self._waiter = waiter
        self._since = self._loop.time()
        if self._handle is None:
            self._arm()

    def _arm(self) -> None:
        self._armed_for = self._since
        self._handle = self._loop.call_at(self._since + self._idle, self._fire)

    def _fire(self) -> None:
        self._handle = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return  # busy handing over a batch: its next wait arms the timer again
        if self._since == self._armed_for:  # armed for this very wait: it lasted idle
            waiter.set_result(False)
        else:  # a later wait: its idle time runs out later
            self._arm()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


# Runs that ended (their ``done`` written) in this process, by outcome: "completed", or
# the code of the ``error`` before ``done`` (llm_timeout, deadline_exceeded, cancelled,
# run_interrupted…). /metrics: ``sandbox_chat_runs_ended_total{outcome}``. Counted where
# ``done`` is emitted, so a run carried on by another replica counts once, there.
ENDED: Counter[str] = Counter()


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
    # Why the run was cancelled (code, message): what its ``error`` event says.
    cancelled_because: tuple[str, str] = ("cancelled", "the run was cancelled")
    _followers: list[asyncio.Future] = field(default_factory=list)  # waiting for events
    _pending: dict[str, _Pending] = field(default_factory=dict)
    # Replicated stores only: the store's writer, how many frames are stored (followers
    # see no further), and where followers go once another replica carries the run on.
    sink: Any = field(default=None, repr=False)
    durable: int | None = None
    relay: Callable[[int, float | None], AsyncIterator[list[bytes]]] | None = None
    error_code: str | None = None  # of the last ``error`` event

    @property
    def finished(self) -> bool:
        return self.finished_at is not None

    @property
    def awaiting_approval(self) -> bool:
        return any(not p.decided for p in self._pending.values())

    @property
    def visible(self) -> int:
        """How many events followers may see: all, or those stored (a replicated store)."""
        return len(self.frames) if self.durable is None else self.durable

    def open_calls(self) -> set[str]:
        """Tool calls whose approval is asked and neither decided nor timed out."""
        return {call for call, p in self._pending.items() if not p.decided}

    def emit(self, kind: str, data: dict[str, Any] | None = None) -> int:
        """Append an event; returns its id."""
        event_id = len(self.frames) + 1
        frame = encode_event(event_id, kind, data or {})
        if kind == "error":
            self.error_code = str((data or {}).get("code"))
        elif kind == "done":
            ENDED[self.error_code or "completed"] += 1
        self.frames.append(frame)
        if self.sink is None:
            self._notify()
        else:  # followers are woken once the store has it
            self.sink.event(self, event_id, kind, frame)
        return event_id

    def finish(self) -> None:
        if self.finished_at is None:
            self.finished_at = time.monotonic()
            if self.sink is not None:
                self.sink.finished(self)
        self._notify()

    def checkpoint(self, progress: Any) -> None:
        """The loop's state after a completed step (a replicated store keeps it, so another
        replica can carry the run on from there; the in-process store needs nothing)."""
        if self.sink is not None:
            self.sink.checkpoint(self, progress)

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
        timer = None if idle is None else _IdleTimer(loop, idle)
        try:
            while True:
                end = self.visible
                if position < end:
                    batch = self.frames[position:end]
                    position += len(batch)
                    yield batch
                    continue
                if self.relay is not None:  # the run moved on to another replica
                    if timer is not None:
                        timer.close()
                    async for batch in self.relay(position, idle):
                        yield batch
                    return
                if self.finished and position >= len(self.frames):
                    return
                waiter = loop.create_future()
                self._followers.append(waiter)
                if timer is not None:
                    timer.waiting(waiter)
                if not await waiter:
                    yield []
        finally:
            if timer is not None:
                timer.close()

    def open_approval(self, call_id: str, name: str) -> None:
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._pending[call_id] = _Pending(name=name, future=future)
        if self.sink is not None:
            self.sink.approval_opened(self, call_id)

    async def decision(self, call_id: str, timeout: float) -> Decision:
        future = self._pending[call_id].future
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        except TimeoutError:
            self._pending[call_id].decided = True
            if self.sink is not None:
                self.sink.approval_timed_out(self, call_id)
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

    def cancel(self, code: str = "cancelled", message: str = "the run was cancelled") -> bool:
        if self.finished or self.task is None:
            return False
        self.cancelled_because = (code, message)
        self.task.cancel()
        return True
