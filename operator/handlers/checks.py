"""The periodic check of a SandboxSession: TTL, confinement, idle stop, outdated pods.

Contract (each check interval, after a full reconcile as a safety net):
- TTL: once ``creationTimestamp + ttlSeconds`` has passed, the Expired condition is set
  and the session deleted; owner references delete pod, Secret, PVC and workspaces.
- The runtime is asked for its stats (``GET /v1/stats``). Its confinement report sets
  the ``Confined`` condition (True ``Landlock``; False ``LandlockUnavailable`` or
  ``ConfinementDisabled``, with the report's reason) and an Event when it changes.
- Idle stop: with no operation in flight and no activity for ``idleTimeoutSeconds`` —
  the runtime's own ``last_activity_at``, or the later ``sandboxworkspace.io/last-activity``
  annotation the API sets for activity the runtime cannot see (open chat runs, pending
  approvals) — the status becomes Stopped (condition Stopped=True, reason IdleTimeout)
  and the pod is deleted; the Secret and PVC stay.
- A pod the reconciler reports ``RestartRequired`` is deleted (and so recreated from the
  current spec) once nothing is in flight and nothing happened for one check interval.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import kopf

from sandbox_workspace.kube import KubeError, core_path
from sandbox_workspace.runtime.client import RuntimeClientError
from sandbox_workspace.runtime.schemas import RuntimeStats

from ..context import OperatorContext
from ..models import ANNOTATION_LAST_ACTIVITY, ANNOTATION_RESUME, SandboxSession
from ..status import (
    condition,
    confined_condition,
    expires_at,
    observe_pod,
    session_pod_name,
    session_status,
    set_condition,
)
from .sessions import KIND, _write_status, now, reconcile_session, session_path


async def stop_session(ctx: OperatorContext, session: SandboxSession, body: dict, why: str) -> None:
    """Idle stop: status Stopped first (so the pod's deletion is not undone), then the pod."""
    async with ctx.lock(session.namespace, session.name):
        fresh = await ctx.api.get(session_path(session.namespace, session.name))
        if fresh is None or ANNOTATION_RESUME in (fresh["metadata"].get("annotations") or {}):
            return  # gone, or someone wants it right now
        current = SandboxSession.from_body(fresh)
        status = session_status(
            current, observe_pod(None), now(), stopped=True, stop_reason=("IdleTimeout", why)
        )
        await _write_status(ctx, fresh, current, status)
        pod_path = core_path(session.namespace, "pods", session_pod_name(current))
        await ctx.api.delete(pod_path)


async def _expire(ctx: OperatorContext, session: SandboxSession, body: dict) -> None:
    conds = set_condition(
        list(session.status.conditions),
        "Expired",
        True,
        "TTLExpired",
        f"ttlSeconds={session.spec.ttl_seconds} elapsed; deleting the session",
        now(),
    )
    path = session_path(session.namespace, session.name)
    await ctx.api.patch(
        path + "/status",
        {"status": {"conditions": [c.model_dump(mode="json", by_alias=True) for c in conds]}},
    )
    kopf.event(body, type="Normal", reason="Expired", message="ttlSeconds elapsed: deleting")
    await ctx.api.delete(path)


def last_activity(runtime_at: datetime, annotations: dict[str, str]) -> datetime:
    """The later of the runtime's activity and the API's ``last-activity`` annotation."""
    raw = annotations.get(ANNOTATION_LAST_ACTIVITY)
    try:
        api_at = datetime.fromisoformat(raw.replace("Z", "+00:00")) if raw else None
    except ValueError:
        api_at = None
    if api_at is not None and api_at.tzinfo is None:
        api_at = api_at.replace(tzinfo=UTC)
    return max(runtime_at, api_at) if api_at else runtime_at


def idle_for(
    stats: RuntimeStats, annotations: dict[str, str], timeout: int, at: datetime
) -> float | None:
    """Seconds the session has been idle when that reaches ``timeout`` (stop it), else
    None. An operation in flight is never idle; ``timeout`` 0 never stops."""
    if timeout <= 0 or stats.active_operations > 0:
        return None
    idle = (at - last_activity(stats.last_activity_at, annotations)).total_seconds()
    return idle if idle >= timeout else None


async def check_session(ctx: OperatorContext, namespace: str, name: str, logger: Any) -> None:
    """The periodic check (see the module contract)."""
    reconciled = await reconcile_session(ctx, namespace, name)
    if reconciled is None:
        return
    session, body = reconciled.session, reconciled.body
    expiry = expires_at(session)
    if expiry is not None and expiry <= now():
        await _expire(ctx, session, body)
        return
    status = session.status
    if status.phase != "Running" or not status.endpoint:
        return
    client = await ctx.runtime(namespace, name, status.endpoint, session.uid)
    if client is None:
        return
    try:
        stats = await client.stats()
    except RuntimeClientError as e:
        logger.info(f"runtime stats unavailable: {e}")  # pod events report real failures
        return
    last = last_activity(stats.last_activity_at, session.annotations)
    patch: dict[str, Any] = {}
    if status.last_activity_time is None or abs(status.last_activity_time - last) > timedelta(
        seconds=1
    ):
        patch["lastActivityTime"] = last.isoformat().replace("+00:00", "Z")
    confined = _confined(session, body, stats)
    if confined is not None:
        patch["conditions"] = confined
    if patch:
        await ctx.api.patch(session_path(namespace, name) + "/status", {"status": patch})
    timeout = session.spec.idle_timeout_seconds
    idle = idle_for(stats, session.annotations, timeout, now())
    if idle is not None:
        logger.info(f"idle for {idle:.0f}s (idleTimeoutSeconds={timeout}): stopping")
        await stop_session(ctx, session, body, f"no activity for {int(idle)}s")
        return
    restart = condition(status, "RestartRequired")
    interval = max(1, int(ctx.settings.check_interval_seconds))
    quiet = idle_for(stats, session.annotations, interval, now())
    if restart is not None and restart.status == "True" and quiet is not None:
        await _roll(ctx, session, body)


def _confined(session: SandboxSession, body: dict, stats: RuntimeStats) -> list[dict] | None:
    """The conditions with ``Confined`` updated from the runtime's report, when it
    changed (an Event says so); None when unchanged or not reported."""
    report = stats.model_dump(mode="json").get("confinement")
    wanted = confined_condition(report)
    if wanted is None:
        return None
    value, reason, message = wanted
    old = condition(session.status, "Confined")
    flag = "True" if value else "False"
    if old is not None and (old.status, old.reason, old.message) == (flag, reason, message):
        return None
    if old is None or (old.status, old.reason) != (flag, reason):
        kind = "Normal" if value else "Warning"
        kopf.event(body, type=kind, reason=reason, message=f"Confined={flag}: {message}")
    conds = set_condition(
        list(session.status.conditions), "Confined", value, reason, message, now()
    )
    return [c.model_dump(mode="json", by_alias=True) for c in conds]


async def _roll(ctx: OperatorContext, session: SandboxSession, body: dict) -> None:
    """Replace an idle pod built from an older spec (recreated by the reconciler)."""
    path = core_path(session.namespace, "pods", session_pod_name(session))
    pod = await ctx.api.get(path)
    if pod is None:
        return
    kopf.event(body, type="Normal", reason="SpecChanged", message="idle: replacing the pod")
    await ctx.api.delete(path, uid=pod["metadata"]["uid"])


async def on_session_timer(
    name: str, namespace: str, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    ctx: OperatorContext = memo.ctx
    try:
        await check_session(ctx, namespace, name, logger)
    except KubeError as e:
        ctx.metrics.errors.labels(KIND, e.reason or str(e.status)).inc()
        raise kopf.TemporaryError(str(e), delay=ctx.settings.check_interval_seconds) from e
