"""The short path of a start from the warm pool: a new or resumed session Running in the
fewest round trips (issue 25; the full reconcile is ``handlers/sessions.py``).

Contract: ``on_session_changed`` and ``on_session_event`` stand in front of the handlers
of the same names in ``sessions.py``. When the event is a start a pooled pod can serve —
a session never reconciled yet (no status; kopf's create, first try), or a Stopped one
whose resume request just arrived (its token and Secret known to this process) — in a
pool namespace with a free ready pod and a spec ``pool.misfits`` accepts, the start takes
the short path, under the session's lock, from the object the event carried (no read):

1. the swap of a free pod (``pool.claim.claim_pod``) and, for a new session, the creation
   of its token Secret, side by side — one round trip;
2. the token to the pod's runtime (it answers only that token from then on);
3. the whole status (Running, the pod, ``startedFrom: pool``, the ``workspacePath`` the
   runtime's claim answer named) in one write carrying the resourceVersion the event
   showed: if anything changed the session since, the write is refused (409), the
   claimed pod deleted, and the full reconcile decides.

A resume request's annotation is removed after the status (as the full reconcile does).
A claim counts as settled for the refiller and the deadlines (``refill.settle``) when its
status is written. The start's Events (``Running``, ``PodClaimed``, ``Resumed``) are
posted once the claims settle, not on the way: each is a write the next claims of a burst
would wait behind. kopf writes no diff base for a new session this path started (its
status is the record: ``operator/diffbase.py``).
Anything else — no pool, no free pod, a misfit, a Secret already there (an earlier
incarnation's), a refused write, an API error — falls through to the full reconcile, which
tries the pool again and starts cold otherwise; a pod claimed on the way is deleted first
(claimed pods never go back), so nothing but that reconcile's own pod serves the session.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

import kopf
from pydantic import ValidationError

from sandbox_workspace.contract.conditions import Reason
from sandbox_workspace.contract.crd import ANNOTATION_RESUME
from sandbox_workspace.kube import KubeConflict, KubeError, core_path

from ..builders import build_runtime_secret
from ..children import uid_of
from ..context import OperatorContext
from ..models import SandboxSession
from ..pool import misfits
from ..pool.claim import claim_pod, claims_api
from ..pool.refill import settle
from ..status import session_status
from . import sessions, traced

log = logging.getLogger("sandbox_workspace.operator.pool")


def _eligible(ctx: OperatorContext, body: dict[str, Any]) -> SandboxSession | None:
    """The session when a pooled pod may start it now (the module contract)."""
    pool, meta = ctx.pool, body.get("metadata") or {}
    ns = meta.get("namespace", "")
    if pool is None or not pool.serves(ns) or not pool.counts(ns)[0]:
        return None
    if meta.get("deletionTimestamp"):
        return None
    try:
        session = SandboxSession.from_body(body)
    except ValidationError:
        return None  # the full reconcile reports it
    return None if misfits(session.spec, ctx.settings) else session


async def _start(ctx: OperatorContext, session: SandboxSession, body: dict[str, Any]) -> bool:
    """Steps 1–3 of the contract; True when the session is Running on a pooled pod."""
    ns, name, uid = session.namespace, session.name, session.uid
    marks = {"begun": time.monotonic()}
    if session.status.phase is None:  # new: its token Secret is made beside the swap
        token = secrets.token_urlsafe(32)
        manifest = build_runtime_secret(session, token)
        kopf.adopt(manifest, owner=body)

        async def make_secret() -> bool:
            made = await claims_api(ctx).create(core_path(ns, "secrets"), manifest)
            if made is not None:
                ctx.remember_token(uid, token)
            return made is not None

        claimed = await claim_pod(
            ctx, session, body, token=token, alongside=make_secret, marks=marks
        )
    else:  # resumed: the token this process made or read for this incarnation
        if uid not in ctx.children_seen:
            return False
        token = await ctx.runtime_token(ns, name, uid)
        claimed = await claim_pod(ctx, session, body, token=token, marks=marks) if token else None
    if claimed is None:
        return False
    assert ctx.pool is not None  # a claim needs one
    path = ctx.pool.take_workspace_path(uid_of(claimed))  # the claim's answer named it
    state = ctx.answers.observe(claimed)
    status = session_status(session, state, sessions.now(), workspace_path=path)
    post = _post_when_settled(ctx)
    try:
        await sessions._write_status(ctx, body, session, status, guard=True, post=post)
    except BaseException as e:
        # Changed since the event (409), or the write failed: the pod is nobody's to
        # serve now — deleted; the full reconcile decides from what the session is.
        path = core_path(ns, "pods", claimed["metadata"]["name"])
        await claims_api(ctx).delete(path, uid=uid_of(claimed))
        if isinstance(e, KubeConflict):
            return False
        raise
    marks["written"] = time.monotonic()
    _log_steps(session, marks)
    ctx.children_seen.add(uid)
    if session.status.phase is not None:  # as a cold start: no Event of its own when new
        post(body, type="Normal", reason=Reason.POD_CLAIMED, message="ready pod from the pool")
    if ctx.pool is not None:
        ctx.pool.short_starts += 1
        ctx.pool.note_written()
    return True


def _post_when_settled(ctx: OperatorContext) -> Callable[..., None]:
    """``kopf.event``, posted once the pool's claims settle (``refill.settle``); at once
    without a pool. The task inherits kopf's context (its Event queue)."""
    pool = ctx.pool
    if pool is None:
        return kopf.event

    def post(*args: Any, **kwargs: Any) -> None:
        async def later() -> None:
            await settle(pool)
            kopf.event(*args, **kwargs)

        task = asyncio.create_task(later(), name="pool start event")
        pool.posting.add(task)  # held until done (the loop keeps only weak references)
        task.add_done_callback(pool.posting.discard)

    return post


