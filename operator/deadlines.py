"""One in-process scheduler for every session's next deadline (idle, TTL, roll, first check).

Why: a kopf timer per session wakes every session every interval, whether anything
happened or not — work that grows with the number of sessions (issue 23: 37% of a core
at rest with 1,000 Pending sessions). Here each session has at most one due time, fed
from its own events, and one task sleeps until the earliest of them: at rest, with
nothing due, the operator does nothing.

Contract:
- ``schedule(key, due)`` sets the key's due time (replacing an earlier one, earlier or
  later); ``cancel(key)`` drops it. Both are O(log n) and never block.
- At its due time a key's ``action(key)`` runs once, in a task of its own, at most
  ``concurrency`` at a time; a key is never run twice at once (scheduled again while it
  runs, it runs again after). An action's exception is logged, never fatal.
- A heap keyed by due time with lazy deletion: superseded entries stay in the heap until
  they surface and are skipped (``_due`` holds each key's live time).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Hashable

log = logging.getLogger("sandbox_workspace.operator.deadlines")


class Deadlines:
    def __init__(
        self,
        action: Callable[[Hashable], Awaitable[None]],
        *,
        concurrency: int = 20,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._action, self._clock = action, clock
        self._heap: list[tuple[float, int, Hashable]] = []
        self._due: dict[Hashable, float] = {}
        self._seq = itertools.count()
        self._running: set[Hashable] = set()
        self._again: set[Hashable] = set()
        self._slots = asyncio.Semaphore(concurrency)
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self._loop: asyncio.Task | None = None

    def __len__(self) -> int:
        return len(self._due)

    def due(self, key: Hashable) -> float | None:
        """The key's due time (epoch seconds), or None when nothing is scheduled."""
        return self._due.get(key)

    def schedule(self, key: Hashable, due: float) -> None:
        if self._due.get(key) == due:
            return
        self._due[key] = due
        heapq.heappush(self._heap, (due, next(self._seq), key))
        if self._heap[0][2] == key:  # a new earliest: the sleeper must wake earlier
            self._wake.set()
        self._compact()

    def cancel(self, key: Hashable) -> None:
        self._due.pop(key, None)
        self._again.discard(key)

    def start(self) -> None:
        if self._loop is None:
            self._loop = asyncio.create_task(self._run(), name="session deadlines")

    async def aclose(self) -> None:
        tasks = [t for t in (self._loop, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._loop = None

    def _compact(self) -> None:
        # Superseded entries pile up when one key is rescheduled often (every event of a
        # busy session): rebuild once they are most of the heap, so memory stays O(keys).
        if len(self._heap) > 64 and len(self._heap) > 4 * len(self._due):
            self._heap = [(d, s, k) for d, s, k in self._heap if self._due.get(k) == d]
            heapq.heapify(self._heap)

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            while self._heap and self._due.get(self._heap[0][2]) != self._heap[0][0]:
                heapq.heappop(self._heap)  # superseded or cancelled
            if not self._heap:
                await self._wake.wait()
                continue
            wait = self._heap[0][0] - self._clock()
            if wait > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=wait)
                continue
            _, _, key = heapq.heappop(self._heap)
            del self._due[key]
            if key in self._running:
                self._again.add(key)
                continue
            await self._slots.acquire()
            self._running.add(key)
            task = asyncio.create_task(self._fire(key), name=f"deadline {key}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _fire(self, key: Hashable) -> None:
        try:
            await self._action(key)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("deadline action failed", extra={"key": str(key)})
        finally:
            self._running.discard(key)
            self._slots.release()
            if key in self._again:
                self._again.discard(key)
                if key not in self._due:
                    self.schedule(key, self._clock())
