"""/api/v1/sessions/{id}/files — upload, list, download and delete user uploads.

Bodies are streamed through to the runtime in both directions. The conversation comes
from a ``conversation_id`` header (as the seed's frontend sends it), an
``X-Conversation-Id`` header, a query parameter, or — for downloads and deletes — a full
sandbox path ``{workspace}/{conversation_id}/uploads/temparea/{name}``.

An upload never lands in a conversation that is not tracked: the conversation is
opened (kubernetes: its ConversationWorkspace, finalizer included, is created) before
the body's last chunk reaches the runtime (``upload_guard``), a conversation being
deleted answers 409 ``conversation_deleting``, and after the commit the backend checks
that no deletion slipped in between (``conversation_written``).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from sandbox_workspace.runtime.errors import BadRequest, TooLarge
from sandbox_workspace.runtime.schemas import UPLOAD_SUBDIR
from sandbox_workspace.runtime.workspace import Workspace

from ..backends.base import Session
from ..deps import CallerDep, ServicesDep
from ..file_refs import parse_file_ref
from ..runtime_client import RuntimeClient
from ..schemas import FileDeleted, FileList, FileUploaded
from ..upload_guard import GuardedBody

router = APIRouter(prefix="/api/v1/sessions/{session_id}/files", tags=["files"])

# Multipart framing around the file: boundaries, part headers, small form fields.
_MULTIPART_OVERHEAD = 64 * 1024
_RELAYED_HEADERS = ("content-length", "content-disposition", "x-content-sha256", "x-sandbox-path")


def _param(request: Request, name: str) -> str | None:
    """A value from the query, the seed's underscore header, or an X- header."""
    header = "x-" + name.replace("_", "-")
    for value in (
        request.query_params.get(name),
        request.headers.get(name),
        request.headers.get(header),
    ):
        if value:
            return value
    return None


def _subdir(request: Request) -> str:
    subdir = _param(request, "subdir")
    if subdir not in (None, UPLOAD_SUBDIR):
        raise BadRequest(
            f"subdir must be '{UPLOAD_SUBDIR}' (uploads are flat in v1)", code="invalid_subdir"
        )
    return UPLOAD_SUBDIR


def _required_conversation(request: Request) -> str:
    cid = _param(request, "conversation_id")
    if cid is None:
        raise BadRequest(
            "conversation_id is required (header 'conversation_id' or query)",
            code="missing_conversation_id",
        )
    return Workspace.check_conversation_id(cid)


async def _running(services, caller, session_id: str) -> tuple[Session, RuntimeClient]:
    session = await services.sessions.ensure_running(caller, session_id)
    assert session.endpoint is not None
    return session, RuntimeClient(services.http, session.endpoint)


@router.post("/upload", status_code=201)
async def upload_file(
    session_id: str, request: Request, caller: CallerDep, services: ServicesDep
) -> FileUploaded:
    """Stream a multipart upload (`file`, `conversation_id`, `subdir`) into temparea."""
    session, client = await _running(services, caller, session_id)
    limit = session.spec.file_upload.max_file_size_bytes
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit + _MULTIPART_OVERHEAD:
        raise TooLarge(f"file is larger than the limit of {limit} bytes")
    params = {k: v for k in ("conversation_id", "subdir") if (v := _param(request, k))}
    given = params.get("conversation_id")
    if given is not None:  # known up front: refuse before the body is sent
        given = Workspace.check_conversation_id(given)
        await services.backend.conversation_opened(session, given)
    content_type = request.headers.get("content-type", "")
    body = GuardedBody(
        request.stream(),
        content_type,
        given,
        lambda cid: services.backend.conversation_opened(session, cid),
    )
    try:
        result = await client.upload(aiter(body), content_type, params)
    except Exception:
        if body.error is not None:  # the guard cut the body short: say why
            raise body.error from None
        raise
    await services.backend.conversation_written(session, result.conversation_id)
    return FileUploaded(**result.model_dump(), session_id=session.session_id)


@router.get("")
async def list_files(
    session_id: str, request: Request, caller: CallerDep, services: ServicesDep
) -> FileList:
    """The user's uploads in one conversation (name, size, time, sha256, type)."""
    cid = _required_conversation(request)
    _subdir(request)
    session, client = await _running(services, caller, session_id)
    listing = await client.list_uploads(cid)
    return FileList(**listing.model_dump(), session_id=session.session_id)


@router.get("/{name:path}")
async def download_file(
    session_id: str, name: str, request: Request, caller: CallerDep, services: ServicesDep
) -> StreamingResponse:
    """Stream one uploaded file, by name (+ conversation) or by its full sandbox path."""
    _subdir(request)
    session, client = await _running(services, caller, session_id)
    ref = parse_file_ref(
        name, _param(request, "conversation_id"), session.workspace_path, allow_outputs=True
    )
    if ref.area == "outputs":
        response = await client.open_output(ref.conversation_id, list(ref.parts))
    else:
        response = await client.open_download(ref.conversation_id, ref.name)
    headers = {k: response.headers[k] for k in _RELAYED_HEADERS if k in response.headers}
    return StreamingResponse(
        response.aiter_raw(),
        media_type=response.headers.get("content-type"),
        headers=headers,
        background=BackgroundTask(response.aclose),
    )


@router.delete("/{name:path}")
async def delete_file(
    session_id: str, name: str, request: Request, caller: CallerDep, services: ServicesDep
) -> FileDeleted:
    """Delete one uploaded file."""
    _subdir(request)
    session, client = await _running(services, caller, session_id)
    ref = parse_file_ref(name, _param(request, "conversation_id"), session.workspace_path)
    await client.delete_upload(ref.conversation_id, ref.name)
    return FileDeleted(
        session_id=session.session_id, conversation_id=ref.conversation_id, name=ref.name
    )