def _log_steps(session: SandboxSession, marks: dict[str, float]) -> None:
    """Where one short-path start's time went (ms from the handler's start, and that start
    on the monotonic clock, which benchmarks on the same machine share)."""
    begun = marks["begun"]
    steps = {k: round((v - begun) * 1000, 1) for k, v in marks.items() if k != "begun"}
    log.info(
        "started from the pool",
        extra={"session": f"{session.namespace}/{session.name}", "steps_ms": steps, "begun": begun},
    )


async def start_from_pool(ctx: OperatorContext, body: dict[str, Any], *, resume: bool) -> bool:
    """The short path, when the event allows it; True when the session started by it."""
    session = _eligible(ctx, body)
    if session is None:
        return False
    if resume != (session.status.phase == "Stopped" and ANNOTATION_RESUME in session.annotations):
        return False
    if not resume and session.status.phase is not None:
        return False
    async with ctx.lock(session.namespace, session.name):
        try:
            started = await _start(ctx, session, body)
        except KubeError:
            return False  # the full reconcile retries with its backoff
    if started and resume:
        path = sessions.session_path(session.namespace, session.name)
        await ctx.api.patch(path, {"metadata": {"annotations": {ANNOTATION_RESUME: None}}})
        _post_when_settled(ctx)(
            body, type="Normal", reason=Reason.RESUMED, message="resume requested"
        )
    return started


# -- kopf handlers (registered in handlers/__init__.py in place of sessions'.) -----------


async def on_session_changed(
    body: kopf.Body, memo: kopf.Memo, retry: int, reason: str = "", **kwargs: Any
) -> None:
    """A new session (kopf's create, first try) by the short path, else the full one."""
    ctx: OperatorContext = memo.ctx
    if reason == "create" and not retry and await start_from_pool(ctx, dict(body), resume=False):
        ctx.metrics.reconciles.labels(sessions.KIND, "ok").inc()
        if ctx.pool is not None:  # its status write is the record: kopf writes none
            ctx.pool.started_new.add(body.get("metadata", {}).get("uid", ""))
        return
    await sessions.on_session_changed(memo=memo, retry=retry, reason=reason, body=body, **kwargs)


async def on_session_event(
    event: kopf.RawEvent, name: str, namespace: str, memo: kopf.Memo, **kwargs: Any
) -> None:
    """A resume request by the short path, else ``sessions.on_session_event``."""
    ctx: OperatorContext = memo.ctx
    body = event["object"]
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    if event["type"] != "DELETED" and ANNOTATION_RESUME in annotations:
        with traced.span(
            "operator.reconcile", sessions.KIND, namespace, name, "resume-requested", annotations
        ):
            if await start_from_pool(ctx, body, resume=True):
                sessions.feed(ctx, body)
                return
    await sessions.on_session_event(
        event=event, name=name, namespace=namespace, memo=memo, **kwargs
    )
