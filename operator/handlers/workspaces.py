"""ConversationWorkspace → its directory in the session's runtime; deletion guarded.

Contract:
- Create/resume: the workspace is adopted by its session (so deleting the session
  deletes the workspaces), the directory is ensured through the runtime
  (``PUT /v1/conversations/{cid}``) and the status set Ready with path, file count and
  bytes. A missing, stopped or starting session is waited for (a stopped one is asked to
  resume); a conversation id the runtime refuses is an Error (it can never work).
- Delete (finalizer ``sandboxworkspace.io/files``): the status says Deleting; the
  runtime deletes the directory (``DELETE``) and a ``GET`` must confirm ``exists`` is
  false before the handler returns and kopf releases the finalizer. Unreachable runtime
  → ``kopf.TemporaryError`` with backoff, forever: never a PermanentError, never a
  release while the files may exist. Stopped session → resume requested, retried.
  Released without the runtime only when the storage provably no longer exists: the
  session is gone, or it has neither pod nor PVC (or is being deleted and has no pod —
  its PVC goes with it).
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from typing import Any

import kopf
from pydantic import ValidationError

from .. import naming
from ..context import OperatorContext
from ..kube import KubeError, core_path, custom_path
from ..models import (
    SESSION_PLURAL,
    WORKSPACE_PLURAL,
    ConversationWorkspace,
    ConversationWorkspaceStatus,
    SandboxSession,
)
from ..runtime_client import RuntimeClient, RuntimeClientError, RuntimeRefused
from ..status import is_stopped, set_condition
from .sessions import request_resume

KIND = "ConversationWorkspace"


def now() -> datetime:
    return datetime.now(UTC)


def _status(
    previous: ConversationWorkspaceStatus,
    phase: str,
    ready: bool,
    reason: str,
    message: str,
    **fields: Any,
) -> dict[str, Any]:
    conds = set_condition(list(previous.conditions), "Ready", ready, reason, message, now())
    status = previous.model_copy(update={"phase": phase, "conditions": conds, **fields})
    return status.model_dump(mode="json", by_alias=True, exclude_none=True)


class _Wait(Exception):
    """Not yet possible; retry after ``delay`` (reason and message go to the status)."""

    def __init__(self, reason: str, message: str, delay: float | None = None) -> None:
        super().__init__(message)
        self.reason, self.delay = reason, delay


async def _runtime_of(
    ctx: OperatorContext, cws: ConversationWorkspace, session_body: dict
) -> RuntimeClient:
    """The session's runtime, or ``_Wait`` until there is one."""
    session = SandboxSession.from_body(session_body)
    if is_stopped(session):
        await request_resume(ctx, session.namespace, session.name)
        raise _Wait("SessionStopped", "the session is stopped; resume requested", 0.5)
    if session.status.phase != "Running" or not session.status.endpoint:
        phase = session.status.phase or "Pending"
        raise _Wait("SessionNotRunning", f"waiting for the session's runtime ({phase})")
    client = await ctx.runtime(cws.namespace, session.name, session.status.endpoint, session.uid)
    if client is None:
        raise _Wait("TokenMissing", "the session's runtime token is not there yet")
    return client


def _owner_patch(body: dict, session_body: dict) -> dict | None:
    """Owner reference to the session, when the workspace has none yet."""
    uid = session_body["metadata"]["uid"]
    refs = list(body["metadata"].get("ownerReferences") or [])
    if any(r.get("uid") == uid for r in refs):
        return None
    # Not a controller reference: the session owns the workspace's lifetime only.
    ref = {
        "apiVersion": session_body["apiVersion"],
        "kind": session_body["kind"],
        "name": session_body["metadata"]["name"],
        "uid": uid,
        "controller": False,
        "blockOwnerDeletion": False,
    }
    return {"ownerReferences": [*refs, ref]}


async def on_workspace_created(
    body: kopf.Body,
    name: str,
    namespace: str,
    patch: kopf.Patch,
    memo: kopf.Memo,
    retry: int,
    logger: kopf.Logger,
    **_: Any,
) -> None:
    ctx: OperatorContext = memo.ctx
    raw = dict(body)
    try:
        cws = ConversationWorkspace.from_body(raw)
    except ValidationError as e:
        patch.status.update(
            _status(ConversationWorkspaceStatus(), "Error", False, "InvalidSpec", str(e))
        )
        raise kopf.PermanentError(f"invalid spec: {e}") from e  # can never work
    delay = _backoff(ctx, retry)
    try:
        session_body = await ctx.api.get(
            custom_path(namespace, SESSION_PLURAL, cws.spec.session_ref)
        )
        if session_body is None:
            raise _Wait("SessionMissing", f"SandboxSession {cws.spec.session_ref} does not exist")
        owner = _owner_patch(raw, session_body)
        if owner:
            patch.metadata.update(owner)
        client = await _runtime_of(ctx, cws, session_body)
        try:
            await client.ensure_conversation(cws.spec.conversation_id)
            info = await client.conversation_info(cws.spec.conversation_id)
        except RuntimeRefused as e:
            patch.status.update(_status(cws.status, "Error", False, "Refused", str(e)))
            ctx.metrics.reconciles.labels(KIND, "error").inc()
            raise kopf.PermanentError(f"the runtime refuses this conversation: {e}") from e
        except RuntimeClientError as e:
            raise _Wait("RuntimeUnavailable", str(e)) from e
    except _Wait as w:
        patch.status.update(_status(cws.status, "Pending", False, w.reason, str(w)))
        ctx.metrics.reconciles.labels(KIND, "retry").inc()
        raise kopf.TemporaryError(str(w), delay=w.delay or delay) from w
    except KubeError as e:
        ctx.metrics.errors.labels(KIND, e.reason or str(e.status)).inc()
        raise kopf.TemporaryError(str(e), delay=delay) from e
    patch.status.update(
        _status(
            cws.status,
            "Ready",
            True,
            "DirectoryReady",
            "the directory exists",
            path=info.path,
            file_count=info.file_count,
            total_bytes=info.total_bytes,
            observed_generation=cws.generation,
        )
    )
    ctx.metrics.reconciles.labels(KIND, "ok").inc()


