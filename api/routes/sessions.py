"""/api/v1/sessions — create, read and delete the caller's sandbox session."""

from __future__ import annotations

from fastapi import APIRouter

from sandbox_workspace.contract.errors import BadRequest, NotFoundError

from ..backends.base import SessionSpec
from ..deps import CallerDep, ServicesDep
from ..identity import Forbidden
from ..names import SessionIdPath
from ..openapi import errors
from ..schemas import CreateSessionRequest, SessionDeleted, SessionResponse

router = APIRouter(prefix="/api/v1/sessions", tags=["sessions"])


@router.post("", status_code=201, responses=errors(400, 403, 409))
async def create_session(
    body: CreateSessionRequest, caller: CallerDep, services: ServicesDep
) -> SessionResponse:
    """Create the caller's session; answers while it starts. 409 when it exists — a
    stopped or failed one is resumed first, so its next GET says ``pending``."""
    own = caller.session_id
    if body.user_id is not None and body.user_id != caller.user_id:
        raise Forbidden(
            "user_id must be the authenticated user's id (or be left out)", code="user_mismatch"
        )
    if body.config.session_id is not None and body.config.session_id not in (
        own,
        f"sb-session-{caller.user_id}",
    ):
        raise Forbidden(f"each user has one session; yours is '{own}'", code="invalid_session_id")
    requested = body.config.file_upload_config
    upload = requested.to_spec() if requested else services.settings.file_upload
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
    return SessionResponse.of(await services.sessions.create(spec))


@router.get("/{session_id}", responses=errors(404))
async def get_session(
    session_id: SessionIdPath, caller: CallerDep, services: ServicesDep
) -> SessionResponse:
    """The session's status: pending, running, stopped or error."""
    return SessionResponse.of(await services.sessions.get(caller, session_id))


@router.delete("/{session_id}", responses=errors(404, 409))
async def delete_session(
    session_id: SessionIdPath, caller: CallerDep, services: ServicesDep
) -> SessionDeleted:
    """Delete the session, its runtime and every conversation's files."""
    sid = services.sessions.own_session_id(caller, session_id)
    services.sessions.forget(caller)  # the E2B data plane reuses no answer about it
    if not await services.backend.delete_session(sid):
        raise NotFoundError(f"session '{session_id}' not found")
    return SessionDeleted(session_id=sid)
