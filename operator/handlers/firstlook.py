"""The runtime's stats folded into a session's status: ``Confined``, ``lastActivityTime``
and ``workspacePath``.

Why: the runtime is asked for its stats once per pod start (``activity.start_marker``).
Asked by a look of its own after Running was written, that look costs a second status
write, its watch event and a deadline per start — with 1,000 sessions turning Running
at once, 1,000 writes queued before the idle stops due 20 s later (issue 23). Asked by
the reconcile that turns a session Running, the answer goes into that same write.

Contract:
- ``confined_conditions``: the conditions with ``Confined`` set from the runtime's
  report when it changed (an Event says so when its status or reason changed); None when
  unchanged or not reported.
- ``stats_changes``: what a report changes in a status — the activity time when it moved
  by more than a second, and ``confined_conditions`` — for this module and the look of
  ``checks.py`` alike; ``workspace_path_change`` the runtime's workspace path when the
  status lacks it (a cold pod, or a claim answered by a runtime older than the path in
  it) and it has a path's shape (``models.workspace_path_of``: a runtime's answer is
  not trusted to).
- ``fold_first_stats``: for a status about to say Running (with an endpoint) for a pod
  start whose runtime was not asked yet, asks ``GET /v1/stats`` (at most
  ``FIRST_LOOK_SECONDS``) and returns the status with the runtime's activity time,
  ``Confined`` and workspace path, the start marked as asked
  (``OperatorContext.checked_starts``). Anything else — another phase, a start already
  asked, no runtime client, no token or an error reading it, no answer — returns the
  status as it was (unasked: the session's first deadline is then "now", the look of
  ``checks.py`` asks). Nothing is stopped here: an
  idle session's deadline is past, and the look at it stops it.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

import kopf

from sandbox_workspace.contract.conditions import ConditionType
from sandbox_workspace.kube import KubeError
from sandbox_workspace.runtime.client import RuntimeClientError
from sandbox_workspace.runtime.schemas import RuntimeStats

from ..activity import last_activity, start_marker
from ..context import OperatorContext
from ..models import Condition, SandboxSession, SandboxSessionStatus, workspace_path_of
from ..status import condition, confined_condition, ordered, set_condition

# A runtime that just answered its probe answers at once; a slower one is asked by the
# look (``checks.py``) rather than hold the session's reconcile (and its lock).
FIRST_LOOK_SECONDS = 2.0


def confined_conditions(
    session: SandboxSession, body: dict, stats: RuntimeStats, at: datetime
) -> list[Condition] | None:
    """``session``'s conditions with ``Confined`` from ``stats`` (see the contract)."""
    wanted = confined_condition(stats.model_dump(mode="json").get("confinement"))
    if wanted is None:
        return None
    value, reason, message = wanted
    old = condition(session.status, ConditionType.CONFINED)
    flag = "True" if value else "False"
    if old is not None and (old.status, old.reason, old.message) == (flag, reason, message):
        return None
    if old is None or (old.status, old.reason) != (flag, reason):
        kind = "Normal" if value else "Warning"
        kopf.event(body, type=kind, reason=reason, message=f"Confined={flag}: {message}")
    return set_condition(
        list(session.status.conditions), ConditionType.CONFINED, value, reason, message, at
    )


def stats_changes(
    session: SandboxSession, body: dict, stats: RuntimeStats, known: datetime | None, at: datetime
) -> tuple[datetime | None, list[Condition] | None]:
    """What the runtime's ``stats`` change in ``session``'s status, whose activity time is
    ``known``: the new activity time when it moved by more than a second (else None), and
    the conditions with ``Confined`` (``confined_conditions``)."""
    last = last_activity(stats.last_activity_at, session.annotations)
    moved = known is None or abs(known - last) > timedelta(seconds=1)
    return (last if moved else None), confined_conditions(session, body, stats, at)


def workspace_path_change(status: SandboxSessionStatus, stats: RuntimeStats) -> str | None:
    """The workspace path the runtime's ``stats`` name when it is one a status may record
    (``models.workspace_path_of``) and not the one ``status`` has; else None."""
    path = workspace_path_of(stats.workspace_path)
    return path if path is not None and path != status.workspace_path else None


async def fold_first_stats(
    ctx: OperatorContext,
    session: SandboxSession,
    body: dict,
    status: SandboxSessionStatus,
    at: datetime,
) -> SandboxSessionStatus:
    """``status`` with the runtime's first stats of this pod start (see the contract)."""
    if status.phase != "Running" or not status.endpoint or ctx.http is None:
        return status
    after = session.model_copy(update={"status": status})
    marker = start_marker(after)
    if ctx.checked_starts.get(session.uid) == marker:
        return status
    try:
        async with asyncio.timeout(FIRST_LOOK_SECONDS):
            # The token: this process's own (it made the Secret), else one read of it.
            client = await ctx.runtime(
                session.namespace, session.name, status.endpoint, session.uid
            )
            if client is None:
                return status
            stats = await client.stats()
    except (KubeError, RuntimeClientError, TimeoutError):
        return status
    ctx.checked_starts[session.uid] = marker
    update: dict = {}
    last, conds = stats_changes(after, body, stats, status.last_activity_time, at)
    if last is not None:
        update["last_activity_time"] = last
    if conds is not None:
        update["conditions"] = ordered(conds)
    if (path := workspace_path_change(status, stats)) is not None:
        update["workspace_path"] = path
    return status.model_copy(update=update) if update else status
