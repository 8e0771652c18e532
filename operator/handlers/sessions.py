"""SandboxSession → Secret, PVC, Pod; status that follows the pod; resume requests.

Contract:
- ``reconcile_session`` is level-based and idempotent: it reads the session and its pod,
  creates what is missing (create-if-absent, 409 tolerated; children adopted so the
  session's deletion garbage-collects them), replaces a pod that failed or vanished
  (unless the session is Stopped), writes the whole status and posts an Event when the
  phase or the reason changes. The write that turns a session Running carries its
  runtime's first stats of that pod start (``firstlook.py``: ``lastActivityTime``,
  ``Confined``) — one write, not a second one from a look of its own. Every trigger
  calls it: the session's create/resume/update handlers, every event of its pod, a
  resume request, and the look at a due deadline (``handlers/checks.py``: idle stop,
  TTL, confinement, rolling an outdated pod).
- Session incarnations: children are found by name but judged by owner uid
  (``children.judge``). A child of an earlier incarnation is never reused: a terminating
  one is awaited, an old pod or Secret is deleted (uid precondition) and awaited, an old
  claim is left to the garbage collector — except a claim without any owner (left by
  ``--cascade=orphan``), which the session adopts. While it waits the session is
  Pending with reason ``OldIncarnation`` and ``reconcile_session`` answers ``waiting``.
- A pod built from an older spec (annotation ``sandboxworkspace.io/pod-spec``) is
  replaced at once when it is not serving; a serving one is reported
  (``RestartRequired``) and rolled by the look at its deadline once the session is idle, and
  ``observedGeneration`` stays at the generation the pod reflects until then.
- Work on one session is serialised by a per-session lock (``OperatorContext.lock``).
- Child names (``naming.ANNOTATION_NAMES``): a session never reconciled (no status) that
  lacks the annotation, as one made with ``kubectl``, is stamped with the current names
  before any child is made (``stamps_names``); one reconciled before the upgrade keeps
  its legacy children's names.
- Resume: whoever wants the session back (the API, or this operator to delete a
  conversation's files) sets the annotation ``sandboxworkspace.io/resume-requested``
  (an RFC 3339 time, by convention). The operator recreates the pod, sets the status
  Pending (Stopped=False, reason Resumed) and removes the annotation. Nothing else starts
  a stopped session — not an operator restart. The spec is never touched by anyone but
  its owner.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any

import kopf
from pydantic import ValidationError

from sandbox_workspace.contract.conditions import ConditionType, Reason
from sandbox_workspace.contract.crd import (
    ANNOTATION_POD_SPEC,
    ANNOTATION_RESUME,
    LABEL_SESSION,
    SESSION_PLURAL,
)
from sandbox_workspace.kube import Kube, KubeError, core_path, custom_path

from .. import naming
from ..activity import next_due, start_marker
from ..builders import build_sandbox_pod
from ..children import judge, uid_of
from ..context import OperatorContext
from ..models import SandboxSession, SandboxSessionStatus
from ..pool.claim import claim_pod, claims_api
from ..status import PodState, is_stopped, session_pod_name, session_status, set_condition
from . import traced
from .firstlook import fold_first_stats
from .incarnation import OLD, ensure_children

KIND = "SandboxSession"
# Ready reasons of an ordinary start: no Event each (the phase change has one).
_ROUTINE = {
    Reason.POD_MISSING,
    Reason.POD_PENDING,
    "ContainerCreating",
    Reason.RUNTIME_NOT_READY,
    Reason.POD_TERMINATING,
}
# Reasons posted as Warning Events even when the phase is not Error.
_WARN = {OLD, Reason.UNSCHEDULABLE, Reason.POD_FAILED}


def now() -> datetime:
    return datetime.now(UTC)


def session_path(namespace: str, name: str) -> str:
    return custom_path(namespace, SESSION_PLURAL, name)


@dataclass(frozen=True)
class Reconciled:
    session: SandboxSession
    body: dict[str, Any]
    waiting: bool  # an old incarnation's child must go first: retry soon


def status_patch(status: dict[str, Any], body: dict, *, guard: bool) -> dict[str, Any]:
    """A patch of the status subresource; ``guard``: only onto the version ``body`` is
    (the apiserver answers 409 ``Conflict`` if the session changed since)."""
    patch: dict[str, Any] = {"status": status}
    if guard:
        patch["metadata"] = {"resourceVersion": body["metadata"]["resourceVersion"]}
    return patch


async def _write_status(
    ctx: OperatorContext,
    body: dict,
    session: SandboxSession,
    status: SandboxSessionStatus,
    *,
    guard: bool = False,
    api: Kube | None = None,
    post: Callable[..., None] | None = None,
) -> dict | None:
    """``guard``: only onto the version ``body`` is (409 ``Conflict`` if it changed since;
    writes from an event's object: the pool's short path, ``pool_start.py``, with the
    pool's client, and an idle stop, ``checks.py``, with ``api``). ``post``: how the
    transition's Event is posted (``kopf.event``'s signature; the short path defers it).
    The session as written, or None when nothing needed writing."""
    new = status.model_dump(mode="json", by_alias=True)
    old = session.status.model_dump(mode="json", by_alias=True)
    written = None
    if new != old:
        path = session_path(session.namespace, session.name) + "/status"
        patch = status_patch(new, body, guard=guard)
        written = await (api or (claims_api(ctx) if guard else ctx.api)).patch(path, patch)
    ctx.metrics.session_phase(f"{session.namespace}/{session.name}", status.phase)
    ready = next(c for c in status.conditions if c.type == ConditionType.READY)
    before = next((c for c in session.status.conditions if c.type == ConditionType.READY), None)
    changed_reason = before is None or before.reason != ready.reason
    if status.phase != session.status.phase or (changed_reason and ready.reason not in _ROUTINE):
        kind = "Warning" if status.phase == "Error" or ready.reason in _WARN else "Normal"
        reason = Reason.STOPPED if status.phase == "Stopped" else ready.reason
        (post or kopf.event)(
            body, type=kind, reason=reason, message=f"{status.phase}: {ready.message}"
        )
    return written


async def _invalid(ctx: OperatorContext, body: dict, error: ValidationError) -> None:
    """A spec the models refuse: reported as a condition, not a crash loop."""
    message = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
    previous = SandboxSessionStatus.model_validate(body.get("status") or {})
    conds = set_condition(
        list(previous.conditions), ConditionType.READY, False, Reason.INVALID_SPEC, message, now()
    )
    status = previous.model_copy(update={"phase": "Error", "conditions": conds})
    meta = body["metadata"]
    await ctx.api.patch(
        session_path(meta["namespace"], meta["name"]) + "/status",
        {"status": status.model_dump(mode="json", by_alias=True)},
    )
    if previous.phase != "Error":
        kopf.event(body, type="Warning", reason=Reason.INVALID_SPEC, message=message)


def stamps_names(body: dict) -> bool:
    """Whether a session's children get the current names (``naming.ANNOTATION_NAMES``)
    stamped now: one this operator has never reconciled (no status, so no child made
    under any name yet) and that does not carry the annotation already (the API sets it
    at creation; ``kubectl``-made sessions lack it). One reconciled before the upgrade has
    a status and keeps its legacy names, so its pod, Secret and claim are found again."""
    annotations = body["metadata"].get("annotations") or {}
    return not body.get("status") and naming.ANNOTATION_NAMES not in annotations


async def _stamp_names(ctx: OperatorContext, body: dict) -> dict | None:
    """The session with the names annotation stamped when ``stamps_names``; else as
    given. None when it went meanwhile. The annotation goes first, before any child is
    made, so every later reconcile (this operator's or the next) names children alike."""
    if not stamps_names(body):
        return body
    meta = body["metadata"]
    annotations = {naming.ANNOTATION_NAMES: naming.NAMES_CURRENT}
    return await ctx.api.patch(
        session_path(meta["namespace"], meta["name"]), {"metadata": {"annotations": annotations}}
    )


class _Taken(Exception):
    """A new session's pod, created without a read, found its name taken."""


async def reconcile_session(
    ctx: OperatorContext,
    namespace: str,
    name: str,
    *,
    seen: dict | None = None,
    pod_seen: dict | None = None,
) -> Reconciled | None:
    """Bring the session's children and status in line; see the module contract.
    None when the session is gone, being deleted or invalid. ``seen``: the body of the
    event that asked for this; a session never reconciled yet (no status) is reconciled
    from it without a read of itself or its pod (most likely absent, created outright:
    a name taken means the reconcile is made again from fresh reads) — the reads a burst
    of new sessions need not make. ``pod_seen``: the pod of the pod event that asked for
    this, taken for the session's pod (not read again) when it is that pod; a later
    change of it is an event of its own."""
    if seen is not None and not seen.get("status"):
        try:
            return await _reconcile(ctx, namespace, name, seen, None)
        except _Taken:
            pass
    return await _reconcile(ctx, namespace, name, None, pod_seen)


async def _reconcile(
    ctx: OperatorContext, namespace: str, name: str, seen: dict | None, pod_seen: dict | None
) -> Reconciled | None:
    async with ctx.lock(namespace, name):
        body = seen or await ctx.api.get(session_path(namespace, name))
        if body is None or body["metadata"].get("deletionTimestamp"):
            ctx.metrics.session_phase(f"{namespace}/{name}", None)
            return None
        body = await _stamp_names(ctx, body)
        if body is None:
            return None
        try:
            session = SandboxSession.from_body(body)
        except ValidationError as e:
            await _invalid(ctx, body, e)
            return None
        stopped = is_stopped(session)
        pod_name = session_pod_name(session)
        pod_path = core_path(namespace, "pods", pod_name)
        if seen:
            pod = None
        elif pod_seen is not None and (pod_seen.get("metadata") or {}).get("name") == pod_name:
            pod = pod_seen
        else:
            pod = await ctx.api.get(pod_path)
        serving = judge(pod, session.uid) == "ours" and ctx.answers.observe(pod).kind == "ready"
        blocked = await ensure_children(ctx, session, body, trust_cache=serving)
        desired = build_sandbox_pod(session, ctx.settings)
        pod, state, outdated = await _converge_pod(
            ctx, session, body, pod, desired, stopped=stopped, blocked=blocked, unread=bool(seen)
        )
        if pod is not None:  # its watch event of this version needs no second look
            ctx.pods_seen[uid_of(pod)] = pod["metadata"].get("resourceVersion", "")
        if pod is not None and ctx.http is not None and judge(pod, session.uid) == "ours":
            # Running but not Ready yet: poll its runtime ourselves (answers.py).
            answered = partial(_after_answer, ctx, namespace, name)
            ctx.answers.watch(ctx.http, pod, state, answered)
        # A pod claimed just now: its claim's answer named the workspace path.
        path = ctx.pool.take_workspace_path(uid_of(pod)) if ctx.pool and pod else None
        status = session_status(
            session, state, now(), stopped=stopped, restart_required=outdated, workspace_path=path
        )
        # Turning Running: the runtime's first stats go into this same write (firstlook.py).
        status = await fold_first_stats(ctx, session, body, status, now())
        await _write_status(ctx, body, session, status)
        if ANNOTATION_RESUME in session.annotations:
            # Only after the status says "not stopped": a crash in between resumes again.
            await ctx.api.patch(
                session_path(namespace, name),
                {"metadata": {"annotations": {ANNOTATION_RESUME: None}}},
            )
            if session.status.phase == "Stopped":
                kopf.event(body, type="Normal", reason=Reason.RESUMED, message="resume requested")
        waits = state.reason == OLD
        return Reconciled(session.model_copy(update={"status": status}), body, waits)


async def _converge_pod(
    ctx: OperatorContext,
    session: SandboxSession,
    body: dict,
    pod: dict | None,
    desired: dict,
    *,
    stopped: bool,
    blocked: PodState | None,
    unread: bool = False,
) -> tuple[dict | None, PodState, bool]:
    """Delete, await or create the pod; its observed state; whether it is outdated.
    ``unread``: ``pod`` None was not read, only presumed (``_Taken`` if the name is)."""
    # A pod claimed from the warm pool keeps its own name (``session_pod_name``).
    name = (pod or desired)["metadata"]["name"]
    ns, path = session.namespace, core_path(session.namespace, "pods", name)
    ownership = judge(pod, session.uid)
    if pod is not None and ownership in ("orphaned", "foreign"):
        await ctx.api.delete(path, uid=uid_of(pod))
        message = "waiting for the pod of a previous incarnation to go"
        return pod, PodState("pending", OLD, message), False
    state = ctx.answers.observe(pod)
    if pod is not None and ownership == "ours":
        current = (pod["metadata"].get("annotations") or {}).get(ANNOTATION_POD_SPEC)
        outdated = current != desired["metadata"]["annotations"][ANNOTATION_POD_SPEC]
        if state.kind == "failed" and not stopped:
            kopf.event(body, type="Warning", reason=Reason.POD_FAILED, message=state.message)
        if state.kind == "failed" or (stopped and state.kind != "terminating"):
            await ctx.api.delete(path, uid=uid_of(pod))
            pod = await ctx.api.get(path)
        elif outdated and state.kind != "ready":
            # Nothing is served by a pod that is not ready: roll it now (this also fixes a
            # pod that cannot start once its spec is corrected).
            kopf.event(body, type="Normal", reason=Reason.SPEC_CHANGED, message="replacing the pod")
            await ctx.api.delete(path, uid=uid_of(pod))
            pod = await ctx.api.get(path)
        elif blocked is not None and state.kind != "ready":
            return pod, blocked, False  # why it cannot start
        else:
            return pod, state, outdated and state.kind == "ready"
        return pod, ctx.answers.observe(pod), False
    if pod is None and not stopped:
        if blocked is not None:
            return None, blocked, False
        # Warm pool (issue 25, operator/pool): claim a ready pod, else cold start.
        claimed = await claim_pod(ctx, session, body)
        if claimed is not None:
            kopf.event(
                body, type="Normal", reason=Reason.POD_CLAIMED, message="ready pod from the pool"
            )
            return claimed, ctx.answers.observe(claimed), False
        kopf.adopt(desired, owner=body)
        pod = await ctx.api.create(core_path(ns, "pods"), desired)
        if pod is None and unread:
            raise _Taken  # whose is it? judged by the reconcile from fresh reads
        if pod is None:  # created meanwhile by another trigger: read it
            pod = await ctx.api.get(path)
        if session.status.phase is not None:
            kopf.event(
                body, type="Normal", reason=Reason.POD_CREATED, message="sandbox pod created"
            )
        return pod, ctx.answers.observe(pod), False
    return pod, state, False


async def _after_answer(ctx: OperatorContext, namespace: str, name: str, waited: float) -> None:
    """The runtime of the session's starting pod answered: report it (Running)."""
    ctx.metrics.runtime_answer_seconds.observe(waited)
    await reconcile_session(ctx, namespace, name)


async def request_resume(ctx: OperatorContext, namespace: str, name: str) -> None:
    """Ask for a Stopped session to be started again (see the module contract)."""
    stamp = now().isoformat().replace("+00:00", "Z")
    await ctx.api.patch(
        session_path(namespace, name), {"metadata": {"annotations": {ANNOTATION_RESUME: stamp}}}
    )


# -- kopf handlers (registered in handlers/__init__.py) ----------------------------------


async def on_session_changed(
    name: str,
    namespace: str,
    memo: kopf.Memo,
    retry: int,
    body: kopf.Body | None = None,
    **_: Any,
) -> None:
    """create / resume / spec update: reconcile, retrying with backoff on API errors."""
    ctx: OperatorContext = memo.ctx
    seen = dict(body) if body is not None and not retry else None  # a retry reads afresh
    try:
        reconciled = await reconcile_session(ctx, namespace, name, seen=seen)
    except KubeError as e:
        ctx.metrics.reconciles.labels(KIND, "retry").inc()
        ctx.metrics.errors.labels(KIND, e.reason or str(e.status)).inc()
        raise kopf.TemporaryError(str(e), delay=_backoff(ctx, retry)) from e
    if reconciled is not None and reconciled.waiting:
        # No watch tells us when an old Secret or claim is gone: look again soon.
        ctx.metrics.reconciles.labels(KIND, "retry").inc()
        raise kopf.TemporaryError("waiting for a previous incarnation's children", delay=1)
    ctx.metrics.reconciles.labels(KIND, "ok").inc()


async def on_session_event(
    event: kopf.RawEvent, name: str, namespace: str, memo: kopf.Memo, **_: Any
) -> None:
    """A resume request is acted on at once; the session's deadline follows the object
    (``checks.feed``); a deleted session is forgotten."""
    ctx: OperatorContext = memo.ctx
    if event["type"] == "DELETED":
        ctx.metrics.session_phase(f"{namespace}/{name}", None)
        ctx.forget(namespace, name, event["object"].get("metadata", {}).get("uid"))
        return
    ctx.see_session(event["object"])  # first: what follows reads it
    annotations = event["object"].get("metadata", {}).get("annotations") or {}
    if ANNOTATION_RESUME in annotations:
        trigger = "resume-requested"  # the API's request: its trace goes on (traced.py)
        with traced.span("operator.reconcile", KIND, namespace, name, trigger, annotations):
            await reconcile_session(ctx, namespace, name)
    feed(ctx, event["object"])


async def on_runtime_pod_event(
    event: kopf.RawEvent, namespace: str, labels: kopf.Labels, memo: kopf.Memo, **_: Any
) -> None:
    """Any change of a sandbox pod: the session's status follows; a dead pod is replaced."""
    ctx: OperatorContext = memo.ctx
    session_name = labels.get(LABEL_SESSION)
    meta = event["object"].get("metadata", {})
    uid, version = meta.get("uid", ""), meta.get("resourceVersion")
    if ctx.pool is not None:  # a pooled pod being claimed: the claim's swap version first
        await ctx.pool.claim_settled(uid)
    if event["type"] == "DELETED":
        ctx.answers.forget(uid)
        ctx.pods_seen.pop(uid, None)
    elif version and ctx.pods_seen.get(uid) == version:
        return  # the version the last reconcile acted on (e.g. the ADDED of our create)
    gone = event["type"] == "DELETED" or meta.get("deletionTimestamp")
    if session_name and gone and _stopped(ctx.sessions_seen.get((namespace, session_name))):
        # A stopped session's pod going away (the idle stop's own deletion): the reconcile
        # would read both and change nothing — a stopped session's status names no pod.
        # A resume request makes the session not stopped (its event is seen first or
        # its own reconcile reads the pod afresh), so a resume never waits on this.
        return
    if session_name:
        # The event's pod stands for a read of it, unless it is gone (then read: absent,
        # or the session's next pod).
        seen = None if event["type"] == "DELETED" else event["object"]
        with traced.span("operator.reconcile", KIND, namespace, session_name, "pod-event"):
            await reconcile_session(ctx, namespace, session_name, pod_seen=seen)


def _stopped(body: dict[str, Any] | None) -> bool:
    """``status.is_stopped`` of a raw body (no model: this runs on every pod event)."""
    if body is None:
        return False
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    return (body.get("status") or {}).get("phase") == "Stopped" and (
        ANNOTATION_RESUME not in annotations
    )


def feed(ctx: OperatorContext, body: dict[str, Any]) -> None:
    """A session's event: its deadline follows what the object now says."""
    meta = body.get("metadata") or {}
    key = (meta.get("namespace", ""), meta.get("name", ""))
    ctx.see_session(body)
    deadlines = ctx.deadlines
    if deadlines is None:
        return
    deadlines.start()  # once; here, so its tasks inherit kopf's context (Events)
    try:
        session = SandboxSession.from_body(body)
    except ValidationError:
        deadlines.cancel(key)  # the reconciler reports an invalid spec
        return
    checked = ctx.checked_starts.get(session.uid) == start_marker(session)
    due = next_due(session, now(), ctx.settings.check_interval_seconds, checked=checked)
    if due is None:
        deadlines.cancel(key)
    else:
        deadlines.schedule(key, due.timestamp())


def _backoff(ctx: OperatorContext, retry: int) -> float:
    return min(0.5 * 2 ** min(retry, 10), ctx.settings.retry_max_delay_seconds)
