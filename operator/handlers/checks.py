"""A look at a SandboxSession when a deadline of its is due: TTL, confinement, idle stop,
outdated pods.

No timer per session: each session's next deadline (``operator/activity.py``) is kept in
one scheduler (``operator/deadlines.py``), fed by the session's events
(``sessions.feed``) and by each look (``check_session`` answers when to look next), so
an operator at rest does nothing. The runtime's stats are asked once per pod start — by
the reconcile that writes Running (``firstlook.py``), else by a look due at once — and
again only at a deadline: the idle deadline moves with the activity the runtime reports
then and with each ``last-activity`` annotation the API writes (each one an event).

Contract (each look, from the session's last watch event — no read: one stop is a
status patch and a pod deletion, the floor of its writes. Every write from that view
carries its resourceVersion; when the session changed since (409), or no event was
seen, the look is made afresh after a full reconcile):
- TTL: once ``creationTimestamp + ttlSeconds`` has passed, the Expired condition is set
  and the session deleted; owner references delete pod, Secret, PVC and workspaces.
- The runtime is asked for its stats (``GET /v1/stats``). Its confinement report sets
  the ``Confined`` condition (True ``Landlock``; False ``LandlockUnavailable`` or
  ``ConfinementDisabled``, with the report's reason) and an Event when it changes; its
  workspace path is recorded (``workspacePath``) when the status lacks it, by a look from
  a watch event only (its write guarded by that version: the path of the start asked).
- Idle stop: with no operation in flight and no activity for ``idleTimeoutSeconds`` —
  the runtime's own ``last_activity_at``, or the later ``sandboxworkspace.io/last-activity``
  annotation the API sets for activity the runtime cannot see (open chat runs, pending
  approvals) — the status becomes Stopped (condition Stopped=True, reason IdleTimeout)
  and the pod is deleted; the Secret and PVC stay.
- A pod the reconciler reports ``RestartRequired`` is deleted (and so recreated from the
  current spec) once nothing is in flight and nothing happened for one check interval.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

import kopf
from pydantic import ValidationError

from sandbox_workspace.contract.conditions import ConditionType, Reason
from sandbox_workspace.contract.crd import ANNOTATION_RESUME
from sandbox_workspace.kube import KubeConflict, KubeError, core_path
from sandbox_workspace.runtime.client import RuntimeClientError

from ..activity import after_stats, idle_for, start_marker
from ..context import OperatorContext
from ..models import SandboxSession
from ..pool.refill import settle
from ..status import (
    condition,
    expires_at,
    observe_pod,
    session_pod_name,
    session_status,
    set_condition,
)
from . import traced
from .firstlook import stats_changes, workspace_path_change
from .sessions import KIND, _write_status, now, reconcile_session, session_path, status_patch

log = logging.getLogger("sandbox_workspace.operator.checks")


async def stop_session(
    ctx: OperatorContext, session: SandboxSession, body: dict, why: str, *, seen: bool = False
) -> None:
    """Idle stop: status Stopped first (so the pod's deletion is not undone), then the pod.
    ``seen``: ``body`` is the session's last watch event — the status is written only onto
    that version (``KubeConflict`` if it changed since); else the session is read afresh."""
    async with ctx.lock(session.namespace, session.name):
        if seen:
            fresh: dict | None = body
        else:
            fresh = await ctx.api.get(session_path(session.namespace, session.name))
        if fresh is None or ANNOTATION_RESUME in (fresh["metadata"].get("annotations") or {}):
            return  # gone, or someone wants it right now
        current = SandboxSession.from_body(fresh)
        status = session_status(
            current, observe_pod(None), now(), stopped=True, stop_reason=(Reason.IDLE_TIMEOUT, why)
        )
        written = await _write_status(ctx, fresh, current, status, guard=seen, api=ctx.api)
        if written is not None:
            # Before the pod's deletion: its events then find the session stopped and
            # need no reconcile (``sessions.on_runtime_pod_event``).
            ctx.see_session(written)
        pod_path = core_path(session.namespace, "pods", session_pod_name(current))
        await ctx.api.delete(pod_path)


async def _expire(ctx: OperatorContext, session: SandboxSession, body: dict) -> None:
    conds = set_condition(
        list(session.status.conditions),
        ConditionType.EXPIRED,
        True,
        Reason.TTL_EXPIRED,
        f"ttlSeconds={session.spec.ttl_seconds} elapsed; deleting the session",
        now(),
    )
    path = session_path(session.namespace, session.name)
    await ctx.api.patch(
        path + "/status",
        {"status": {"conditions": [c.model_dump(mode="json", by_alias=True) for c in conds]}},
    )
    kopf.event(body, type="Normal", reason=Reason.EXPIRED, message="ttlSeconds elapsed: deleting")
    await ctx.api.delete(path)


def _seen(ctx: OperatorContext, namespace: str, name: str) -> SandboxSession | None:
    """The session as its last watch event showed it, when that is one to act on."""
    body = ctx.sessions_seen.get((namespace, name))
    if body is None or body["metadata"].get("deletionTimestamp"):
        return None
    try:
        return SandboxSession.from_body(body)
    except ValidationError:
        return None  # the reconciler reports it


async def check_session(
    ctx: OperatorContext, namespace: str, name: str, logger: Any
) -> datetime | None:
    """One look at a session whose deadline came (see the module contract); the time of
    the next look, or None (until its next event). Looked at from its last watch event
    (no read); when the session changed since (a write from it refused), afresh."""
    session = _seen(ctx, namespace, name)
    if session is not None:
        try:
            return await _look(ctx, session, ctx.sessions_seen[(namespace, name)], logger)
        except KubeConflict:
            logger.info("changed since its last event: looking again afresh")
    reconciled = await reconcile_session(ctx, namespace, name)
    if reconciled is None:
        return None
    return await _look(ctx, reconciled.session, reconciled.body, logger, seen=False)


async def _look(
    ctx: OperatorContext, session: SandboxSession, body: dict, logger: Any, *, seen: bool = True
) -> datetime | None:
    """``check_session`` on one view of the session: ``seen``, its last watch event
    (every write carries its resourceVersion: ``KubeConflict`` when it changed since), else
    just reconciled from a fresh read."""
    namespace, name = session.namespace, session.name
    expiry = expires_at(session)
    if expiry is not None and expiry <= now():
        await _expire(ctx, session, body)
        return None
    status = session.status
    interval = ctx.settings.check_interval_seconds
    if status.phase != "Running" or not status.endpoint:
        return expiry
    client = await ctx.runtime(namespace, name, status.endpoint, session.uid)
    if client is None:
        return now() + timedelta(seconds=interval)
    try:
        stats = await client.stats()
    except RuntimeClientError as e:
        logger.info(f"runtime stats unavailable: {e}")  # pod events report real failures
        return now() + timedelta(seconds=interval)
    ctx.checked_starts[session.uid] = start_marker(session)
    last, confined = stats_changes(session, body, stats, status.last_activity_time, now())
    patch: dict[str, Any] = {}
    if last is not None:
        patch["lastActivityTime"] = last.isoformat().replace("+00:00", "Z")
    if confined is not None:
        patch["conditions"] = [c.model_dump(mode="json", by_alias=True) for c in confined]
    if seen and (path := workspace_path_change(status, stats)) is not None:
        # The first look did not get it (no answer in time). Only onto the version whose
        # pod start was asked (a look afresh writes unguarded: a later start written
        # meanwhile would keep this pod's path, and the API use it instead of asking).
        patch["workspacePath"] = path
    if patch:
        # Its conditions are written whole: from a watch event, only onto that version.
        body_patch = status_patch(patch, body, guard=seen)
        written = await ctx.api.patch(session_path(namespace, name) + "/status", body_patch)
        if written is not None:  # what follows writes onto this version
            body, session = written, SandboxSession.from_body(written)
    timeout = session.spec.idle_timeout_seconds
    idle = idle_for(stats, session.annotations, timeout, now())
    if idle is not None:
        logger.info(f"idle for {idle:.0f}s (idleTimeoutSeconds={timeout}): stopping")
        await stop_session(ctx, session, body, f"no activity for {int(idle)}s", seen=seen)
        return expiry
    restart = condition(status, ConditionType.RESTART_REQUIRED)
    quiet = idle_for(stats, session.annotations, max(1, int(interval)), now())
    if restart is not None and restart.status == "True" and quiet is not None:
        await _roll(ctx, session, body)
        return expiry
    return after_stats(session, stats, now(), interval)


async def _roll(ctx: OperatorContext, session: SandboxSession, body: dict) -> None:
    """Replace an idle pod built from an older spec (recreated by the reconciler)."""
    path = core_path(session.namespace, "pods", session_pod_name(session))
    pod = await ctx.api.get(path)
    if pod is None:
        return
    kopf.event(body, type="Normal", reason=Reason.SPEC_CHANGED, message="idle: replacing the pod")
    await ctx.api.delete(path, uid=pod["metadata"]["uid"])


async def on_deadline(ctx: OperatorContext, key: tuple[str, str]) -> None:
    """A session's deadline came: look at it, and schedule its next look."""
    namespace, name = key
    if ctx.pool is not None:
        # Claims from the warm pool are flowing (a burst of starts): this look (a first
        # look asks the runtime and writes the status) waits until they settle — 50 of
        # them took a fifth of the operator's CPU in the middle of a burst of 50 claims.
        await settle(ctx.pool)
    if ctx.activity is not None and not await ctx.activity.active(namespace):
        # A standby now (kopf paused our handlers): the active replica acts on it. Dropped:
        # when this one is active again kopf lists every session anew, which feeds it.
        return
    try:
        with traced.span("operator.deadline", KIND, namespace, name, "deadline"):
            due = await check_session(ctx, namespace, name, log)
    except KubeError as e:
        ctx.metrics.errors.labels(KIND, e.reason or str(e.status)).inc()
        log.info(f"check of {namespace}/{name} failed ({e}); retrying")
        due = now() + timedelta(seconds=ctx.settings.check_interval_seconds)
    deadlines = ctx.deadlines
    if due is not None and deadlines is not None and deadlines.due(key) is None:
        deadlines.schedule(key, due.timestamp())  # unless an event set a fresher one
