"""SandboxSession → Secret, PVC, Pod; status that follows the pod; idle stop; TTL.

Contract:
- ``reconcile_session`` is level-based and idempotent: it reads the session and its pod,
  creates what is missing (create-if-absent, 409 tolerated; children adopted so the
  session's deletion garbage-collects them), replaces a pod that failed or vanished
  (unless the session is Stopped), writes the whole status and posts an Event when the
  phase changes. Every trigger calls it: the session's create/resume/update handlers,
  every event of its pod, a resume request, and the periodic check.
- Work on one session is serialised by a per-session lock (``OperatorContext.lock``).
- Idle stop: the periodic check asks the runtime (``GET /v1/stats``); with no operation
  in flight and no activity for ``idleTimeoutSeconds`` — the runtime's own
  ``last_activity_at``, or the later ``sandboxworkspace.io/last-activity`` annotation the
  API sets for activity the runtime cannot see (open chat runs, pending approvals) — the
  status becomes Stopped (condition Stopped=True, reason IdleTimeout) and the pod is
  deleted; the Secret and PVC stay.
- Resume: whoever wants the session back (the API, or this operator to delete a
  conversation's files) sets the annotation ``sandboxworkspace.io/resume-requested``
  (an RFC 3339 time, by convention). The operator recreates the pod, sets the status
  Pending (Stopped=False, reason Resumed) and removes the annotation. The spec is never
  touched by anyone but its owner.
- TTL: once ``creationTimestamp + ttlSeconds`` has passed, the Expired condition is set
  and the session deleted; owner references delete pod, Secret, PVC and workspaces.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta
from typing import Any

import kopf
from pydantic import ValidationError

from sandbox_workspace.runtime.schemas import RuntimeStats

from .. import naming
from ..builders import build_runtime_secret, build_sandbox_pod, build_workspace_pvc
from ..context import OperatorContext
from ..kube import KubeError, core_path, custom_path
from ..models import (
    ANNOTATION_LAST_ACTIVITY,
    ANNOTATION_RESUME,
    LABEL_SESSION,
    SESSION_PLURAL,
    SandboxSession,
    SandboxSessionStatus,
)
from ..runtime_client import RuntimeClientError
from ..status import expires_at, is_stopped, observe_pod, session_status, set_condition

ANNOTATION_ACTIVITY = ANNOTATION_LAST_ACTIVITY
KIND = "SandboxSession"


def now() -> datetime:
    return datetime.now(UTC)


def _session_path(namespace: str, name: str) -> str:
    return custom_path(namespace, SESSION_PLURAL, name)


async def _ensure_children(ctx: OperatorContext, session: SandboxSession, body: dict) -> None:
    if session.uid and session.uid in ctx.children_seen:
        return  # created (or seen) once for this incarnation; owner refs keep them
    ns = session.namespace
    secret_path = core_path(ns, "secrets", naming.runtime_secret_name(session.name))
    if await ctx.api.get(secret_path) is None:
        secret = build_runtime_secret(session, secrets.token_urlsafe(32))
        kopf.adopt(secret, owner=body)
        await ctx.api.create(core_path(ns, "secrets"), secret)
    if session.spec.storage.persistent:
        claim_path = core_path(
            ns, "persistentvolumeclaims", naming.workspace_claim_name(session.name)
        )
        if await ctx.api.get(claim_path) is None:
            pvc = build_workspace_pvc(session)
            kopf.adopt(pvc, owner=body)
            await ctx.api.create(core_path(ns, "persistentvolumeclaims"), pvc)
    if session.uid:
        ctx.children_seen.add(session.uid)


async def _write_status(
    ctx: OperatorContext, body: dict, session: SandboxSession, status: SandboxSessionStatus
) -> None:
    new = status.model_dump(mode="json", by_alias=True)
    old = session.status.model_dump(mode="json", by_alias=True)
    if new != old:
        await ctx.api.patch(
            _session_path(session.namespace, session.name) + "/status", {"status": new}
        )
    ctx.metrics.session_phase(f"{session.namespace}/{session.name}", status.phase)
    if status.phase != session.status.phase:
        ready = next(c for c in status.conditions if c.type == "Ready")
        kind = "Warning" if status.phase == "Error" else "Normal"
        reason = "Stopped" if status.phase == "Stopped" else ready.reason
        kopf.event(body, type=kind, reason=reason, message=f"{status.phase}: {ready.message}")


async def _invalid(ctx: OperatorContext, body: dict, error: ValidationError) -> None:
    """A spec the models refuse: reported as a condition, not a crash loop."""
    message = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
    previous = SandboxSessionStatus.model_validate(body.get("status") or {})
    conds = set_condition(list(previous.conditions), "Ready", False, "InvalidSpec", message, now())
    status = previous.model_copy(update={"phase": "Error", "conditions": conds})
    meta = body["metadata"]
    await ctx.api.patch(
        _session_path(meta["namespace"], meta["name"]) + "/status",
        {"status": status.model_dump(mode="json", by_alias=True)},
    )
    if previous.phase != "Error":
        kopf.event(body, type="Warning", reason="InvalidSpec", message=message)


async def reconcile_session(
    ctx: OperatorContext, namespace: str, name: str
) -> SandboxSession | None:
    """Bring the session's children and status in line; see the module contract."""
    reconciled = await _reconcile(ctx, namespace, name)
    return reconciled[0] if reconciled else None


