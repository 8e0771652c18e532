"""/api/v1/sessions — create, read and delete the caller's sandbox session."""

from __future__ import annotations

from fastapi import APIRouter

from sandbox_workspace.operator.naming import session_id_for
from sandbox_workspace.runtime.errors import BadRequest, NotFoundError

from ..backends.base import SessionSpec
from ..deps import CallerDep, ServicesDep
from ..schemas import CreateSessionRequest, SessionDeleted, SessionResponse

router = APIRouter(prefix="/api/v1/sessions", tags=["sessions"])


@router.post("", status_code=201, response_model_by_alias=False)
async def create_session(
    body: CreateSessionRequest, caller: CallerDep, services: ServicesDep
) -> SessionResponse:
    """Create the caller's session (409 when it exists); answers while it starts."""
    own = session_id_for(caller.user_id)
    if body.user_id is not None and body.user_id != caller.user_id:
        raise BadRequest(
            "user_id must be the authenticated user's id (or be left out)", code="user_mismatch"
        )
    if body.config.session_id is not None and body.config.session_id != own:
        raise BadRequest(f"each user has one session; yours is '{own}'", code="invalid_session_id")
    upload = body.config.file_upload_config or services.settings.file_upload
    if upload.max_file_size_bytes > services.settings.max_upload_bytes:
        raise BadRequest(
            f"file_upload_config.max_file_size exceeds this platform's ceiling of "
            f"{services.settings.max_upload_bytes} bytes",
            code="upload_limit_too_high",
        )
    spec = SessionSpec(
        session_id=own,
        user_id=caller.user_id,
        agent_id=body.agent_id,
        business_domain_id=body.business_domain_id,
        file_upload=upload,
        ttl_seconds=body.config.ttl or services.settings.session_ttl_seconds,
    )
    return SessionResponse.of(await services.backend.create_session(spec))


@router.get("/{session_id}", response_model_by_alias=False)
async def get_session(session_id: str, caller: CallerDep, services: ServicesDep) -> SessionResponse:
    """The session's status: pending, running, stopped or error."""
    return SessionResponse.of(await services.sessions.get(caller, session_id))


@router.delete("/{session_id}")
async def delete_session(
    session_id: str, caller: CallerDep, services: ServicesDep
) -> SessionDeleted:
    """Delete the session, its runtime and every conversation's files."""
    sid = services.sessions.own_session_id(caller, session_id)
    if not await services.backend.delete_session(sid):
        raise NotFoundError(f"session '{session_id}' not found")
    return SessionDeleted(session_id=sid)
