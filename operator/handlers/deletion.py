"""The finalizer of a ConversationWorkspace: return only when its files are gone.

Contract: see ``handlers/workspaces.py`` (Delete) and ``operator/storage.py`` (which
storage decides). This module gathers the facts from the API, acts on the decision, and
keeps the reason it waits in the status (an Event when that reason changes).
"""

from __future__ import annotations

import contextlib
import re
import time
from datetime import datetime
from typing import Any

import kopf

from sandbox_workspace.contract.conditions import ConditionType, Reason
from sandbox_workspace.contract.crd import (
    ANNOTATION_TENANT_ID,
    ANNOTATION_WRITER_PREFIX,
    LABEL_SESSION,
    SESSION_PLURAL,
    WORKSPACE_PLURAL,
)
from sandbox_workspace.contract.ids import UnsafePath, check_conversation_id
from sandbox_workspace.kube import KubeError, core_path, custom_path
from sandbox_workspace.runtime.client import RuntimeClient, RuntimeClientError, RuntimeRefused
from sandbox_workspace.store import StoreError
from sandbox_workspace.store.layout import DEFAULT_TENANT, Layout, Scope

from .. import naming
from ..children import uid_of
from ..cleanup import NotReady, cleanup_runtime, remove_cleanup
from ..context import OperatorContext
from ..models import DNS_LABEL_PATTERN, ConversationWorkspaceStatus
from ..storage import (
    CleanupRuntime,
    DeletePod,
    Release,
    SessionRuntime,
    StorageFacts,
    decide,
)
from ..storage import Wait as StorageWait
from .workspaces import KIND, Wait, backoff, now, session_runtime, ws_status


def _never_written(spec: dict[str, Any]) -> str | None:
    """Why no directory can exist for this spec (ids the runtime refuses), or None."""
    try:
        check_conversation_id(spec.get("conversationId"))  # type: ignore[arg-type]
    except (UnsafePath, TypeError) as e:
        return f"conversationId is refused by the runtime ({e}): nothing was ever written"
    if not re.match(DNS_LABEL_PATTERN, str(spec.get("sessionRef") or "")):
        return "sessionRef names no possible session: nothing was ever written"
    return None


async def storage_facts(ctx: OperatorContext, namespace: str, session_ref: str) -> StorageFacts:
    """What the API holds about the storage of session ``session_ref``."""
    session = await ctx.api.get(custom_path(namespace, SESSION_PLURAL, session_ref))
    # Its children's names as it was made (naming.legacy_children); with the session
    # gone, either: a claim of either name may outlive it (orphaned) and hold files.
    schemes = (
        [naming.legacy_children((session.get("metadata") or {}).get("annotations"))]
        if session is not None
        else [False, True]
    )
    claim_names = [naming.workspace_claim_name(session_ref, legacy=legacy) for legacy in schemes]
    claim = None
    for claim_name in claim_names:
        claim = await ctx.api.get(core_path(namespace, "persistentvolumeclaims", claim_name))
        if claim is not None:
            break
    pod_name = naming.runtime_pod_name(session_ref, legacy=schemes[0])
    pod = await ctx.api.get(core_path(namespace, "pods", pod_name))
    if pod is None:  # a pod claimed from the warm pool keeps its own name (operator/pool)
        pods = await ctx.api.list(core_path(namespace, "pods"), f"{LABEL_SESSION}={session_ref}")
        pod = pods[0] if pods else None
    volumes = []
    if claim is None:  # a bound claim's volume holds nothing the claim does not decide
        for pv in await ctx.api.list("/api/v1/persistentvolumes"):
            ref = (pv.get("spec") or {}).get("claimRef") or {}
            if ref.get("namespace") == namespace and ref.get("name") in claim_names:
                volumes.append(pv)
    return StorageFacts(session=session, claim=claim, pod=pod, volumes=volumes)


