"""operator/handlers/checks.py: when a session counts as idle."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from sandbox_workspace.operator.activity import idle_for, last_activity
from sandbox_workspace.runtime.schemas import RuntimeStats

NOW = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)


def stats(idle_seconds: float, active: int = 0) -> RuntimeStats:
    at = NOW - timedelta(seconds=idle_seconds)
    return RuntimeStats(
        workspace_path="/workspace",
        started_at=at,
        last_activity_at=at,
        active_operations=active,
        conversations=0,
    )


@pytest.mark.parametrize(
    ("idle", "active", "annotation", "timeout", "expected"),
    [
        pytest.param(100, 0, None, 60, 100, id="idle-past-timeout"),
        pytest.param(30, 0, None, 60, None, id="not-yet"),
        pytest.param(60, 0, None, 60, 60, id="exactly-timeout"),
        pytest.param(100, 1, None, 60, None, id="operation-in-flight"),
        pytest.param(100, 0, None, 0, None, id="timeout-zero-never-stops"),
        pytest.param(100, 0, "2025-01-01T11:59:30Z", 60, None, id="api-activity-counts"),
        pytest.param(100, 0, "2025-01-01T11:58:00Z", 60, 100, id="older-api-ignored"),
        pytest.param(100, 0, "garbage", 60, 100, id="bad-annotation-ignored"),
    ],
)
def test_idle_for(idle, active, annotation, timeout, expected) -> None:
    annotations = {"sandboxworkspace.io/last-activity": annotation} if annotation else {}
    assert idle_for(stats(idle, active), annotations, timeout, NOW) == expected


def test_last_activity_takes_the_later_time() -> None:
    runtime_at = NOW - timedelta(minutes=5)
    later = {"sandboxworkspace.io/last-activity": "2025-01-01T11:59:00"}  # naive means UTC
    assert last_activity(runtime_at, later) == NOW - timedelta(minutes=1)
    assert last_activity(runtime_at, {}) == runtime_at