async def _reconcile(
    ctx: OperatorContext, namespace: str, name: str
) -> tuple[SandboxSession, dict] | None:
    """``reconcile_session``, also handing back the body it read (saves a GET)."""
    async with ctx.lock(namespace, name):
        body = await ctx.api.get(_session_path(namespace, name))
        if body is None or body["metadata"].get("deletionTimestamp"):
            ctx.metrics.session_phase(f"{namespace}/{name}", None)
            return None
        try:
            session = SandboxSession.from_body(body)
        except ValidationError as e:
            await _invalid(ctx, body, e)
            return None
        await _ensure_children(ctx, session, body)
        stopped = is_stopped(session)
        pod_path = core_path(namespace, "pods", naming.runtime_pod_name(name))
        pod = await ctx.api.get(pod_path)
        state = observe_pod(pod)
        if (pod is not None and state.kind in ("failed",)) or (
            stopped and pod is not None and state.kind != "terminating"
        ):
            if not stopped:
                kopf.event(body, type="Warning", reason="PodFailed", message=state.message)
            await ctx.api.delete(pod_path, uid=pod["metadata"]["uid"])
            pod = await ctx.api.get(pod_path)
        elif pod is None and not stopped:
            # A new pod needs its Secret and claim: look again rather than trust the cache.
            ctx.children_seen.discard(session.uid)
            await _ensure_children(ctx, session, body)
            manifest = build_sandbox_pod(session, ctx.settings)
            kopf.adopt(manifest, owner=body)
            pod = await ctx.api.create(core_path(namespace, "pods"), manifest)
            if pod is None:  # created meanwhile by another trigger: read it
                pod = await ctx.api.get(pod_path)
            if session.status.phase is not None:
                kopf.event(body, type="Normal", reason="PodCreated", message="sandbox pod created")
        status = session_status(session, observe_pod(pod), now(), stopped=stopped)
        await _write_status(ctx, body, session, status)
        if ANNOTATION_RESUME in session.annotations:
            # Only after the status says "not stopped": a crash in between resumes again.
            await ctx.api.patch(
                _session_path(namespace, name),
                {"metadata": {"annotations": {ANNOTATION_RESUME: None}}},
            )
            if session.status.phase == "Stopped":
                kopf.event(body, type="Normal", reason="Resumed", message="resume requested")
        return session.model_copy(update={"status": status}), body


async def stop_session(ctx: OperatorContext, session: SandboxSession, body: dict, why: str) -> None:
    """Idle stop: status Stopped first (so the pod's deletion is not undone), then the pod."""
    async with ctx.lock(session.namespace, session.name):
        fresh = await ctx.api.get(_session_path(session.namespace, session.name))
        if fresh is None or ANNOTATION_RESUME in (fresh["metadata"].get("annotations") or {}):
            return  # gone, or someone wants it right now
        current = SandboxSession.from_body(fresh)
        status = session_status(
            current, observe_pod(None), now(), stopped=True, stop_reason=("IdleTimeout", why)
        )
        await _write_status(ctx, fresh, current, status)
        pod_path = core_path(session.namespace, "pods", naming.runtime_pod_name(session.name))
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
    path = _session_path(session.namespace, session.name)
    await ctx.api.patch(
        path + "/status",
        {"status": {"conditions": [c.model_dump(mode="json", by_alias=True) for c in conds]}},
    )
    kopf.event(body, type="Normal", reason="Expired", message="ttlSeconds elapsed: deleting")
    await ctx.api.delete(path)


