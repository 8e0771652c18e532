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
  ``cancel_conversation`` cancels every open run of a conversation being deleted: each
  stream ends with ``error`` (code ``conversation_deleted``) and ``done``.
- Where runs live beyond this process is the registry's ``RunStore`` (``runstore/``): the
  in-process store keeps all of the above as is; a replicated store (Redis) gets every
  event, checkpoint and approval through ``Run.sink`` and makes an event visible to
  followers only once it is stored (``durable``), so every replica shows the same log.
  ``find``/``decide``/``cancel`` reach runs held by other replicas through the store.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from sandbox_workspace.runtime.errors import Conflict, NotFoundError

from ..sse import encode_event
from .runstore import RunStore
from .runstore.memory import MemoryRunStore

log = logging.getLogger(__name__)


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


_PRUNE_EVERY = 1.0


class RunRegistry:
    def __init__(self, retention_seconds: float, store: RunStore | None = None) -> None:
        self.retention = retention_seconds
        self.store = store or MemoryRunStore()
        self._background: set[asyncio.Task] = set()
        self._runs: dict[str, Run] = {}
        self._pruned_at = 0.0

    def add(self, run: Run, spec: dict | None = None) -> Run:
        """Hold a run started here; ``spec`` (JSON data) lets another replica resume it."""
        self._prune()
        self._runs[run.id] = run
        self.store.register(run, spec)
        return run

    async def find(self, run_id: str, user_id: str) -> Run:
        """``get``, or else a run another replica holds (through the store); 404 if none."""
        try:
            run = self.get(run_id, user_id)
            if run.relay is None:
                return run
        except NotFoundError:
            run = None
        remote = await self.store.lookup(run_id)  # held elsewhere, or moved on from here
        if remote is None or remote.user_id != user_id:
            if run is not None:
                return run
            raise NotFoundError(f"run '{run_id}' not found")
        return remote

    async def conversation_runs(self, session_id: str, conversation_id: str) -> list[Run]:
        """A conversation's runs on every replica: this process's, then the store's others."""
        here = [
            r
            for r in self.all()
            if r.session_id == session_id
            and r.conversation_id == conversation_id
            and r.relay is None  # a run that moved on is listed as the store has it
        ]
        ids = {r.id for r in here}
        there = await self.store.conversation_runs(session_id, conversation_id)
        return here + [r for r in there if r.id not in ids]

    async def decide(self, run: Run, call_id: str, approved: bool, reason: str = "") -> None:
        await self.store.decide(run, call_id, approved, reason)

    async def cancel(
        self, run: Run, code: str = "cancelled", message: str = "the run was cancelled"
    ) -> bool:
        return await self.store.cancel(run, code, message)

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

    def cancel_conversation(self, session_id: str, conversation_id: str) -> int:
        """Cancel every open run of the conversation (it is being deleted); how many."""
        message = f"conversation '{conversation_id}' was deleted; the run was stopped"
        if self.store.replicated:  # and those other replicas run, through the store
            task = asyncio.get_running_loop().create_task(
                self._cancel_elsewhere(session_id, conversation_id, message)
            )
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        return sum(
            run.cancel("conversation_deleted", message)
            for run in list(self._runs.values())
            if run.session_id == session_id and run.conversation_id == conversation_id
        )

    async def _cancel_elsewhere(self, session_id: str, conversation_id: str, message: str) -> None:
        try:
            for run in await self.store.conversation_runs(session_id, conversation_id):
                if not run.finished:  # this replica's own: cancelled already, no-op
                    await self.store.cancel(run, "conversation_deleted", message)
        except Exception:  # the deletion goes on; a run left over ends by its deadline
            log.warning("could not cancel a deleted conversation's runs", exc_info=True)

    def _prune(self) -> None:
        # A walk over every kept run, so at most once a second, not once per new run.
        now = time.monotonic()
        if now - self._pruned_at < _PRUNE_EVERY:
            return
        self._pruned_at = now
        for run_id in [i for i, r in self._runs.items() if self._expired(r, now)]:
            del self._runs[run_id]

    async def aclose(self) -> None:
        """Stop this process's runs — or, with a replicated store, hand them over."""
        await self.store.aclose(self.all())
