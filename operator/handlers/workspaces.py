"""ConversationWorkspace → its directory in the session's runtime; deletion guarded.

Contract:
- Create/resume ("ensure"): the workspace is adopted by its session (so deleting the
  session deletes the workspaces), the directory is ensured through the runtime
  (``PUT /v1/conversations/{cid}``) and the status set Ready with path, file count and
  bytes. A missing session, or one being deleted, deletes the workspace (reason
  ``SessionGone``, then the finalizer below): deleting a session deletes its
  conversations, also one made as it went — except one the session adopted whose
  deletion orphans it (``kubectl delete --cascade=orphan``: the orphan finalizer on
  the session, or our owner reference gone while ``adopted-by`` names it), which is
  kept with its files, as a Ready one and the session's claim are (reason
  ``Orphaned``, one Event); it waits, looking every ``check_interval_seconds``, for a
  session of the same name, which adopts it. A stopped or starting session is waited
  for — a stopped one is never asked to resume from here, so an operator restart
  starts no pod; the directory is made by the session's next real use. On resume, a
  workspace already Ready for its generation is left alone. An invalid spec (a
  conversation id the runtime refuses) is an Error with reason ``InvalidSpec``, not a
  retry loop.
- Delete (finalizer ``sandboxworkspace.io/files``): the status says Deleting; what
  happens next is decided by the storage (``operator/storage.py``): the session's runtime
  or a cleanup pod's (``operator/cleanup.py``) deletes the directory (``DELETE``) and a
  ``GET`` must confirm ``exists`` is false before the handler returns and kopf releases
  the finalizer. A stopped session is asked to resume (real demand). Anything not yet
  possible → ``kopf.TemporaryError`` with backoff, forever, the reason in the status:
  never a PermanentError, never a release while storage that may hold the files exists.
  A conversation id the runtime's rules refuse was never written: released at once.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import kopf
from pydantic import ValidationError

from sandbox_workspace.contract.conditions import ConditionType, Reason
from sandbox_workspace.contract.crd import ANNOTATION_ADOPTED_BY, SESSION_PLURAL, WORKSPACE_PLURAL
from sandbox_workspace.kube import KubeError, custom_path
from sandbox_workspace.runtime.client import RuntimeClient, RuntimeClientError, RuntimeRefused

from ..context import OperatorContext
from ..models import ConversationWorkspace, ConversationWorkspaceStatus, SandboxSession
from ..status import condition, is_stopped, set_condition
from .sessions import request_resume

KIND = "ConversationWorkspace"


def now() -> datetime:
    return datetime.now(UTC)


def ws_status(
    previous: ConversationWorkspaceStatus,
    phase: str,
    ready: bool,
    reason: str,
    message: str,
    **fields: Any,
) -> dict[str, Any]:
    conds = set_condition(
        list(previous.conditions), ConditionType.READY, ready, reason, message, now()
    )
    status = previous.model_copy(update={"phase": phase, "conditions": conds, **fields})
    return status.model_dump(mode="json", by_alias=True, exclude_none=True)


class Wait(Exception):
    """Not yet possible; retry after ``delay`` (reason and message go to the status)."""

    def __init__(self, reason: str, message: str, delay: float | None = None) -> None:
        super().__init__(message)
        self.reason, self.delay = reason, delay


async def session_runtime(
    ctx: OperatorContext, session_body: dict, *, resume: bool
) -> RuntimeClient:
    """The session's runtime, or ``Wait`` until there is one (``resume``: a stopped
    session is asked to start — only for real demand, such as deleting files)."""
    session = SandboxSession.from_body(session_body)
    if is_stopped(session):
        if not resume:
            raise Wait(Reason.SESSION_STOPPED, "the session is stopped; waiting for its next use")
        await request_resume(ctx, session.namespace, session.name)
        raise Wait(Reason.SESSION_STOPPED, "the session is stopped; resume requested", 0.5)
    if session.status.phase != "Running" or not session.status.endpoint:
        phase = session.status.phase or "Pending"
        raise Wait(Reason.SESSION_NOT_RUNNING, f"waiting for the session's runtime ({phase})")
    client = await ctx.runtime(
        session.namespace, session.name, session.status.endpoint, session.uid
    )
    if client is None:
        raise Wait(Reason.TOKEN_MISSING, "the session's runtime token is not there yet")
    return client


def _owner_patch(body: dict, session_body: dict) -> dict | None:
    """Owner reference to the session and ``adopted-by`` naming it, when the workspace
    lacks either (one adopted before the annotation existed gets it now)."""
    uid = session_body["metadata"]["uid"]
    refs = list(body["metadata"].get("ownerReferences") or [])
    patch: dict[str, Any] = {}
    if not any(r.get("uid") == uid for r in refs):
        # Not a controller reference: the session owns the workspace's lifetime only.
        ref = {
            "apiVersion": session_body["apiVersion"],
            "kind": session_body["kind"],
            "name": session_body["metadata"]["name"],
            "uid": uid,
            "controller": False,
            "blockOwnerDeletion": False,
        }
        patch["ownerReferences"] = [*refs, ref]
    if (body["metadata"].get("annotations") or {}).get(ANNOTATION_ADOPTED_BY) != uid:
        patch["annotations"] = {ANNOTATION_ADOPTED_BY: uid}
    return patch or None


def _orphaned(body: dict, session_body: dict | None) -> bool:
    """Whether the deletion of the session that adopted this workspace orphans it: it
    carries the orphan finalizer (the garbage collector is removing our reference), or
    the reference named by ``adopted-by`` is gone. A workspace never adopted was never
    the session's dependent: no propagation policy speaks for it."""
    meta = body["metadata"]
    adopted = (meta.get("annotations") or {}).get(ANNOTATION_ADOPTED_BY)
    if not adopted:
        return False
    if session_body is not None and "orphan" in (session_body["metadata"].get("finalizers") or []):
        return True
    return not any(r.get("uid") == adopted for r in meta.get("ownerReferences") or [])