def last_activity(runtime_at: datetime, annotations: dict[str, str]) -> datetime:
    """The later of the runtime's activity and the API's ``last-activity`` annotation."""
    raw = annotations.get(ANNOTATION_ACTIVITY)
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
    """The periodic check: TTL, then idleness, then a full reconcile (safety net)."""
    reconciled = await _reconcile(ctx, namespace, name)
    if reconciled is None:
        return
    session, body = reconciled
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
    if status.last_activity_time is None or abs(status.last_activity_time - last) > timedelta(
        seconds=1
    ):
        await ctx.api.patch(
            _session_path(namespace, name) + "/status",
            {"status": {"lastActivityTime": last.isoformat().replace("+00:00", "Z")}},
        )
    timeout = session.spec.idle_timeout_seconds
    idle = idle_for(stats, session.annotations, timeout, now())
    if idle is not None:
        logger.info(f"idle for {idle:.0f}s (idleTimeoutSeconds={timeout}): stopping")
        await stop_session(ctx, session, body, f"no activity for {int(idle)}s")


async def request_resume(ctx: OperatorContext, namespace: str, name: str) -> None:
    """Ask for a Stopped session to be started again (see the module contract)."""
    stamp = now().isoformat().replace("+00:00", "Z")
    await ctx.api.patch(
        _session_path(namespace, name), {"metadata": {"annotations": {ANNOTATION_RESUME: stamp}}}
    )


# -- kopf handlers (registered in handlers/__init__.py) ----------------------------------


async def on_session_changed(
    name: str, namespace: str, memo: kopf.Memo, retry: int, **_: Any
) -> None:
    """create / resume / spec update: reconcile, retrying with backoff on API errors."""
    ctx: OperatorContext = memo.ctx
    try:
        await reconcile_session(ctx, namespace, name)
    except KubeError as e:
        ctx.metrics.reconciles.labels(KIND, "retry").inc()
        ctx.metrics.errors.labels(KIND, e.reason or str(e.status)).inc()
        raise kopf.TemporaryError(str(e), delay=_backoff(ctx, retry)) from e
    ctx.metrics.reconciles.labels(KIND, "ok").inc()


async def on_session_event(
    event: kopf.RawEvent, name: str, namespace: str, memo: kopf.Memo, **_: Any
) -> None:
    """A resume request is acted on at once; a deleted session is forgotten."""
    ctx: OperatorContext = memo.ctx
    if event["type"] == "DELETED":
        ctx.metrics.session_phase(f"{namespace}/{name}", None)
        ctx.forget(namespace, name, event["object"].get("metadata", {}).get("uid"))
        return
    annotations = event["object"].get("metadata", {}).get("annotations") or {}
    if ANNOTATION_RESUME in annotations:
        await reconcile_session(ctx, namespace, name)


async def on_runtime_pod_event(
    event: kopf.RawEvent, namespace: str, labels: kopf.Labels, memo: kopf.Memo, **_: Any
) -> None:
    """Any change of a sandbox pod: the session's status follows; a dead pod is replaced."""
    session_name = labels.get(LABEL_SESSION)
    if session_name:
        await reconcile_session(memo.ctx, namespace, session_name)


async def on_session_timer(
    name: str, namespace: str, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    ctx: OperatorContext = memo.ctx
    try:
        await check_session(ctx, namespace, name, logger)
    except KubeError as e:
        ctx.metrics.errors.labels(KIND, e.reason or str(e.status)).inc()
        raise kopf.TemporaryError(str(e), delay=ctx.settings.check_interval_seconds) from e


def _backoff(ctx: OperatorContext, retry: int) -> float:
    return min(0.5 * 2 ** min(retry, 10), ctx.settings.retry_max_delay_seconds)
