"""The runtime's session-memory watch (``Executor.watch_session_memory``) against a
stand-in spawner: it sleeps while no call is alive, walks /proc on the loop while walks
are cheap, in a thread for a while after a costly one, and still kills the largest call
past the ceiling. The real watch against real code: tests/api/test_limits.py and
tests/api/test_idle_wakeups.py."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from sandbox_workspace.runtime import executor as executor_module
from sandbox_workspace.runtime.executor import Executor

INTERVAL = 0.01


class _Spawner:
    def __init__(self) -> None:
        self.busy = asyncio.Event()
        self.pid = 1
        self.calls = [
            SimpleNamespace(reaper=11, limit=None),
            SimpleNamespace(reaper=12, limit=None),
        ]
        self.killed: list[int] = []

    def running(self) -> list:
        return self.calls if self.busy.is_set() else []

    def kill(self, call) -> None:
        self.killed.append(call.reaper)


def _run(monkeypatch, usage, seconds: float, *, ceiling: int = 1 << 40, busy: bool = True):
    """Run the watch ``seconds`` with ``usage()`` as the walk: (walks, spawner), each walk
    True when it ran in a thread."""
    walks: list[bool] = []  # True: in a thread
    threaded = [False]

    def walk(_spawner_pid: int) -> dict[int, int]:
        walks.append(threaded[0])
        return usage()

    real_to_thread = asyncio.to_thread

    async def to_thread(fn, *args):
        threaded[0] = True
        try:
            return await real_to_thread(fn, *args)
        finally:
            threaded[0] = False

    real_sleep = asyncio.sleep
    ticks = [0]

    async def sleep(delay: float) -> None:
        ticks[0] += delay == INTERVAL  # the watch's own wakeups
        await real_sleep(delay)

    monkeypatch.setattr(executor_module, "usage_by_call", walk)
    monkeypatch.setattr(executor_module.asyncio, "sleep", sleep)
    monkeypatch.setattr(executor_module.asyncio, "to_thread", to_thread)

    async def main() -> _Spawner:
        spawner = _Spawner()
        if busy:
            spawner.busy.set()
        watcher = SimpleNamespace(session_memory=ceiling, spawner=spawner)
        task = asyncio.create_task(Executor.watch_session_memory(watcher, interval=INTERVAL))
        await asyncio.sleep(seconds)
        task.cancel()
        return spawner

    spawner = asyncio.run(main())
    spawner.ticks = ticks[0]
    return walks, spawner


def _cheap() -> dict[int, int]:
    return {11: 1, 12: 2}


def test_no_call_alive_no_wakeup(monkeypatch):
    walks, spawner = _run(monkeypatch, _cheap, 0.2, busy=False)
    assert walks == [] and spawner.ticks == 0  # not even a wakeup: it waits for a call


def test_cheap_walks_stay_on_the_loop(monkeypatch):
    walks, _ = _run(monkeypatch, _cheap, 0.2)
    assert len(walks) >= 3 and not any(walks)


def test_after_a_costly_walk_the_next_ones_go_to_a_thread(monkeypatch):
    first = [True]

    def costly_once() -> dict[int, int]:
        if first[0]:  # CPU, not a sleep: the walk's cost is its thread's CPU time
            first[0] = False
            end = time.thread_time() + 0.01
            while time.thread_time() < end:
                pass
        return _cheap()

    walks, _ = _run(monkeypatch, costly_once, 0.3)
    assert walks[0] is False and len(walks) >= 3
    assert all(walks[1:]), walks  # within _THREAD_WALK_SECONDS: every later walk threaded


def test_past_the_ceiling_the_largest_call_is_killed(monkeypatch):
    _, spawner = _run(monkeypatch, _cheap, 0.1, ceiling=2)  # 1 + 2 bytes together
    assert spawner.killed and set(spawner.killed) == {12}
    assert spawner.calls[1].limit == "session_memory" and spawner.calls[0].limit is None
