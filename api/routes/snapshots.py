"""/api/v1/sessions/{id}/conversations/{cid}/snapshots… and …/fork — snapshots, restores
and forks of a conversation (issue 38).

Thin: the caller's own session only (``ensure_running`` answers 404 for any other, tenant
included, as every session route), then the file service (``files.copies``), which does
the work in either store mode. A fork is a new conversation of the same session: it
counts against the user's conversation cap (429 ``quota_exceeded``) and is deleted like
any conversation; snapshots count against the stored-bytes quota (413
``snapshot_quota_exceeded``) and are deleted with their conversation.
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Response

from sandbox_workspace.contract import ids

from ..backends.base import Session
from ..deps import CallerDep, Services, ServicesDep
from ..files.copies import KERNEL_NOTE
from ..names import ConversationIdPath, SessionIdPath
from ..openapi import SESSION_ERRORS, errors
from ..snapshot_schemas import (
    SNAPSHOT_ID_PATTERN,
    Forked,
    ForkRequest,
    Restored,
    SnapshotInfo,
    SnapshotList,
    SnapshotRequest,
)

router = APIRouter(
    prefix="/api/v1/sessions/{session_id}/conversations/{conversation_id}", tags=["snapshots"]
)
SnapshotIdPath = Annotated[
    str,
    Path(pattern=SNAPSHOT_ID_PATTERN, description="The `snapshot_id` its creation answered."),
]


async def _place(services, caller, session_id: str, conversation_id: str):
    cid = ids.conversation_id_or_400(conversation_id)
    return await services.sessions.ensure_running(caller, session_id), cid


@router.post(
    "/snapshots",
    status_code=201,
    response_model=SnapshotInfo,
    responses=errors(*SESSION_ERRORS, 409, 413),
)
async def take_snapshot(
    session_id: SessionIdPath,
    conversation_id: ConversationIdPath,
    caller: CallerDep,
    services: ServicesDep,
    body: SnapshotRequest | None = None,
) -> SnapshotInfo:
    """Take an immutable copy of the conversation's files (uploads and outputs with their
    records); `state` says which files it holds."""
    session, cid = await _place(services, caller, session_id, conversation_id)
    quota = services.settings.quotas.snapshot_bytes_per_user
    view = await services.files.snapshot(session, cid, (body or SnapshotRequest()).name, quota)
    return SnapshotInfo.model_validate(asdict(view))


@router.get("/snapshots", response_model=SnapshotList, responses=errors(*SESSION_ERRORS))
async def list_snapshots(
    session_id: SessionIdPath,
    conversation_id: ConversationIdPath,
    caller: CallerDep,
    services: ServicesDep,
) -> SnapshotList:
    """The conversation's snapshots, oldest first."""
    session, cid = await _place(services, caller, session_id, conversation_id)
    views = await services.files.snapshots(session, cid)
    return SnapshotList(snapshots=[SnapshotInfo.model_validate(asdict(v)) for v in views])


@dataclass(frozen=True)
class SnapshotPlace:
    """A snapshot of a conversation of the caller's own session (404 for any other)."""

    services: Services
    session: Session
    conversation_id: str
    snapshot_id: str


async def _snapshot_place(
    session_id: SessionIdPath,
    conversation_id: ConversationIdPath,
    snapshot_id: SnapshotIdPath,
    caller: CallerDep,
    services: ServicesDep,
) -> SnapshotPlace:
    session, cid = await _place(services, caller, session_id, conversation_id)
    return SnapshotPlace(services, session, cid, snapshot_id)


SnapshotDep = Annotated[SnapshotPlace, Depends(_snapshot_place)]


@router.get(
    "/snapshots/{snapshot_id}", response_model=SnapshotInfo, responses=errors(*SESSION_ERRORS)
)
async def get_snapshot(place: SnapshotDep) -> SnapshotInfo:
    files = place.services.files
    view = await files.snapshot_info(place.session, place.conversation_id, place.snapshot_id)
    return SnapshotInfo.model_validate(asdict(view))


@router.delete(
    "/snapshots/{snapshot_id}",
    status_code=204,
    response_class=Response,
    responses=errors(*SESSION_ERRORS, 409),
)
async def delete_snapshot(place: SnapshotDep) -> Response:
    files = place.services.files
    await files.delete_snapshot(place.session, place.conversation_id, place.snapshot_id)
    return Response(status_code=204)


@router.post(
    "/snapshots/{snapshot_id}/restore",
    response_model=Restored,
    responses=errors(*SESSION_ERRORS, 409),
)
async def restore_snapshot(place: SnapshotDep) -> Restored:
    """The conversation's files become exactly the snapshot's (what was written after it
    is gone); the kernel restarts — the Python state is not in a snapshot."""
    files = place.services.files
    view = await files.restore(place.session, place.conversation_id, place.snapshot_id)
    return Restored.model_validate({**asdict(view), "kernel_restarted": True,
                                    "note": KERNEL_NOTE})  # fmt: skip


@router.post(
    "/fork", status_code=201, response_model=Forked, responses=errors(*SESSION_ERRORS, 409)
)
async def fork_conversation(
    session_id: SessionIdPath,
    conversation_id: ConversationIdPath,
    caller: CallerDep,
    services: ServicesDep,
    body: ForkRequest | None = None,
) -> Forked:
    """A new conversation of the same session with copies of this one's files (or of one
    of its snapshots); later writes in one never show in the other."""
    session, cid = await _place(services, caller, session_id, conversation_id)
    body = body or ForkRequest()
    to = ids.conversation_id_or_400(body.conversation_id or f"fork-{uuid.uuid4().hex[:16]}")
    done = await services.files.fork(session, cid, to, body.snapshot_id)
    return Forked(conversation_id=done.conversation_id, forked_from=cid,
                  snapshot_id=body.snapshot_id, file_count=done.file_count,
                  bytes=done.bytes)  # fmt: skip
