"""operator/deadlines.py (one scheduler for every session's deadline),
operator/activity.py (when a session is due, from its object) and operator/peering.py
(whether this replica is the active one)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import pytest

from sandbox_workspace.operator.activity import next_due
from sandbox_workspace.operator.deadlines import Deadlines
from sandbox_workspace.operator.models import SandboxSession
from sandbox_workspace.operator.peering import is_active

NOW = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)


async def _until(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


async def test_keys_fire_in_due_order_once_each() -> None:
    fired: list[str] = []

    async def action(key) -> None:
        fired.append(key)

    deadlines = Deadlines(action)
    deadlines.start()
    try:
        now = time.time()
        deadlines.schedule("late", now + 0.2)
        deadlines.schedule("early", now + 0.05)
        deadlines.schedule("gone", now + 0.1)
        deadlines.cancel("gone")
        deadlines.schedule("moved", now + 5)
        deadlines.schedule("moved", now + 0.15)  # rescheduled earlier
        deadlines.schedule("later", now + 0.01)
        deadlines.schedule("later", now + 0.25)  # rescheduled later: fires once, late
        await _until(lambda: len(fired) == 4)
        await asyncio.sleep(0.1)
        assert fired == ["early", "moved", "late", "later"]
        assert len(deadlines) == 0
    finally:
        await deadlines.aclose()


async def test_a_key_never_runs_twice_at_once_and_failures_are_not_fatal() -> None:
    running, overlaps, runs = set(), [], []

    async def action(key) -> None:
        if key in running:
            overlaps.append(key)
        running.add(key)
        runs.append(key)
        await asyncio.sleep(0.05)
        running.discard(key)
        if len(runs) == 1:
            raise RuntimeError("a failing look")

    deadlines = Deadlines(action, concurrency=4)
    deadlines.start()
    try:
        deadlines.schedule("a", time.time())
        await _until(lambda: runs)
        deadlines.schedule("a", time.time())  # due again while it runs: runs after
        await _until(lambda: len(runs) == 2)
        deadlines.schedule("b", time.time())
        await _until(lambda: "b" in runs)
        assert overlaps == []
    finally:
        await deadlines.aclose()


async def test_many_keys_are_one_task_and_memory_stays_per_key() -> None:
    fired: list[int] = []

    async def action(key) -> None:
        fired.append(key)

    deadlines = Deadlines(action)
    deadlines.start()
    try:
        far = time.time() + 3600
        for round_ in range(20):  # every key rescheduled many times (a busy session)
            for key in range(1000):
                deadlines.schedule(key, far + round_)
        assert len(deadlines) == 1000
        assert len(deadlines._heap) <= 4 * 1000 + 64
        soon = time.time()
        for key in range(10):
            deadlines.schedule(key, soon)
        await _until(lambda: len(fired) == 10)
        assert sorted(fired) == list(range(10))
    finally:
        await deadlines.aclose()


def session(**status) -> SandboxSession:
    body = {
        "metadata": {
            "name": "sb-session-a",
            "namespace": "ns",
            "uid": "u1",
            "creationTimestamp": "2025-01-01T11:00:00Z",
            "annotations": status.pop("annotations", {}),
        },
        "spec": {"userId": "a", "idleTimeoutSeconds": 600, **status.pop("spec", {})},
        "status": status,
    }
    return SandboxSession.from_body(body)


RUNNING = dict(phase="Running", endpoint="http://10.0.0.1:8080", podIP="10.0.0.1")


@pytest.mark.parametrize(
    ("fields", "checked", "expected"),
    [
        pytest.param(dict(phase="Pending"), False, None, id="pending-no-ttl-nothing"),
        pytest.param(
            dict(phase="Pending", spec={"ttlSeconds": 7200}),
            False,
            NOW + timedelta(hours=1),
            id="pending-ttl",
        ),
        pytest.param(RUNNING, False, NOW, id="new-pod-start-asked-now"),
        pytest.param(
            dict(RUNNING, lastActivityTime="2025-01-01T11:58:00Z"),
            True,
            NOW + timedelta(minutes=8),
            id="idle-deadline",
        ),
        pytest.param(
            dict(
                RUNNING,
                lastActivityTime="2025-01-01T11:58:00Z",
                annotations={"sandboxworkspace.io/last-activity": "2025-01-01T11:59:00Z"},
            ),
            True,
            NOW + timedelta(minutes=9),
            id="api-activity-moves-it",
        ),
        pytest.param(
            dict(RUNNING, lastActivityTime="2025-01-01T11:58:00Z", spec={"ttlSeconds": 3660}),
            True,
            NOW + timedelta(minutes=1),
            id="ttl-first",
        ),
        pytest.param(
            dict(
                RUNNING,
                lastActivityTime="2025-01-01T11:58:00Z",
                conditions=[
                    {
                        "type": "RestartRequired",
                        "status": "True",
                        "reason": "SpecChanged",
                        "message": "",
                        "lastTransitionTime": "2025-01-01T11:58:00Z",
                    }
                ],
            ),
            True,
            NOW - timedelta(minutes=2) + timedelta(seconds=30),
            id="roll-after-a-quiet-interval",
        ),
        pytest.param(
            dict(RUNNING, lastActivityTime="2025-01-01T11:58:00Z", spec={"idleTimeoutSeconds": 0}),
            True,
            None,
            id="no-idle-timeout",
        ),
    ],
)
def test_next_due(fields, checked, expected) -> None:
    assert next_due(session(**fields), NOW, 30, checked=checked) == expected


def _peer(priority: int, seconds_ago: float, lifetime: int = 10) -> dict:
    seen = NOW - timedelta(seconds=seconds_ago)
    return {"priority": priority, "lastseen": seen.isoformat(), "lifetime": lifetime}


@pytest.mark.parametrize(
    ("peers", "expected"),
    [
        pytest.param({}, True, id="alone"),
        pytest.param({"me": _peer(1, 0), "b": _peer(0, 1)}, True, id="highest"),
        pytest.param({"me": _peer(0, 0), "a": _peer(1, 1)}, False, id="standby"),
        pytest.param({"me": _peer(0, 0), "a": _peer(1, 11)}, True, id="active-peer-dead"),
        pytest.param({"me": _peer(0, 0), "a": _peer(0, 1)}, False, id="same-priority"),
        pytest.param({"me": _peer(0, 0), "a": "garbage"}, True, id="unreadable-record"),
    ],
)
def test_the_active_replica_follows_kopfs_rule(peers, expected) -> None:
    assert is_active(peers, "me", peers.get("me", {}).get("priority", 0), NOW) is expected
