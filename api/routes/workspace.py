"""Seed 003's workspace operations: information, upload, download and delete by file_id.

One definition (``_serve``) served twice: under the caller's session
(``/api/v1/sessions/{session_id}/workspace/{conversation_id}…``) and at seed 003's paths
(``/api/tenants/{tenant_id}/workspace/{conversation_id}…``), where the session is the
caller's own and ``tenant_id`` must be the caller's tenant (a JWT claim or
``X-Tenant-Id``) — any other answers 404, as a foreign session does. The two differ only
in how the place is named (``v1_place``, ``seed_place``) and in the operations' names.

The files and their records are the file service's (``api/files``), with one contract in
both store modes: the object store's metadata in ``s3`` mode; on the embedded default (the
local backend) the same records kept beside the sessions (``cache_records``). Only the
kubernetes backend without a store has nowhere to keep them: 503 ``store_not_configured``.
``workspace_enabled=false`` (``PATCH``) makes uploads, executions and chat tool calls in
the conversation answer 409 ``workspace_disabled``.
"""

from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from sandbox_workspace.contract import ids
from sandbox_workspace.contract.errors import NotFoundError
from sandbox_workspace.runtime.download_headers import download_headers

from ..backends.base import Session
from ..deps import CallerDep, ServicesDep
from ..file_models import StoredFile, stored_file
from ..files import Upload
from ..identity import Caller
from ..names import ConversationIdPath, SessionIdPath, name_schema
from ..openapi import SESSION_ERRORS, errors
from ..request_bounds import streams_body
from ..schemas import WorkspaceInfo, WorkspaceSettings

router = APIRouter(tags=["workspace"])

V1 = "/api/v1/sessions/{session_id}/workspace/{conversation_id}"
SEED = "/api/tenants/{tenant_id}/workspace/{conversation_id}"
_MAX_DESCRIPTION = 4096

TenantPath = Annotated[str, Path(description="The caller's tenant (JWT claim or X-Tenant-Id).")]


async def _file_id(file_id: Annotated[str, Path(description="The file's `file_id` (a UUID).")]):
    return file_id


# A dependency, so that it follows the place's parameters in the document, as in the path.
FileIdPath = Annotated[str, Depends(_file_id)]


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
                        "description": "Free text kept with the file: one field, sent once "
                        "(a field sent more than once is a 400).",
                        "maxLength": _MAX_DESCRIPTION,
                    },
                },
            }
        }
    },
}
_DOWNLOAD = {
    200: {
        # Any type: a file is answered with its own mime_type.
        "content": {"*/*": {"schema": {"type": "string", "format": "binary"}}},
        "description": "The file's bytes, with its own Content-Type.",
    },
    **errors(*SESSION_ERRORS),
}


@dataclass(frozen=True)
class Place:
    """A conversation of the caller's session: the session named (v1), or the caller's
    own (None: seed 003's paths)."""

    session_id: str | None
    conversation_id: str

    async def session(self, services, caller: Caller) -> Session:
        sid = self.session_id or caller.session_id
        return await services.sessions.ensure_running(caller, sid)


async def v1_place(session_id: SessionIdPath, conversation_id: ConversationIdPath) -> Place:
    return Place(session_id, ids.conversation_id_or_400(conversation_id))


async def seed_place(
    tenant_id: TenantPath, conversation_id: ConversationIdPath, caller: CallerDep
) -> Place:
    if tenant_id != caller.tenant:
        raise NotFoundError(f"tenant '{tenant_id}' not found")
    return Place(None, ids.conversation_id_or_400(conversation_id))


async def _info(services, caller: Caller, place: Place) -> WorkspaceInfo:
    session = await place.session(services, caller)
    records = await services.files.records(session, place.conversation_id)
    return WorkspaceInfo(
        conversation_id=place.conversation_id,
        session_id=session.session_id,
        workspace_enabled=records.enabled,
        workspace_path=records.path,
        store_prefix=records.store_prefix,
        workspace_created_at=records.created_at,
        file_count=len(records.files),
        total_size=sum(f.file_size for f in records.files),
        files=[stored_file(f) for f in records.files],
    )


