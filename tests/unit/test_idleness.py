"""The one idle rule both backends stop runtimes by (``runtime/idleness.py``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sandbox_workspace.runtime.idleness import idle_for
from sandbox_workspace.runtime.schemas import RuntimeStats

T0 = datetime(2026, 11, 28, 8, 0, tzinfo=UTC)


def _stats(last: datetime, active: int = 0) -> RuntimeStats:
    return RuntimeStats(
        workspace_path="/w",
        started_at=T0,
        last_activity_at=last,
        active_operations=active,
        conversations=0,
    )


def test_idle_once_the_runtimes_quiet_time_reaches_the_timeout():
    assert idle_for(_stats(T0), None, 60, T0 + timedelta(seconds=59)) is None
    assert idle_for(_stats(T0), None, 60, T0 + timedelta(seconds=61)) == 61


def test_activity_the_runtime_cannot_see_counts_when_later():
    at = T0 + timedelta(seconds=100)
    assert idle_for(_stats(T0), T0 + timedelta(seconds=50), 60, at) is None
    assert idle_for(_stats(T0), T0 - timedelta(seconds=50), 60, at) == 100


def test_an_operation_in_flight_is_never_idle():
    assert idle_for(_stats(T0, active=1), None, 60, T0 + timedelta(hours=5)) is None


def test_timeout_zero_never_stops():
    assert idle_for(_stats(T0), None, 0, T0 + timedelta(days=9)) is None