async def _storage_gone(ctx: OperatorContext, session_body: dict | None) -> str | None:
    """Why the files provably no longer exist, or None."""
    if session_body is None:
        return "the session no longer exists"
    meta = session_body["metadata"]
    ns, name = meta["namespace"], meta["name"]
    pod = await ctx.api.get(core_path(ns, "pods", naming.runtime_pod_name(name)))
    if pod is not None:
        return None
    if meta.get("deletionTimestamp"):
        return "the session is being deleted and has no pod (its PVC goes with it)"
    claim = await ctx.api.get(
        core_path(ns, "persistentvolumeclaims", naming.workspace_claim_name(name))
    )
    return "the session has neither pod nor PVC" if claim is None else None


async def on_workspace_deleted(
    body: kopf.Body,
    name: str,
    namespace: str,
    memo: kopf.Memo,
    retry: int,
    logger: kopf.Logger,
    **_: Any,
) -> None:
    """Finalizer: return only when the files are verified gone (see module contract)."""
    ctx: OperatorContext = memo.ctx
    raw = dict(body)
    try:
        cws = ConversationWorkspace.from_body(raw)
    except ValidationError:
        logger.warning("invalid spec: no directory was ever created for it; releasing")
        return
    path = custom_path(namespace, WORKSPACE_PLURAL, name) + "/status"
    delay = _backoff(ctx, retry)
    try:
        if cws.status.phase != "Deleting":
            await ctx.api.patch(
                path,
                {
                    "status": _status(
                        cws.status, "Deleting", False, "Deleting", "deleting the files"
                    )
                },
            )
        session_body = await ctx.api.get(
            custom_path(namespace, SESSION_PLURAL, cws.spec.session_ref)
        )
        gone = await _storage_gone(ctx, session_body)
        if gone:
            logger.info(f"files released without the runtime: {gone}")
            _observe_latency(ctx, raw)
            return
        assert session_body is not None
        client = await _runtime_of(ctx, cws, session_body)
        cid = cws.spec.conversation_id
        try:
            await client.delete_conversation(cid)
            info = await client.conversation_info(cid)
        except RuntimeRefused as e:
            if e.status == 400:  # an id the runtime refuses can never have had a directory
                logger.warning(f"the runtime refuses the conversation id ({e}); releasing")
                return
            raise _Wait("RuntimeRefused", str(e)) from e
        except RuntimeClientError as e:
            raise _Wait("RuntimeUnavailable", f"{e}; retrying") from e
        if info.exists:
            raise _Wait("StillExists", "the directory still exists after deletion")
    except _Wait as w:
        ctx.metrics.reconciles.labels(KIND, "retry").inc()
        ctx.metrics.errors.labels(KIND, w.reason).inc()
        await _note(ctx, path, cws, w)
        raise kopf.TemporaryError(str(w), delay=w.delay or delay) from w
    except KubeError as e:
        ctx.metrics.errors.labels(KIND, e.reason or str(e.status)).inc()
        raise kopf.TemporaryError(str(e), delay=delay) from e
    _observe_latency(ctx, raw)
    ctx.metrics.reconciles.labels(KIND, "ok").inc()
    logger.info("files verified gone; releasing the finalizer")


async def _note(ctx: OperatorContext, path: str, cws: ConversationWorkspace, w: _Wait) -> None:
    """Say in the status why deletion waits (best effort: the retry matters more)."""
    with contextlib.suppress(KubeError):
        await ctx.api.patch(
            path,
            {
                "status": _status(
                    cws.status.model_copy(update={"phase": "Deleting"}),
                    "Deleting",
                    False,
                    w.reason,
                    str(w),
                )
            },
        )


def _observe_latency(ctx: OperatorContext, body: dict) -> None:
    stamp = body["metadata"].get("deletionTimestamp")
    if stamp:
        started = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
        ctx.metrics.deletion_seconds.observe(max(0.0, (now() - started).total_seconds()))


def _backoff(ctx: OperatorContext, retry: int) -> float:
    return min(0.25 * 2 ** min(retry, 10), ctx.settings.retry_max_delay_seconds)