def _invalid_message(error: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())


async def _follow_the_session(
    ctx: OperatorContext,
    body: dict,
    patch: kopf.Patch,
    cws: ConversationWorkspace,
    session_body: dict | None,
) -> None:
    """Delete a workspace whose session is gone or going: the session's deletion deletes
    its conversations. The garbage collector does so only for one adopted in time (an
    owner reference); this one was made for a session already deleted, by hand or by
    the API racing that deletion, or the session went before the operator looked. The
    finalizer then deletes its files and store objects (``deletion.py``)."""
    ref = cws.spec.session_ref
    gone = "does not exist" if session_body is None else "is being deleted"
    message = f"SandboxSession {ref} {gone}: deleting this conversation with it"
    path = custom_path(cws.namespace, WORKSPACE_PLURAL, cws.name)
    # By uid: a successor made meanwhile under the name is never deleted from here.
    await ctx.api.delete(path, uid=cws.uid)
    kopf.event(body, type="Normal", reason=Reason.SESSION_GONE, message=message)
    patch.status.update(ws_status(cws.status, "Deleting", False, Reason.SESSION_GONE, message))
    ctx.metrics.reconciles.labels(KIND, "ok").inc()


async def on_workspace_created(
    body: kopf.Body,
    name: str,
    namespace: str,
    patch: kopf.Patch,
    memo: kopf.Memo,
    retry: int,
    reason: str,
    logger: kopf.Logger,
    **_: Any,
) -> None:
    ctx: OperatorContext = memo.ctx
    raw = dict(body)
    try:
        cws = ConversationWorkspace.from_body(raw)
    except ValidationError as e:
        message = _invalid_message(e)
        patch.status.update(
            ws_status(ConversationWorkspaceStatus(), "Error", False, Reason.INVALID_SPEC, message)
        )
        kopf.warn(raw, reason=Reason.INVALID_SPEC, message=message)
        raise kopf.PermanentError(f"invalid spec: {message}") from e  # can never work
    if (
        reason == kopf.Reason.RESUME
        and cws.status.phase == "Ready"
        and cws.status.observed_generation == cws.generation
    ):
        return  # an operator restart: nothing to do, and no reason to wake the session
    delay = backoff(ctx, retry)
    try:
        session_body = await ctx.api.get(
            custom_path(namespace, SESSION_PLURAL, cws.spec.session_ref)
        )
        if session_body is None or session_body["metadata"].get("deletionTimestamp"):
            if _orphaned(raw, session_body):
                message = (
                    f"SandboxSession {cws.spec.session_ref} was deleted with its dependents "
                    "orphaned: this conversation and its files are kept; a session of the "
                    "same name adopts it, deleting it deletes its files"
                )
                ready = condition(cws.status, ConditionType.READY)
                if ready is None or ready.reason != Reason.ORPHANED:  # one Event
                    kopf.event(raw, type="Normal", reason=Reason.ORPHANED, message=message)
                raise Wait(Reason.ORPHANED, message, ctx.settings.check_interval_seconds)
            await _follow_the_session(ctx, raw, patch, cws, session_body)
            return
        owner = _owner_patch(raw, session_body)
        if owner:
            patch.metadata.update(owner)
        try:
            client = await session_runtime(ctx, session_body, resume=False)
        except Wait as w:
            if w.reason == Reason.SESSION_STOPPED:
                w.delay = ctx.settings.check_interval_seconds
            raise
        try:
            # The create answers what a look would (path, files, bytes): one call, not two
            # — this runs beside the conversation's first command (an E2B Start, a chat).
            info = await client.ensure_conversation(cws.spec.conversation_id)
        except RuntimeRefused as e:
            if e.retryable:  # e.g. 409 conversation_deleting: a deletion is under way
                raise Wait(Reason.RUNTIME_BUSY, str(e)) from e
            patch.status.update(ws_status(cws.status, "Error", False, Reason.REFUSED, str(e)))
            ctx.metrics.reconciles.labels(KIND, "error").inc()
            raise kopf.PermanentError(f"the runtime refuses this conversation: {e}") from e
        except RuntimeClientError as e:
            raise Wait(Reason.RUNTIME_UNAVAILABLE, str(e)) from e
    except Wait as w:
        patch.status.update(ws_status(cws.status, "Pending", False, w.reason, str(w)))
        ctx.metrics.reconciles.labels(KIND, "retry").inc()
        raise kopf.TemporaryError(str(w), delay=w.delay or delay) from w
    except KubeError as e:
        ctx.metrics.errors.labels(KIND, e.reason or str(e.status)).inc()
        raise kopf.TemporaryError(str(e), delay=delay) from e
    patch.status.update(
        ws_status(
            cws.status,
            "Ready",
            True,
            Reason.DIRECTORY_READY,
            "the directory exists",
            path=info.path,
            file_count=info.file_count,
            total_bytes=info.total_bytes,
            observed_generation=cws.generation,
        )
    )
    ctx.metrics.reconciles.labels(KIND, "ok").inc()


def backoff(ctx: OperatorContext, retry: int) -> float:
    return min(0.25 * 2 ** min(retry, 10), ctx.settings.retry_max_delay_seconds)
