"""/api/v1/sessions/{id}/files — upload, list, download and delete user uploads.

Bodies are streamed through to the runtime in both directions. The conversation comes
from a ``conversation_id`` header (as the seed's frontend sends it), an
``X-Conversation-Id`` header, a query parameter, or — for downloads and deletes — a full
sandbox path ``{workspace}/{conversation_id}/uploads/temparea/{name}``. A bare name with no
conversation (seed 000 §6.4's ``downloadFile``) resolves within the caller's session:
exactly one conversation holds it → that file; several → 409 naming them; none → 404.
Without a conversation, the listing covers every conversation of the session. A
listing's ``files`` are the names (seed 000 §6.3's frontend reads ``data.files`` as
``["data.csv", …]``), its ``items`` the files themselves.

Every handler is a translation: the files are the file service's (``api/files``), the
same in both store modes — with the object store, a deletion here removes the file from
the store too, so no refill brings it back.

An upload never lands in a conversation that is not tracked: the conversation is
opened (kubernetes: its ConversationWorkspace, finalizer included, is created) before
the body's last chunk reaches the runtime (``upload_guard``), a conversation being
deleted answers 409 ``conversation_deleting``, and after the commit the backend checks
that no deletion slipped in between (``conversation_written``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Header, Path, Query, Request
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from sandbox_workspace.contract import ids
from sandbox_workspace.runtime.download_headers import SAFE
from sandbox_workspace.runtime.schemas import UPLOAD_SUBDIR

from ..backends.base import Session
from ..deps import CallerDep, ServicesDep
from ..file_models import (
    FileDeleted,
    FileList,
    FileUploaded,
    SessionFileList,
    file_list,
    file_uploaded,
    session_file_list,
)
from ..files import Upload
from ..names import NAME_RULES, SessionIdPath, conversation_id_schema, name_schema
from ..openapi import SESSION_ERRORS, errors
from ..request_bounds import streams_body

router = APIRouter(prefix="/api/v1/sessions/{session_id}/files", tags=["files"])

_RELAYED_HEADERS = ("content-length", "content-disposition", "x-content-sha256", "x-sandbox-path")
_HEADER_NOTE = "Header form of `conversation_id` (needs `underscores_in_headers on` in nginx)."


async def conversation_param(
    conversation_id: Annotated[
        str | None,
        Query(
            description="The conversation (portable form).",
            json_schema_extra=conversation_id_schema(),
        ),
    ] = None,
    conversation_id_header: Annotated[
        str | None,
        Header(
            alias="conversation_id",
            convert_underscores=False,
            description=_HEADER_NOTE + " The query parameter wins over it.",
            json_schema_extra=conversation_id_schema(),
        ),
    ] = None,
    x_conversation_id: Annotated[
        str | None,
        Header(
            description="Same as `conversation_id`.", json_schema_extra=conversation_id_schema()
        ),
    ] = None,
    subdir: Annotated[
        Literal["temparea"] | None, Query(description="Always `temparea` in v1.")
    ] = None,
    subdir_header: Annotated[
        Literal["temparea"] | None,
        Header(alias="subdir", convert_underscores=False, description="Header form of `subdir`."),
    ] = None,
) -> str | None:
    """The conversation named by query or header, checked; None when none is named.
    Each given value must be valid; the query wins over the headers, as documented."""
    given = [
        ids.conversation_id_or_400(v)
        for v in (conversation_id, conversation_id_header, x_conversation_id)
        if v is not None
    ]
    return given[0] if given else None


ConversationParam = Annotated[str | None, Depends(conversation_param)]
FileRefPath = Annotated[
    str,
    Path(
        description=f"A file name ({NAME_RULES}), or — not covered by the pattern — its full "
        "sandbox path `{workspace}/{conversation_id}/uploads/temparea/{name}`.",
        json_schema_extra={k: v for k, v in name_schema("File name").items() if k != "description"},
    ),
]


async def _running(services, caller, session_id: str) -> Session:
    return await services.sessions.ensure_running(caller, session_id)


_UPLOAD_BODY = {
    "required": True,
    "content": {
        "multipart/form-data": {
            "schema": {
                "type": "object",
                "required": ["file", "conversation_id"],
                "properties": {
                    "file": {"type": "string", "format": "binary"},
                    "conversation_id": conversation_id_schema(),
                    "subdir": {
                        "type": "string",
                        "enum": [UPLOAD_SUBDIR, ""],
                        "default": UPLOAD_SUBDIR,
                        "description": "Always `temparea` in v1 (empty means the same).",
                    },
                },
            }
        }
    },
}


@router.post(
    "/upload",
    status_code=201,
    responses=errors(*SESSION_ERRORS, 409, 413, 415),
    openapi_extra={"requestBody": _UPLOAD_BODY},
)
@streams_body  # the upload streams under its own per-session limit
async def upload_file(
    session_id: SessionIdPath, request: Request, caller: CallerDep, services: ServicesDep
) -> FileUploaded:
    """Stream a multipart upload (`file`, `conversation_id`, `subdir`) into temparea.

    A file of the same name is replaced (`replaced: true`).
    """
    session = await _running(services, caller, session_id)
    params = {}
    for key in ("conversation_id", "subdir"):  # header/query forms, as for the listing
        header = request.headers.get(key) or request.headers.get("x-" + key.replace("_", "-"))
        if value := request.query_params.get(key) or header:
            params[key] = value
    upload = Upload(
        request.stream(),
        request.headers.get("content-type", ""),
        request.headers.get("content-length"),
        params,
    )
    with services.user_limits.uploads.hold(caller):  # 429 at a cap (quotas.UserLimits)
        result = await services.files.upload(session, upload)
    return file_uploaded(result, session.session_id)


@router.get("", responses=errors(*SESSION_ERRORS))
async def list_files(
    session_id: SessionIdPath, cid: ConversationParam, caller: CallerDep, services: ServicesDep
) -> FileList | SessionFileList:
    """The user's uploads in one conversation: `files` their names (seed 000 §6.3),
    `items` the files (name, size, time, sha256, type); without a conversation, the
    uploads of every conversation of the session (each item names its conversation)."""
    session = await _running(services, caller, session_id)
    if cid is not None:
        return file_list(session.session_id, await services.files.listing(session, cid))
    uploads = await services.files.session_listing(session)
    return session_file_list(session.session_id, uploads)


@router.get(
    "/{name:path}",
    responses={
        200: {
            "content": {"*/*": {"schema": {"type": "string", "format": "binary"}}},
            "description": "The file's bytes, with its own Content-Type.",
        },
        **errors(*SESSION_ERRORS, 409),
    },
    response_class=StreamingResponse,
)
async def download_file(
    session_id: SessionIdPath,
    name: FileRefPath,
    cid: ConversationParam,
    caller: CallerDep,
    services: ServicesDep,
) -> StreamingResponse:
    """Stream one uploaded file, by name (+ conversation) or by its full sandbox path."""
    session = await _running(services, caller, session_id)
    ref = await services.files.resolve(session, name, cid, outputs=True)
    response = await services.files.open(session, ref)
    headers = {k: response.headers[k] for k in _RELAYED_HEADERS if k in response.headers}
    headers.update(SAFE)  # also from a runtime of an older release that sent neither
    return StreamingResponse(
        response.aiter_raw(),
        media_type=response.headers.get("content-type"),
        headers=headers,
        background=BackgroundTask(response.aclose),
    )


@router.delete("/{name:path}", responses=errors(*SESSION_ERRORS, 409))
async def delete_file(
    session_id: SessionIdPath,
    name: FileRefPath,
    cid: ConversationParam,
    caller: CallerDep,
    services: ServicesDep,
) -> FileDeleted:
    """Delete one uploaded file (a bare name resolves as for downloads); with the object
    store, its object and record too, so no refill brings it back."""
    session = await _running(services, caller, session_id)
    ref = await services.files.resolve(session, name, cid, outputs=False)
    await services.files.delete(session, ref)
    return FileDeleted(
        session_id=session.session_id, conversation_id=ref.conversation_id, name=ref.name
    )
