"""/api/v1/chat and /api/v1/runs — start an agent run and follow, steer or stop it.

``POST /chat`` validates everything it can before answering (a model is configured, the
conversation id, tool policies, every selected file belongs to this conversation's
temparea, the conversation is not being deleted — 409 ``conversation_deleting``), then
starts the run in the background and answers its SSE stream. The run opens the
conversation (kubernetes: creates its ConversationWorkspace with the finalizer) before
anything of it is written, and checks it again before each tool call. The stream
is only a view: a client that drops loses nothing, and ``GET /runs/{id}/events`` with
``Last-Event-ID`` re-attaches from where it left off.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Annotated, Any, Literal
from urllib.parse import quote

from fastapi import APIRouter, Header, Path, Query
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, model_validator

from sandbox_workspace.operator.naming import DEFAULT_TENANT, tenant_of
from sandbox_workspace.runtime.errors import NotConfigured, NotFoundError
from sandbox_workspace.runtime.workspace import Workspace

from ..backends.base import ConversationDeleting, ConversationPhase, Session, SessionStatus
from ..chat.loop import run_agent
from ..chat.policy import Policy, effective_policies
from ..chat.progress import Progress
from ..chat.run import Run
from ..chat.selected_files import (
    MAX_SELECTED,
    SelectedFileRef,
    history_names,
    selected_files_field,
    selected_names,
)
from ..chat.spec import RunSpec, spec_data, spec_from_data
from ..chat.tools import TOOL_NAMES
from ..deps import CallerDep, ServicesDep, StreamCallerDep
from ..event_stream import EventStream
from ..identity import Caller
from ..names import conversation_id_schema
from ..openapi import CHAT_EVENTS, RUN_START_ERRORS, errors, sse
from ..runtime_client import RuntimeClient
from ..schemas import StreamToken, json_int
from ..sse import SSE_HEADERS
from ..table_source import from_settings, identity_headers

router = APIRouter(prefix="/api/v1", tags=["chat"])


_Iterations = json_int(ge=1, le=100)


class HistoryMessage(BaseModel):
    model_config = ConfigDict(strict=True)  # JSON types as documented: no "1" for 1

    role: Literal["user", "assistant"]
    content: str = Field(max_length=200_000)
    selected_files: list[SelectedFileRef] = Field(
        default_factory=list,
        max_length=MAX_SELECTED,
        strict=True,
        description="A user turn's own selection (seed 000 §7.4): its context message is "
        "rebuilt just before it. The same forms as the request's `selected_files`; a file "
        "deleted since is still named (where it was).",
    )

    @model_validator(mode="after")
    def _files_on_user_turns(self) -> HistoryMessage:
        if self.selected_files and self.role != "user":
            raise ValueError("selected_files belongs to user turns only")
        return self


class ChatRequest(BaseModel):
    """seed 000 §7.6 ChatReq."""

    model_config = ConfigDict(strict=True)  # JSON types as documented: no "1" for 1

    query: str = Field(
        min_length=1,
        max_length=100_000,
        pattern=r"\S",
        description="The user's message (not blank).",
    )
    conversation_id: str = Field(json_schema_extra=conversation_id_schema())
    agent_id: str = Field("", max_length=253)
    history: list[HistoryMessage] = Field(default_factory=list, max_length=500)
    selected_files: list[SelectedFileRef] = selected_files_field()
    tool_policies: dict[str, Policy] | None = Field(
        None,
        description="Per tool, only stricter than the configured policy (the schema lists "
        "each tool and the values allowed on this deployment).",
    )
    max_iterations: _Iterations | None = None


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


async def _refuse_deleting(services, session: Session | None, cid: str) -> None:
    if session is None:
        return
    if await services.backend.conversation_phase(session, cid) == ConversationPhase.DELETING:
        raise ConversationDeleting(cid)


async def refuse_unknown_selected(
    services, session: Session | None, cid: str, names: list[str]
) -> None:
    """A selected name that is not an upload of this conversation (another
    conversation's, a typo) is 404 ``file_not_found`` before any stream — when the session
    runs; a sandbox still starting is checked by the run once it is up."""
    if not names or session is None or session.terminating:
        return
    if session.status != SessionStatus.RUNNING or session.endpoint is None:
        return
    uploads = await RuntimeClient(services.http, session.endpoint).list_uploads(cid)
    missing = sorted(set(names) - {f.name for f in uploads.files})
    if missing:
        raise NotFoundError(
            f"selected file(s) {', '.join(missing)} are not uploads of conversation '{cid}'",
            code="file_not_found",
        )


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


def require_llm(services):
    """The configured model, or 503 naming the settings to set."""
    if services.llm is None:
        raise NotConfigured(
            "chat needs a model: set SANDBOX_WORKSPACE_LLM_MODEL and "
            "SANDBOX_WORKSPACE_LLM_BASE_URL (SANDBOX_WORKSPACE_LLM_PROVIDER=anthropic: "
            "the base URL defaults to Anthropic's), and SANDBOX_WORKSPACE_LLM_API_KEY if "
            "the endpoint wants one",
            code="llm_not_configured",
        )
    return services.llm


async def start_run(body: ChatRequest, caller: Caller, services) -> Run:
    """Validate a chat request and start its run in the background (the one run engine
    behind /chat, /ui/chat and /ag-ui)."""
    settings = services.settings
    llm = require_llm(services)
    cid = Workspace.check_conversation_id(body.conversation_id)
    policies = effective_policies(TOOL_NAMES, settings.tool_policies, body.tool_policies)
    session_id = caller.session_id
    existing = await services.backend.get_session(session_id)
    await _refuse_deleting(services, existing, cid)
    workspace = existing.workspace_path if existing is not None else None
    names = selected_names(cid, workspace, body.selected_files)
    await refuse_unknown_selected(services, existing, cid, names)
    history = [
        {
            "role": m.role,
            "content": m.content,
            "selected_files": history_names(cid, workspace, m.selected_files, i),
        }
        for i, m in enumerate(body.history)
    ]
    return launch(
        services,
        caller,
        cid,
        llm,
        query=body.query,
        history=history,
        selected_files=names,
        policies=policies,
        max_iterations=body.max_iterations or settings.chat_max_iterations,
    )


def launch(
    services,
    caller: Caller,
    cid: str,
    llm,
    *,
    query: str,
    history: list[dict],
    selected_files: list[str],
    policies: dict[str, Policy],
    max_iterations: int,
    table: dict | None = None,
    write_table: Callable[[Any], Awaitable[None]] | None = None,
) -> Run:
    """Start a validated request's run in the background (every route's one way): its
    ``RunSpec`` with this server's limits and the session callbacks, registered with the
    run store (its JSON half, for another replica) and spawned."""
    settings = services.settings
    session_id = caller.session_id
    run = Run(user_id=caller.user_id, session_id=session_id, conversation_id=cid)
    ensure, before_tool, after_write, record_activity = _session_callbacks(
        services, caller, session_id, cid, run.id
    )
    spec = RunSpec(
        query=query,
        history=history,
        selected_files=selected_files,
        policies=policies,
        max_iterations=max_iterations,
        deadline_seconds=settings.chat_run_deadline_seconds,
        approval_timeout=settings.chat_approval_timeout_seconds,
        tool_timeout=settings.chat_tool_timeout_seconds,
        ensure_session=ensure,
        before_tool=before_tool,
        after_write=after_write,
        record_activity=record_activity,
        table=table,
        write_table=write_table,
    )
    release = services.user_limits.runs.take(session_id)  # 429 when at the cap
    try:
        services.runs.add(run, spec_data(spec))
        run.task = services.spawn(run_agent(run, spec, llm, services.http))
    except BaseException:
        release()
        raise
    run.task.add_done_callback(lambda _: release())  # the slot is held while it runs
    return run


def _session_callbacks(services, caller: Caller, session_id: str, cid: str, run_id: str):
    """What a run calls back: ensure its session (opening the conversation), check the
    conversation again before each tool call, record activity."""
    opened: list[Session] = []

    async def ensure():
        session = await services.sessions.ensure_running(caller, session_id)
        await services.backend.conversation_opened(session, cid)
        opened[:] = [session]
        return session

    async def before_tool():
        # The lease fence first: a replica cut off from the run store starts no tool
        # that the replica taking the run over would run again.
        await services.runs.store.before_tool(run_id)
        if opened:  # a deletion accepted by another replica reaches us this way
            await services.backend.conversation_opened(opened[0], cid)

    async def after_write():
        if opened:
            await services.backend.conversation_written(opened[0], cid)

    record = lambda: services.backend.record_activity(session_id)  # noqa: E731
    return ensure, before_tool, after_write, record


def resume_run(services, run: Run, data: dict, checkpoint: dict | None):
    """Carry on a run taken over from another replica (see chat/runstore/takeover.py)."""
    # The run's session names its tenant: the resumed caller acts in it, as the starter did.
    tenant = tenant_of(run.session_id) or DEFAULT_TENANT
    caller = Caller(user_id=run.user_id, via="resumed", tenant=tenant)
    ensure, before_tool, after_write, record_activity = _session_callbacks(
        services, caller, run.session_id, run.conversation_id, run.id
    )
    spec = spec_from_data(data, ensure, record_activity)
    spec.before_tool = before_tool
    spec.after_write = after_write
    table = spec.table or {}
    settings = services.settings
    if table.get("identity") == "user_id" and settings.table_source_url:
        # /agents with table_id from a caller known by user id alone: the same headers
        # (a caller's credential is never stored: without it, finish_table says so).
        source = from_settings(services.http, settings)
        spec.write_table = partial(
            source.put, table["table_id"], headers=identity_headers(caller, None)
        )
    progress = None if checkpoint is None else Progress.from_data(checkpoint)
    return services.spawn(run_agent(run, spec, services.llm, services.http, progress, resumed=True))


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
