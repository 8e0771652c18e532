"""/api/v1/sessions/{id}/execute — run Python or bash in a conversation's directory.

``stream: false`` answers the whole result as JSON; ``stream: true`` answers SSE: ``stdout``
/ ``stderr`` / ``result`` events as they are produced, then ``done`` carrying the same
result object (or ``error``). A non-zero exit code or an exception is data in the result,
never an HTTP error.

Executed code writes into the conversation, so the conversation is opened first (kubernetes:
its ConversationWorkspace with the finalizer exists before the code runs); one being
deleted answers 409 ``conversation_deleting``; after the run the backend checks that no
deletion slipped in meanwhile (``conversation_written``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter
from fastapi.responses import Response, StreamingResponse
from pydantic import ConfigDict, Field
from starlette.background import BackgroundTask

from sandbox_workspace.contract import ids
from sandbox_workspace.contract.errors import ApiError, BadGateway
from sandbox_workspace.runtime.schemas import (
    MAX_CODE_BYTES,
    ExecuteRequest,
    ExecutionResult,
    KernelRestarted,
)

from ..backends.base import Backend, Session
from ..deps import CallerDep, ServicesDep
from ..names import ConversationIdPath, SessionIdPath, conversation_id_schema
from ..openapi import EXECUTE_EVENTS, SESSION_ERRORS, errors, sse
from ..runtime_client import RuntimeClient
from ..sse import SSE_HEADERS, encode_event, with_keepalive

router = APIRouter(prefix="/api/v1/sessions/{session_id}", tags=["execute"])
KEEPALIVE_SECONDS = 15.0


class ExecuteApiRequest(ExecuteRequest):
    model_config = ConfigDict(strict=True)  # JSON types as documented: no "1" for 1

    code: str = Field(
        min_length=1,
        description=f"Source: not blank, no NUL, at most {MAX_CODE_BYTES} bytes in UTF-8.",
        json_schema_extra={
            "pattern": "^[^\\u0000]*[^\\s\\u0000][^\\u0000]*$",
            "maxLength": MAX_CODE_BYTES,
        },
    )
    conversation_id: str = Field(
        description="Code runs in this conversation's directory.",
        json_schema_extra=conversation_id_schema(),
    )
    stream: bool = Field(False, description="Answer Server-Sent Events instead of one JSON.")


@router.post(
    "/execute",
    response_model=ExecutionResult,
    responses={
        **sse(EXECUTE_EVENTS, "The result (JSON), or with `stream: true` its events."),
        **errors(*SESSION_ERRORS, 409),
    },
)
async def execute(
    session_id: SessionIdPath, body: ExecuteApiRequest, caller: CallerDep, services: ServicesDep
):
    """Run code in the conversation's directory (Python keeps state between calls)."""
    cid = ids.conversation_id_or_400(body.conversation_id)
    # 429 at the user's, tenant's or replica's cap: each execution holds a runtime connection.
    release = services.user_limits.take_execution(caller)
    streaming = False
    try:
        session = await services.sessions.ensure_running(caller, session_id)
        assert session.endpoint is not None
        await services.backend.conversation_opened(session, cid)
        client = RuntimeClient(services.http, session.endpoint)
        request = ExecuteRequest(language=body.language, code=body.code, timeout=body.timeout)
        if not body.stream:
            # Relayed byte for byte: the runtime already produced a valid ExecutionResult.
            raw = await client.execute_raw(cid, request)
            await services.backend.conversation_written(session, cid)
            return Response(raw, media_type="application/json")
        events = _then(client.execute_stream(cid, request), services.backend, session, cid)
        try:  # errors before the first event still get a proper status code
            first = await anext(events)
        except StopAsyncIteration:
            raise BadGateway("the sandbox runtime ended the stream without a result") from None
        streaming = True
    finally:
        if not streaming:
            release()
    # The slot is held until the stream ends: released by its end, or by the background
    # task when the stream never started (both may run: a release is idempotent).
    return StreamingResponse(
        with_keepalive(_released(_sse(first, events), release), KEEPALIVE_SECONDS),
        media_type="text/event-stream",
        headers=SSE_HEADERS,
        background=BackgroundTask(release),
    )


async def _released(stream: AsyncIterator[bytes], release) -> AsyncIterator[bytes]:
    try:
        async for frame in stream:
            yield frame
    finally:
        release()


async def _then(
    events: AsyncIterator[dict], backend: Backend, session: Session, cid: str
) -> AsyncIterator[dict]:
    """The events, the after-write check just before ``done`` (a refusal becomes the
    stream's ``error`` instead)."""
    checked = False
    async for event in events:
        if event.get("type") == "done":
            checked = True
            await backend.conversation_written(session, cid)
        yield event
    if not checked:
        await backend.conversation_written(session, cid)


async def _sse(first: dict, events: AsyncIterator[dict]) -> AsyncIterator[bytes]:
    seq = 0

    async def chain():
        yield first
        async for event in events:
            yield event

    try:
        async for event in chain():
            seq += 1
            kind = event.pop("type")
            yield encode_event(seq, kind, event.get("result", event) if kind == "done" else event)
    except ApiError as e:
        seq += 1
        yield encode_event(seq, "error", {"code": e.code, "message": e.message})


@router.post(
    "/conversations/{conversation_id}/kernel/restart", responses=errors(*SESSION_ERRORS, 409)
)
async def restart_kernel(
    session_id: SessionIdPath,
    conversation_id: ConversationIdPath,
    caller: CallerDep,
    services: ServicesDep,
) -> KernelRestarted:
    """Stop the conversation's Python interpreter; the next call starts with fresh state."""
    cid = ids.conversation_id_or_400(conversation_id)
    session = await services.sessions.ensure_running(caller, session_id)
    assert session.endpoint is not None
    return await RuntimeClient(services.http, session.endpoint).restart_kernel(cid)
