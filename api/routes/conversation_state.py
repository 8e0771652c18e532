"""GET /api/v1/sessions/{id}/conversations[/{cid}[/runs]] — what a frontend shows after a
reload: which conversations exist, one conversation's files (seed 003's workspace
information), and its runs to re-attach to.

Thin handlers over ``build_state`` (pure): uploads are ``user_upload``; files under
outputs/ are ``ai_created`` or ``ai_modified``, and ``is_presented``, from the marks runs
left with the files (the runtime keeps them on the conversation's volume, so every replica
and a restarted API answer alike). Reading state never creates a conversation.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from urllib.parse import quote

from fastapi import APIRouter

from sandbox_workspace.contract import ids
from sandbox_workspace.runtime.schemas import ConversationInfo, OutputList, UploadList

from ..backends.base import ConversationPhase
from ..chat.run import Run
from ..deps import CallerDep, ServicesDep
from ..file_models import workspace_output, workspace_upload
from ..names import ConversationIdPath, SessionIdPath
from ..openapi import SESSION_ERRORS, errors
from ..runtime_client import RuntimeClient
from ..schemas import (
    ConversationList,
    ConversationState,
    ConversationSummary,
    RunList,
    RunSummary,
)

router = APIRouter(prefix="/api/v1/sessions/{session_id}/conversations", tags=["conversations"])


def build_state(
    session_id: str,
    phase: ConversationPhase,
    info: ConversationInfo,
    uploads: UploadList | None,
    outputs: OutputList | None,
) -> ConversationState:
    cid = info.conversation_id
    return ConversationState(
        session_id=session_id,
        conversation_id=cid,
        status=phase.value,
        path=info.path,
        file_count=info.file_count,
        total_size=info.total_bytes,
        uploads=[workspace_upload(f) for f in (uploads.files if uploads else [])],
        outputs=[workspace_output(f) for f in (outputs.files if outputs else [])],
        outputs_truncated=bool(outputs and outputs.truncated),
    )


def run_summary(run: Run, last_event_id: int) -> RunSummary:
    state = (
        "finished" if run.finished else "awaiting_approval" if run.awaiting_approval else "running"
    )
    return RunSummary(
        run_id=run.id,
        conversation_id=run.conversation_id,
        state=state,
        started_at=datetime.fromtimestamp(run.started_at, UTC),
        finished=run.finished,
        awaiting_approval=run.awaiting_approval,
        last_event_id=last_event_id,
        events_url=f"/api/v1/runs/{quote(run.id, safe='')}/events",
    )


@router.get("", responses=errors(*SESSION_ERRORS))
async def list_conversations(
    session_id: SessionIdPath, caller: CallerDep, services: ServicesDep
) -> ConversationList:
    """The session's conversations that have files, with their status."""
    session = await services.sessions.ensure_running(caller, session_id)
    assert session.endpoint is not None
    ids = await RuntimeClient(services.http, session.endpoint).list_conversations()
    phases = await asyncio.gather(*(services.backend.conversation_phase(session, c) for c in ids))
    return ConversationList(
        session_id=session.session_id,
        conversations=[
            ConversationSummary(conversation_id=c, status=p.value)
            for c, p in zip(ids, phases, strict=True)
        ],
    )


@router.get("/{conversation_id}", responses=errors(*SESSION_ERRORS))
async def get_conversation(
    session_id: SessionIdPath,
    conversation_id: ConversationIdPath,
    caller: CallerDep,
    services: ServicesDep,
) -> ConversationState:
    """Status (`ready`/`deleting`/`absent`), path, file count and size, the uploads, and
    the agent's files under outputs/ with their source and whether they were presented."""
    cid = ids.conversation_id_or_400(conversation_id)
    session = await services.sessions.ensure_running(caller, session_id)
    assert session.endpoint is not None
    client = RuntimeClient(services.http, session.endpoint)
    phase = await services.backend.conversation_phase(session, cid)
    info = await client.conversation_info(cid)
    uploads = outputs = None
    if phase == ConversationPhase.READY and info.exists:
        uploads, outputs = await asyncio.gather(client.list_uploads(cid), client.list_outputs(cid))
    return build_state(session.session_id, phase, info, uploads, outputs)


@router.get("/{conversation_id}/runs", responses=errors(400, 401, 404))
async def list_runs(
    session_id: SessionIdPath,
    conversation_id: ConversationIdPath,
    caller: CallerDep,
    services: ServicesDep,
) -> RunList:
    """The conversation's runs this API still holds (open ones, and finished ones for the
    retention time), oldest first — re-attach with their `events_url`. Every replica lists
    the same runs (they are read through the run store)."""
    sid = services.sessions.own_session_id(caller, session_id)
    cid = ids.conversation_id_or_400(conversation_id)
    now, retention = time.monotonic(), services.runs.retention
    runs = [
        r
        for r in await services.runs.conversation_runs(sid, cid)
        if r.session_id == sid
        # A view from the store has no ``finished_at``: the store expires finished runs.
        and (getattr(r, "finished_at", None) is None or now - r.finished_at <= retention)
    ]
    runs.sort(key=lambda r: r.started_at)
    last = await services.runs.store.last_event_ids(runs)
    summaries = [run_summary(r, n) for r, n in zip(runs, last, strict=True)]
    return RunList(session_id=sid, conversation_id=cid, runs=summaries)
