"""When a session's runtime counts as idle: one rule for both backends.

Contract: ``idle_for(stats, also_active_at, timeout, at)`` is the number of seconds the
runtime has been idle at ``at`` once that reaches ``timeout``, else None. Idle counts from
the later of the runtime's own last activity and ``also_active_at`` (activity the runtime
cannot see: open chat runs, pending approvals, noted by the API). An operation in flight
is never idle; ``timeout`` 0 (or less) never stops. Pure: the operator (``activity.py``)
and the local backend's idle stop both decide with it.
"""

from __future__ import annotations

from datetime import datetime

from .schemas import RuntimeStats


def idle_for(
    stats: RuntimeStats, also_active_at: datetime | None, timeout: float, at: datetime
) -> float | None:
    """Seconds idle when that reaches ``timeout`` (stop it), else None."""
    if timeout <= 0 or stats.active_operations > 0:
        return None
    last = stats.last_activity_at
    if also_active_at is not None and also_active_at > last:
        last = also_active_at
    idle = (at - last).total_seconds()
    return idle if idle >= timeout else None
