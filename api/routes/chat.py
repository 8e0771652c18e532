"""/api/v1/chat and /api/v1/runs — start an agent run and follow, steer or stop it.

``POST /chat`` has the chat service (``chat/service.start_run``) validate everything it
can before answering (a model is configured, the conversation id, tool policies, every
selected file belongs to this conversation's temparea, the conversation is not being
deleted — 409 ``conversation_deleting``) and start the run in the background, then
answers its SSE stream. The run opens the
conversation (kubernetes: creates its ConversationWorkspace with the finalizer) before
anything of it is written, and checks it again before each tool call. The stream
is only a view: a client that drops loses nothing, and ``GET /runs/{id}/events`` with
``Last-Event-ID`` re-attaches from where it left off.
"""

from __future__ import annotations

from typing import Annotated, Literal
from urllib.parse import quote

from fastapi import APIRouter, Header, Path, Query
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from ..chat.request import ChatRequest
from ..chat.run import Run
from ..chat.service import start_run
from ..deps import CallerDep, ServicesDep, StreamCallerDep
from ..event_stream import EventStream
from ..openapi import CHAT_EVENTS, RUN_START_ERRORS, errors, sse
from ..schemas import StreamToken
from ..sse import SSE_HEADERS

router = APIRouter(prefix="/api/v1", tags=["chat"])


RunIdPath = Annotated[str, Path(max_length=200, description="From `run_started` or `X-Run-Id`.")]
_SSE = sse(CHAT_EVENTS, "The run's events: `run_started` first, `done` last.")


class ApprovalRequest(BaseModel):
    model_config = ConfigDict(strict=True)  # JSON types as documented: no "1" for 1

    tool_call_id: str = Field(min_length=1, max_length=200)
    approved: bool
    reason: str = Field("", max_length=2000)


def _stream(run: Run, after: int, keepalive: float) -> EventStream:
    # Events that arrived together go out in one write; an empty batch is a keep-alive.
    return EventStream(run.follow(after, idle=keepalive), {**SSE_HEADERS, "X-Run-Id": run.id})


class ApprovalResult(BaseModel):
    run_id: str
    tool_call_id: str
    decision: Literal["approved", "rejected"]


class CancelResult(BaseModel):
    run_id: str
    status: Literal["cancelling", "finished"]


@router.post(
    "/chat",
    # Documented as Starlette's streaming response (which leaves the error bodies
    # application/json in the document); answered with ``EventStream``.
    response_class=StreamingResponse,
    responses={**_SSE, **errors(400, *RUN_START_ERRORS)},
)
async def chat(body: ChatRequest, caller: CallerDep, services: ServicesDep) -> EventStream:
    """Start an agent run in the conversation; answers its SSE stream (`run_started` first,
    `done` last). The run goes on if the client drops: re-attach with `/runs/{id}/events`."""
    run = await start_run(body, caller, services)
    return _stream(run, 0, services.settings.chat_keepalive_seconds)


@router.get(
    "/runs/{run_id}/events",
    # Documented as Starlette's streaming response (which leaves the error bodies
    # application/json in the document); answered with ``EventStream``.
    response_class=StreamingResponse,
    responses={**_SSE, **errors(400, 404)},
)
async def run_events(
    run_id: RunIdPath,
    caller: StreamCallerDep,
    services: ServicesDep,
    last_event_id: Annotated[
        str | None,
        Header(pattern=r"^\s*[0-9]{1,18}\s*$", description="Resume after this event id."),
    ] = None,
    after: Annotated[
        int | None, Query(ge=0, le=10**18, description="Same as Last-Event-ID (wins over it).")
    ] = None,
) -> EventStream:
    """Re-attach to a run: every event after Last-Event-ID (or `after`), then live ones.

    Authenticate as usual, or — for EventSource — with `?token=` from
    `POST /runs/{run_id}/stream-token`."""
    run = await services.runs.find(run_id, caller.session_id)
    position = after if after is not None else int(last_event_id or 0)
    release = services.user_limits.followers.take(caller.session_id)  # 429 when at the cap
    stream = _stream(run, position, services.settings.chat_keepalive_seconds)
    stream.on_close = release
    return stream


@router.post("/runs/{run_id}/stream-token", responses=errors(404))
async def create_stream_token(
    run_id: RunIdPath, caller: CallerDep, services: ServicesDep
) -> StreamToken:
    """A short-lived token that lets a browser's EventSource read this run's events
    (`GET /runs/{run_id}/events?token=…`); it grants nothing else."""
    run = await services.runs.find(run_id, caller.session_id)
    token, expires = services.stream_tokens.issue(run.id, caller.user_id, tenant=caller.tenant)
    url = f"/api/v1/runs/{quote(run.id, safe='')}/events?token={quote(token, safe='')}"
    return StreamToken(run_id=run.id, token=token, expires_at=expires, events_url=url)


@router.post("/runs/{run_id}/approvals", responses=errors(404, 409))
async def approve(
    run_id: RunIdPath, body: ApprovalRequest, caller: CallerDep, services: ServicesDep
) -> ApprovalResult:
    """Approve or reject a tool call the run is waiting on (a second decision is 409)."""
    run = await services.runs.find(run_id, caller.session_id)
    await services.runs.decide(run, body.tool_call_id, body.approved, body.reason)
    return ApprovalResult(
        run_id=run.id,
        tool_call_id=body.tool_call_id,
        decision="approved" if body.approved else "rejected",
    )


@router.post("/runs/{run_id}/cancel", responses=errors(404))
async def cancel(run_id: RunIdPath, caller: CallerDep, services: ServicesDep) -> CancelResult:
    """Stop a run; its stream ends with error (cancelled) and done."""
    run = await services.runs.find(run_id, caller.session_id)
    cancelled = await services.runs.cancel(run)
    return CancelResult(run_id=run.id, status="cancelling" if cancelled else "finished")
