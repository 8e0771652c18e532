"""/api/v1/sessions/{id}/files — upload, list, download and delete user uploads.

Bodies are streamed through to the runtime in both directions. The conversation comes
from a ``conversation_id`` header (as the seed's frontend sends it), an
``X-Conversation-Id`` header, a query parameter, or — for downloads and deletes — a full
sandbox path ``{workspace}/{conversation_id}/uploads/temparea/{name}``. A bare name with no
conversation (seed 000 §6.4's ``downloadFile``) resolves within the caller's session:
exactly one conversation holds it → that file; several → 409 naming them; none → 404.
Without a conversation, the listing covers every conversation of the session.
sandbox path ``{workspace}/{conversation_id}/uploads/temparea/{name}``.

An upload never lands in a conversation that is not tracked: the conversation is
opened (kubernetes: its ConversationWorkspace, finalizer included, is created) before
the body's last chunk reaches the runtime (``upload_guard``), a conversation being
deleted answers 409 ``conversation_deleting``, and after the commit the backend checks
that no deletion slipped in between (``conversation_written``).
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Header, Path, Query, Request
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from sandbox_workspace.contract import ids
from sandbox_workspace.contract.errors import Conflict, NotFoundError, TooLarge
from sandbox_workspace.runtime.schemas import UPLOAD_SUBDIR

from ..backends.base import Session
from ..backends.store_backend import StoreBackend
from ..deps import CallerDep, ServicesDep
from ..file_refs import FileRef, parse_file_ref
from ..names import NAME_RULES, SessionIdPath, conversation_id_schema, name_schema
from ..openapi import SESSION_ERRORS, errors
from ..runtime_client import RuntimeClient
from ..schemas import FileDeleted, FileList, FileUploaded, SessionFileList
from ..upload_guard import GuardedBody

router = APIRouter(prefix="/api/v1/sessions/{session_id}/files", tags=["files"])

# Multipart framing around the file: boundaries, part headers, small form fields.
_MULTIPART_OVERHEAD = 64 * 1024
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


async def _running(services, caller, session_id: str) -> tuple[Session, RuntimeClient]:
    session = await services.sessions.ensure_running(caller, session_id)
    assert session.endpoint is not None
    return session, RuntimeClient(services.http, session.endpoint)


async def _resolve(
    client: RuntimeClient, session: Session, ref: str, cid: str | None, *, outputs: bool
) -> FileRef:
    """A file reference; a bare name without conversation is looked up in the session."""
    if cid is not None or "/" in ref:
        return parse_file_ref(ref, cid, session.workspace_path, allow_outputs=outputs)
    name = ids.file_name_or_400(ref)
    holders = await client.list_conversations(holding=name)
    if not holders:
        raise NotFoundError(f"no conversation of this session has an upload named '{name}'")
    if len(holders) > 1:
        raise Conflict(
            f"'{name}' exists in several conversations ({', '.join(holders)}); "
            "name one with conversation_id",
            code="ambiguous_file_name",
        )
    return FileRef(holders[0], "uploads", (name,))


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
async def upload_file(
    session_id: SessionIdPath, request: Request, caller: CallerDep, services: ServicesDep
) -> FileUploaded:
    """Stream a multipart upload (`file`, `conversation_id`, `subdir`) into temparea.

    A file of the same name is replaced (`replaced: true`).
    """
    session, client = await _running(services, caller, session_id)
    limit = session.spec.file_upload.max_file_size_bytes
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit + _MULTIPART_OVERHEAD:
        raise TooLarge(f"file is larger than the limit of {limit} bytes")
    params = {}
    for key in ("conversation_id", "subdir"):  # header/query forms, as for the listing
        header = request.headers.get(key) or request.headers.get("x-" + key.replace("_", "-"))
        if value := request.query_params.get(key) or header:
            params[key] = value
    given = params.get("conversation_id")
    if given is not None:  # known up front: refuse before the body is sent
        given = ids.conversation_id_or_400(given)
        await services.backend.conversation_opened(session, given)
    content_type = request.headers.get("content-type", "")
    backend = services.backend
    if isinstance(backend, StoreBackend):  # one pass to the cache and the store
        result, _ = await backend.upload(session, request.stream(), content_type, params, given)
        return FileUploaded(**result.model_dump(), session_id=session.session_id)
    body = GuardedBody(
        request.stream(), content_type, given, lambda cid: backend.conversation_opened(session, cid)
    )
    try:
        result = await client.upload(aiter(body), content_type, params)
    except Exception:
        if body.error is not None:  # the guard cut the body short: say why
            raise body.error from None
        raise
    await backend.conversation_written(session, result.conversation_id)
    return FileUploaded(**result.model_dump(), session_id=session.session_id)


@router.get("", responses=errors(*SESSION_ERRORS))
async def list_files(
    session_id: SessionIdPath, cid: ConversationParam, caller: CallerDep, services: ServicesDep
) -> FileList | SessionFileList:
    """The user's uploads in one conversation (name, size, time, sha256, type); without a
    conversation, the uploads of every conversation of the session."""
    session, client = await _running(services, caller, session_id)
    if cid is not None:
        listing = await client.list_uploads(cid)
        return FileList(**listing.model_dump(), session_id=session.session_id)
    ids = await client.list_conversations()
    listings = await asyncio.gather(*(client.list_uploads(c) for c in ids))
    files = [f for listing in listings for f in listing.files]
    return SessionFileList(session_id=session.session_id, files=files)


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
    session, client = await _running(services, caller, session_id)
    ref = await _resolve(client, session, name, cid, outputs=True)
    if ref.area == "outputs":
        response = await client.open_output(ref.conversation_id, list(ref.parts))
    else:
        response = await client.open_download(ref.conversation_id, ref.name)
    if isinstance(services.backend, StoreBackend):  # store mode: only what the store holds
        path = f"{ref.area}/{'/'.join(ref.parts)}" if ref.area == "outputs" else None
        path = path or f"uploads/{UPLOAD_SUBDIR}/{ref.name}"
        response = await services.backend.verified(session, ref.conversation_id, path, response)
    headers = {k: response.headers[k] for k in _RELAYED_HEADERS if k in response.headers}
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
    """Delete one uploaded file (a bare name resolves as for downloads)."""
    session, client = await _running(services, caller, session_id)
    ref = await _resolve(client, session, name, cid, outputs=False)
    await client.delete_upload(ref.conversation_id, ref.name)
    return FileDeleted(
        session_id=session.session_id, conversation_id=ref.conversation_id, name=ref.name
    )
