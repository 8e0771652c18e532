"""Seed 003's workspace operations: information, upload, download and delete by file_id.

Served twice, on the same handlers: under the caller's session
(``/api/v1/sessions/{session_id}/workspace/{conversation_id}…``) and at seed 003's paths
(``/api/tenants/{tenant_id}/workspace/{conversation_id}…``), where the session is the
caller's own and ``tenant_id`` must be the caller's tenant (a JWT claim or
``X-Tenant-Id``) — any other answers 404, as a foreign session does.

They need the object store (``SANDBOX_WORKSPACE_STORE=s3``): without it they answer 503
``store_not_configured``. Files are those of the store's metadata (seed 003's records);
``workspace_enabled=false`` (``PATCH``) makes uploads, executions and chat tool calls in
the conversation answer 409 ``workspace_disabled``.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from sandbox_workspace.contract import ids
from sandbox_workspace.contract.errors import NotFoundError, TooLarge, Unavailable

from ..backends.base import Session
from ..backends.store_backend import StoreBackend
from ..deps import CallerDep, ServicesDep
from ..identity import Caller
from ..names import ConversationIdPath, SessionIdPath, name_schema
from ..openapi import SESSION_ERRORS, errors
from ..runtime_client import RuntimeClient
from ..schemas import StoredFile, WorkspaceInfo, WorkspaceSettings

router = APIRouter(tags=["workspace"])

V1 = "/api/v1/sessions/{session_id}/workspace/{conversation_id}"
SEED = "/api/tenants/{tenant_id}/workspace/{conversation_id}"
_MULTIPART_OVERHEAD = 64 * 1024
_MAX_DESCRIPTION = 4096

TenantPath = Annotated[str, Path(description="The caller's tenant (JWT claim or X-Tenant-Id).")]
FileIdPath = Annotated[str, Path(description="The file's `file_id` (a UUID).")]


_UPLOAD_BODY = {
    "required": True,
    "content": {
        "multipart/form-data": {
            "schema": {
                "type": "object",
                "required": ["file"],
                "properties": {
                    "file": {"type": "string", "format": "binary"},
                    # No "type": a form field is text whatever it looks like ("5").
                    "path": name_schema(
                        "Where to keep the file inside the conversation's uploads (they "
                        "are flat in v1: one file name; without it, the file's filename)"
                    ),
                    "description": {
                        "description": "Free text kept with the file.",
                        "maxLength": _MAX_DESCRIPTION,
                    },
                },
            }
        }
    },
}


def _backend(services) -> StoreBackend:
    backend = services.backend
    if not isinstance(backend, StoreBackend):
        raise Unavailable(
            "the workspace API needs the object store: set SANDBOX_WORKSPACE_STORE=s3 "
            "and SANDBOX_WORKSPACE_S3__BUCKET",
            code="store_not_configured",
        )
    return backend


def _own_tenant(caller: Caller, tenant_id: str) -> None:
    if tenant_id != caller.tenant:
        raise NotFoundError(f"tenant '{tenant_id}' not found")


async def _session(services, caller: Caller, session_id: str | None) -> Session:
    sid = session_id or caller.session_id
    return await services.sessions.ensure_running(caller, sid)


async def _info(services, caller, session_id: str | None, cid: str) -> WorkspaceInfo:
    backend = _backend(services)
    cid = ids.conversation_id_or_400(cid)
    session = await _session(services, caller, session_id)
    await backend.ensure_filled(session, cid)
    manifest = await backend.meta.get(backend.scope(session), cid)
    active = [f for f in (manifest.files if manifest else []) if f.active]
    info = await RuntimeClient(services.http, session.endpoint).conversation_info(cid)
    return WorkspaceInfo(
        conversation_id=cid,
        session_id=session.session_id,
        workspace_enabled=manifest.workspace_enabled if manifest else True,
        workspace_path=info.path,
        store_prefix=backend.layout.conversation(backend.scope(session), cid),
        workspace_created_at=manifest.workspace_created_at if manifest else None,
        file_count=len(active),
        total_size=sum(f.file_size for f in active),
        files=[StoredFile.of(f) for f in active],
    )


async def _upload(services, caller, session_id, cid, request: Request) -> StoredFile:
    backend = _backend(services)
    cid = ids.conversation_id_or_400(cid)
    session = await _session(services, caller, session_id)
    limit = session.spec.file_upload.max_file_size_bytes
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit + _MULTIPART_OVERHEAD:
        raise TooLarge(f"file is larger than the limit of {limit} bytes")
    await backend.conversation_opened(session, cid)  # refuses a disabled workspace
    content_type = request.headers.get("content-type", "")
    params = {"conversation_id": cid}
    _, record = await backend.upload(session, request.stream(), content_type, params, cid)
    return StoredFile.of(record)


async def _download(services, caller, session_id, cid, file_id) -> StreamingResponse:
    backend = _backend(services)
    cid = ids.conversation_id_or_400(cid)
    session = await _session(services, caller, session_id)
    record, download = await backend.open_file(session, cid, file_id)
    return StreamingResponse(
        aiter(download),
        media_type=record.mime_type,
        headers={
            "content-length": str(record.file_size),
            "x-content-sha256": record.checksum,
            "x-file-version": str(record.version),
        },
        background=BackgroundTask(download.aclose),
    )


async def _delete(services, caller, session_id, cid, file_id) -> StoredFile:
    backend = _backend(services)
    cid = ids.conversation_id_or_400(cid)
    session = await _session(services, caller, session_id)
    return StoredFile.of(await backend.delete_file(session, cid, file_id))


async def _patch(services, caller, session_id, cid, body: WorkspaceSettings) -> WorkspaceInfo:
    backend = _backend(services)
    session = await _session(services, caller, session_id)
    cid = ids.conversation_id_or_400(cid)
    await backend.set_enabled(session, cid, body.workspace_enabled)
    return await _info(services, caller, session_id, cid)


_DOWNLOAD = {
    200: {
        # Any type: a file is answered with its own mime_type.
        "content": {"*/*": {"schema": {"type": "string", "format": "binary"}}},
        "description": "The file's bytes, with its own Content-Type.",
    },
    **errors(*SESSION_ERRORS),
}

# -- under the caller's session -------------------------------------------------------


@router.get(V1, responses=errors(*SESSION_ERRORS))
async def get_workspace(
    session_id: SessionIdPath, conversation_id: ConversationIdPath, caller: CallerDep,
    services: ServicesDep,
) -> WorkspaceInfo:  # fmt: skip
    """Seed 003's workspace information: enabled, path, created, file count, size, files."""
    return await _info(services, caller, session_id, conversation_id)