def _serve(prefix: str, locate, names: dict[str, str], docs: dict[str, str]) -> None:
    """Seed 003's operations at ``prefix``, the place named by the ``locate`` dependency;
    ``names`` and ``docs`` by operation (``info``, ``patch`` when served, ``upload``,
    ``download``, ``delete``)."""
    # Evaluated here (this module does not postpone annotations): one alias per family.
    PlaceDep = Annotated[Place, Depends(locate)]

    async def info(place: PlaceDep, caller: CallerDep, services: ServicesDep) -> WorkspaceInfo:
        return await _info(services, caller, place)

    async def patch(
        place: PlaceDep, body: WorkspaceSettings, caller: CallerDep, services: ServicesDep
    ) -> WorkspaceInfo:
        session = await place.session(services, caller)
        await services.files.set_enabled(session, place.conversation_id, body.workspace_enabled)
        return await _info(services, caller, place)

    async def upload(
        place: PlaceDep, request: Request, caller: CallerDep, services: ServicesDep
    ) -> StoredFile:
        session = await place.session(services, caller)
        given = Upload(
            request.stream(),
            request.headers.get("content-type", ""),
            request.headers.get("content-length"),
        )
        with services.user_limits.uploads.hold(caller):  # 429 at a cap (quotas.UserLimits)
            record = await services.files.upload_record(session, place.conversation_id, given)
        return stored_file(record)

    async def download(
        place: PlaceDep, file_id: FileIdPath, caller: CallerDep, services: ServicesDep
    ) -> StreamingResponse:
        session = await place.session(services, caller)
        record, body = await services.files.open_record(session, place.conversation_id, file_id)
        return StreamingResponse(
            aiter(body),
            media_type=record.mime_type,
            headers={
                **download_headers(record.file_path.rsplit("/", 1)[-1]),
                "content-length": str(record.file_size),
                "x-content-sha256": record.checksum,
                "x-file-version": str(record.version),
            },
            background=BackgroundTask(body.aclose),
        )

    async def delete(
        place: PlaceDep, file_id: FileIdPath, caller: CallerDep, services: ServicesDep
    ) -> StoredFile:
        session = await place.session(services, caller)
        return stored_file(
            await services.files.delete_record(session, place.conversation_id, file_id)
        )

    def add(op: str, path: str, endpoint, method: str, **more) -> None:
        router.add_api_route(
            path, endpoint, methods=[method], name=names[op], description=docs[op], **more
        )

    add("info", prefix, info, "GET", responses=errors(*SESSION_ERRORS))
    if "patch" in names:
        add("patch", prefix, patch, "PATCH", responses=errors(*SESSION_ERRORS))
    add(
        "upload",
        prefix + "/files",
        streams_body(upload),  # streams under its own per-session limit
        "POST",
        status_code=201,
        responses=errors(*SESSION_ERRORS, 409, 413, 415),
        openapi_extra={"requestBody": _UPLOAD_BODY},
    )
    files = prefix + "/files/{file_id}"
    add("download", files, download, "GET", responses=_DOWNLOAD, response_class=StreamingResponse)
    add("delete", files, delete, "DELETE", responses=errors(*SESSION_ERRORS, 409))


_serve(
    V1,
    v1_place,
    {
        "info": "get_workspace",
        "patch": "update_workspace",
        "upload": "upload_workspace_file",
        "download": "download_workspace_file",
        "delete": "delete_workspace_file",
    },
    {
        "info": "Seed 003's workspace information: enabled, path, created, file count, size, "
        "files.",
        "patch": "Turn the conversation's workspace on or off (`workspace_enabled`).",
        "upload": "Upload a file (multipart `file`, `path`, `description`) to the store and "
        "the sandbox.",
        "download": "Stream a file by its file_id, from the store.",
        "delete": "Delete a file by its file_id: its objects and cache copy go, its record "
        "says deleted.",
    },
)
_serve(
    SEED,
    seed_place,
    {
        "info": "get_tenant_workspace",
        "upload": "upload_tenant_workspace_file",
        "download": "download_tenant_workspace_file",
        "delete": "delete_tenant_workspace_file",
    },
    {
        "info": "Seed 003's workspace information, in the caller's tenant and session.",
        "upload": "Seed 003's upload (multipart `file`, `path`, `description`).",
        "download": "Seed 003's download by file_id.",
        "delete": "Seed 003's delete by file_id.",
    },
)