async def _delete_through(client: RuntimeClient, cid: str) -> None:
    """DELETE, then a GET that must confirm the directory is gone."""
    try:
        await client.delete_conversation(cid)
        info = await client.conversation_info(cid)
    except RuntimeRefused as e:
        raise Wait(Reason.RUNTIME_REFUSED, f"{e}; retrying") from e
    except RuntimeClientError as e:
        raise Wait(Reason.RUNTIME_UNAVAILABLE, f"{e}; retrying") from e
    if info.exists:
        raise Wait(Reason.STILL_EXISTS, "the directory still exists after deletion")


async def _act(ctx: OperatorContext, namespace: str, spec: dict[str, Any]) -> str:
    """Carry out the storage's decision; the reason the files are gone, or ``Wait``."""
    cid, session_ref = spec["conversationId"], spec["sessionRef"]
    facts = await storage_facts(ctx, namespace, session_ref)
    decision = decide(facts)
    if isinstance(decision, Release):
        return decision.why
    if isinstance(decision, StorageWait):
        # Files kept by an administrator's choice: look again at the slowest retry pace.
        slow = decision.reason == Reason.VOLUME_RETAINED
        raise Wait(
            decision.reason,
            decision.message,
            ctx.settings.retry_max_delay_seconds if slow else None,
        )
    if isinstance(decision, DeletePod):
        await ctx.api.delete(
            core_path(namespace, "pods", decision.pod["metadata"]["name"]),
            uid=uid_of(decision.pod),
        )
        raise Wait(Reason.POD_TERMINATING, "deleted the orphaned pod holding the emptyDir")
    if isinstance(decision, SessionRuntime):
        assert facts.session is not None
        client = await session_runtime(ctx, facts.session, resume=True)
        await _delete_through(client, cid)
        return f"the session's runtime confirmed the directory is gone ({decision.why})"
    assert isinstance(decision, CleanupRuntime)
    claim = decision.claim["metadata"]["name"]
    try:
        client = await cleanup_runtime(ctx, decision.claim)
    except NotReady as e:
        raise Wait(Reason.CLEANUP_POD_STARTING, str(e)) from e
    await _delete_through(client, cid)
    await remove_cleanup(ctx, namespace, claim)
    return f"a cleanup runtime on orphaned claim {claim} confirmed the directory is gone"