@router.patch(V1, responses=errors(*SESSION_ERRORS))
async def update_workspace(
    session_id: SessionIdPath, conversation_id: ConversationIdPath, body: WorkspaceSettings,
    caller: CallerDep, services: ServicesDep,
) -> WorkspaceInfo:  # fmt: skip
    """Turn the conversation's workspace on or off (`workspace_enabled`)."""
    return await _patch(services, caller, session_id, conversation_id, body)


@router.post(
    V1 + "/files",
    status_code=201,
    responses=errors(*SESSION_ERRORS, 409, 413, 415),
    openapi_extra={"requestBody": _UPLOAD_BODY},
)
async def upload_workspace_file(
    session_id: SessionIdPath, conversation_id: ConversationIdPath, request: Request,
    caller: CallerDep, services: ServicesDep,
) -> StoredFile:  # fmt: skip
    """Upload a file (multipart `file`, `path`, `description`) to the store and the sandbox."""
    return await _upload(services, caller, session_id, conversation_id, request)


@router.get(V1 + "/files/{file_id}", responses=_DOWNLOAD, response_class=StreamingResponse)
async def download_workspace_file(
    session_id: SessionIdPath, conversation_id: ConversationIdPath, file_id: FileIdPath,
    caller: CallerDep, services: ServicesDep,
) -> StreamingResponse:  # fmt: skip
    """Stream a file by its file_id, from the store."""
    return await _download(services, caller, session_id, conversation_id, file_id)


@router.delete(V1 + "/files/{file_id}", responses=errors(*SESSION_ERRORS, 409))
async def delete_workspace_file(
    session_id: SessionIdPath, conversation_id: ConversationIdPath, file_id: FileIdPath,
    caller: CallerDep, services: ServicesDep,
) -> StoredFile:  # fmt: skip
    """Delete a file by its file_id: its objects and cache copy go, its record says deleted."""
    return await _delete(services, caller, session_id, conversation_id, file_id)


# -- seed 003's paths -------------------------------------------------------------------


@router.get(SEED, responses=errors(*SESSION_ERRORS))
async def get_tenant_workspace(
    tenant_id: TenantPath, conversation_id: ConversationIdPath, caller: CallerDep,
    services: ServicesDep,
) -> WorkspaceInfo:  # fmt: skip
    """Seed 003's workspace information, in the caller's tenant and session."""
    _own_tenant(caller, tenant_id)
    return await _info(services, caller, None, conversation_id)


@router.post(
    SEED + "/files",
    status_code=201,
    responses=errors(*SESSION_ERRORS, 409, 413, 415),
    openapi_extra={"requestBody": _UPLOAD_BODY},
)
async def upload_tenant_workspace_file(
    tenant_id: TenantPath, conversation_id: ConversationIdPath, request: Request,
    caller: CallerDep, services: ServicesDep,
) -> StoredFile:  # fmt: skip
    """Seed 003's upload (multipart `file`, `path`, `description`)."""
    _own_tenant(caller, tenant_id)
    return await _upload(services, caller, None, conversation_id, request)


@router.get(SEED + "/files/{file_id}", responses=_DOWNLOAD, response_class=StreamingResponse)
async def download_tenant_workspace_file(
    tenant_id: TenantPath, conversation_id: ConversationIdPath, file_id: FileIdPath,
    caller: CallerDep, services: ServicesDep,
) -> StreamingResponse:  # fmt: skip
    """Seed 003's download by file_id."""
    _own_tenant(caller, tenant_id)
    return await _download(services, caller, None, conversation_id, file_id)


@router.delete(SEED + "/files/{file_id}", responses=errors(*SESSION_ERRORS, 409))
async def delete_tenant_workspace_file(
    tenant_id: TenantPath, conversation_id: ConversationIdPath, file_id: FileIdPath,
    caller: CallerDep, services: ServicesDep,
) -> StoredFile:  # fmt: skip
    """Seed 003's delete by file_id."""
    _own_tenant(caller, tenant_id)
    return await _delete(services, caller, None, conversation_id, file_id)
