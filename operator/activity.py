"""When a session next needs a look: its deadlines, from its object and its runtime's
stats. Pure functions, no I/O (``handlers/checks.py`` acts on them).

Contract:
- ``last_activity``: the later of the runtime's own activity time and the API's
  ``sandboxworkspace.io/last-activity`` annotation (activity the runtime cannot see: open
  chat runs, pending approvals).
- ``idle_for``: seconds idle once that reaches the timeout (never with an operation in
  flight, never with timeout 0).
- ``next_due`` (from the object alone, on each of its events) and ``after_stats`` (after
  the runtime answered): the earliest of the TTL expiry, the idle deadline, one quiet
  check interval for a pod to roll, and — for a pod start whose runtime was not asked
  yet (``start_marker``) — now.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sandbox_workspace.contract.conditions import ConditionType
from sandbox_workspace.contract.crd import ANNOTATION_LAST_ACTIVITY
from sandbox_workspace.runtime import idleness
from sandbox_workspace.runtime.schemas import RuntimeStats

from .models import SandboxSession
from .status import condition, expires_at


def api_activity(annotations: dict[str, str]) -> datetime | None:
    """The API's ``last-activity`` annotation as a time (None when absent or unreadable)."""
    raw = annotations.get(ANNOTATION_LAST_ACTIVITY)
    try:
        api_at = datetime.fromisoformat(raw.replace("Z", "+00:00")) if raw else None
    except ValueError:
        return None
    if api_at is not None and api_at.tzinfo is None:
        api_at = api_at.replace(tzinfo=UTC)
    return api_at


def last_activity(runtime_at: datetime, annotations: dict[str, str]) -> datetime:
    """The later of the runtime's activity and the API's ``last-activity`` annotation."""
    api_at = api_activity(annotations)
    return max(runtime_at, api_at) if api_at else runtime_at


def idle_for(
    stats: RuntimeStats, annotations: dict[str, str], timeout: int, at: datetime
) -> float | None:
    """Seconds the session has been idle when that reaches ``timeout`` (stop it), else
    None: the runtime's rule (``runtime/idleness.py``) with the annotation's activity."""
    return idleness.idle_for(stats, api_activity(annotations), timeout, at)


def start_marker(session: SandboxSession) -> str:
    """Which pod start the session's status describes (its runtime is asked once per start)."""
    status = session.status
    return f"{session.uid}|{status.pod_name}|{status.pod_ip}|{status.started_at}"


def next_due(
    session: SandboxSession, at: datetime, interval: float, *, checked: bool
) -> datetime | None:
    """When ``session`` next needs a look, from what its object says (no I/O); None: never,
    until its next event. TTL: its expiry. A running runtime not yet asked since its pod
    started: now (stats once per start: Confined, activity). Else its idle deadline — the
    later of ``lastActivityTime`` and the API's ``last-activity`` annotation, plus
    ``idleTimeoutSeconds`` — and, with ``RestartRequired``, one quiet ``interval`` after it.
    The runtime may have seen later activity: the check asks it, and moves the deadline."""
    dues = [expires_at(session)]
    status = session.status
    if status.phase == "Running" and status.endpoint:
        if not checked:
            return at
        known = status.last_activity_time or status.started_at or at
        last = last_activity(known, session.annotations)
        if session.spec.idle_timeout_seconds > 0:
            dues.append(last + timedelta(seconds=session.spec.idle_timeout_seconds))
        restart = condition(status, ConditionType.RESTART_REQUIRED)
        if restart is not None and restart.status == "True":
            dues.append(last + timedelta(seconds=interval))
    return min((d for d in dues if d is not None), default=None)


def after_stats(
    session: SandboxSession, stats: RuntimeStats, at: datetime, interval: float
) -> datetime | None:
    """The next look after the runtime answered and nothing was stopped or rolled."""
    dues = [expires_at(session)]
    if stats.active_operations > 0:
        dues.append(at + timedelta(seconds=interval))  # busy: its end is not announced
    else:
        last = last_activity(stats.last_activity_at, session.annotations)
        if session.spec.idle_timeout_seconds > 0:
            dues.append(last + timedelta(seconds=session.spec.idle_timeout_seconds))
        restart = condition(session.status, ConditionType.RESTART_REQUIRED)
        if restart is not None and restart.status == "True":
            dues.append(last + timedelta(seconds=interval))
    return min((d for d in dues if d is not None), default=None)
