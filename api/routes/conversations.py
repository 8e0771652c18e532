"""/api/v1/sessions/{id}/conversations/{cid} — delete a conversation and its files.

Once a deletion is accepted the conversation refuses writes (409
``conversation_deleting``) until its files are verified gone, and its open chat runs
are cancelled (their streams end with ``error`` ``conversation_deleted``, then ``done``).
The session is never started for it: a stopped one stays stopped (seed 000 §4.3), and
deleting in a session that does not exist is a success (nothing is there).
"""

from __future__ import annotations

from fastapi import APIRouter

from sandbox_workspace.contract import ids
from sandbox_workspace.contract.errors import JSONLineResponse

from ..deps import CallerDep, ServicesDep
from ..names import ConversationIdPath, SessionIdPath
from ..openapi import SESSION_ERRORS, errors
from ..schemas import ConversationDeletion

router = APIRouter(prefix="/api/v1/sessions/{session_id}/conversations", tags=["conversations"])


@router.delete(
    "/{conversation_id}",
    response_model=ConversationDeletion,
    responses={202: {"model": ConversationDeletion}, **errors(*SESSION_ERRORS, 409)},
)
async def delete_conversation(
    session_id: SessionIdPath,
    conversation_id: ConversationIdPath,
    caller: CallerDep,
    services: ServicesDep,
) -> JSONLineResponse:
    """Delete every file of the conversation: 200 when verified gone, 202 while deleting."""
    cid = ids.conversation_id_or_400(conversation_id)
    sid = services.sessions.own_session_id(caller, session_id)
    # Never started for this (seed 000 §4.3: no side effects): a stopped session stays
    # stopped; a missing one has no files, so a repeat after it went is a success too.
    session = await services.sessions.find(caller, session_id)
    done = session is None or await services.backend.delete_conversation(session, cid)
    services.runs.cancel_conversation(sid, cid)
    body = ConversationDeletion(
        session_id=sid, conversation_id=cid, status="deleted" if done else "deleting"
    )
    return JSONLineResponse(body.model_dump(), status_code=200 if done else 202)