def _lease_end(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        return 0.0  # not a lease: nobody can be writing under it


async def _writers_done(ctx: OperatorContext, namespace: str, name: str) -> None:
    """``Wait`` while an API process holds the conversation's store prefix (announced on
    the resource, ``crd.ANNOTATION_WRITER_PREFIX``, lease running): its objects may
    not have landed yet. Read after the deletion began, so a writer not seen here was
    refused when it announced itself. An ended lease (its API process died mid-write) is
    removed: whatever that writer left is in the store by now, and cleared next."""
    path = custom_path(namespace, WORKSPACE_PLURAL, name)
    annotations = ((await ctx.api.get(path) or {}).get("metadata") or {}).get("annotations")
    writers = {
        k: v for k, v in (annotations or {}).items() if k.startswith(ANNOTATION_WRITER_PREFIX)
    }
    now_s = time.time()
    live = [k for k, v in writers.items() if _lease_end(v) > now_s]
    if ended := [k for k in writers if k not in live]:
        await ctx.api.patch(path, {"metadata": {"annotations": dict.fromkeys(ended)}})
    if live:
        raise Wait(Reason.WRITERS_IN_FLIGHT, f"{len(live)} write(s) to the store in flight", 0.2)


async def _clear_store(ctx: OperatorContext, namespace: str, name: str, body: dict) -> str:
    """Delete the conversation's objects from the store once no writer holds the prefix;
    ``Wait`` unless none is left. The scope is the API's (store/layout.py): the tenant
    (annotated on a tenant's resources; else ``default``) and its user's session."""
    if ctx.store is None:
        return ""
    await _writers_done(ctx, namespace, name)
    spec = body.get("spec") or {}
    user = spec.get("userId")
    tenant = (body["metadata"].get("annotations") or {}).get(ANNOTATION_TENANT_ID)
    if not user:  # a workspace made by hand: its session names the user, if it still exists
        session = await ctx.api.get(custom_path(namespace, SESSION_PLURAL, spec["sessionRef"]))
        user = ((session or {}).get("spec") or {}).get("userId")
        annotations = ((session or {}).get("metadata") or {}).get("annotations") or {}
        tenant = tenant or annotations.get(ANNOTATION_TENANT_ID)
    if not user:
        return "; no user: the API never wrote it to the store"
    tenant = tenant or DEFAULT_TENANT
    scope = Scope(tenant, naming.session_id_for(user, tenant))
    prefix = Layout(ctx.settings.s3.prefix).conversation(scope, spec["conversationId"])
    try:
        left = await ctx.store.delete_prefix(prefix)
    except StoreError as e:
        raise Wait(Reason.STORE_UNAVAILABLE, f"object store: {e}; retrying") from e
    if left:
        raise Wait(Reason.STORE_NOT_EMPTY, f"{left} object(s) still under {prefix}; retrying")
    return f"; no object left under {prefix}"


async def on_workspace_deleted(
    body: kopf.Body,
    name: str,
    namespace: str,
    memo: kopf.Memo,
    retry: int,
    logger: kopf.Logger,
    **_: Any,
) -> None:
    """Finalizer: return only when the files are verified gone (see the module contract)."""
    ctx: OperatorContext = memo.ctx
    raw = dict(body)
    spec = dict(raw.get("spec") or {})
    never = _never_written(spec)
    if never:
        logger.warning(f"releasing: {never}")
        return
    status = ConversationWorkspaceStatus.model_validate(raw.get("status") or {})
    path = custom_path(namespace, WORKSPACE_PLURAL, name) + "/status"
    try:
        if status.phase != "Deleting":
            await ctx.api.patch(
                path,
                {
                    "status": ws_status(
                        status, "Deleting", False, Reason.DELETING, "deleting the files"
                    )
                },
            )
        why = await _act(ctx, namespace, spec)
        why += await _clear_store(ctx, namespace, name, raw)
    except Wait as w:
        ctx.metrics.reconciles.labels(KIND, "retry").inc()
        ctx.metrics.errors.labels(KIND, w.reason).inc()
        await _note(ctx, raw, path, status, w)
        raise kopf.TemporaryError(str(w), delay=w.delay or backoff(ctx, retry)) from w
    except KubeError as e:
        ctx.metrics.errors.labels(KIND, e.reason or str(e.status)).inc()
        raise kopf.TemporaryError(str(e), delay=backoff(ctx, retry)) from e
    _observe_latency(ctx, raw)
    ctx.metrics.reconciles.labels(KIND, "ok").inc()
    logger.info(f"releasing the finalizer: {why}")


async def _note(
    ctx: OperatorContext, body: dict, path: str, status: ConversationWorkspaceStatus, w: Wait
) -> None:
    """Say in the status why deletion waits, with an Event when the reason changes (best
    effort: the retry matters more)."""
    ready = next((c for c in status.conditions if c.type == ConditionType.READY), None)
    if ready is None or ready.reason != w.reason:
        kind = (
            "Warning" if w.reason in (Reason.VOLUME_RETAINED, Reason.RUNTIME_REFUSED) else "Normal"
        )
        kopf.event(body, type=kind, reason=w.reason, message=str(w))
    with contextlib.suppress(KubeError):
        deleting = status.model_copy(update={"phase": "Deleting"})
        await ctx.api.patch(
            path, {"status": ws_status(deleting, "Deleting", False, w.reason, str(w))}
        )


def _observe_latency(ctx: OperatorContext, body: dict) -> None:
    stamp = body["metadata"].get("deletionTimestamp")
    if stamp:
        started = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
        ctx.metrics.deletion_seconds.observe(max(0.0, (now() - started).total_seconds()))
