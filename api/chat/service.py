"""The chat service: start a run, or carry one on — whichever protocol asked.

Contract: ``start_run`` validates a ``ChatRequest`` as far as it can before anything
starts (a model is configured — 503 ``llm_not_configured``; the conversation id; tool
policies only stricter than configured; every selected file is this conversation's
temparea; the conversation is not being deleted — 409 ``conversation_deleting``), then
``launch``es it: the run's ``RunSpec`` (plain data, with this server's limits) goes to
the run store and the engine (``loop.run_agent``) runs in the background with a
``ServiceConversation``, its one way to the session, files and activity. ``resume_run``
carries on a run another replica started (chat/runstore/takeover.py). The routes
(/chat, /ui/chat, /ag-ui, /agents) only translate their protocol into these calls.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from sandbox_workspace.contract import ids
from sandbox_workspace.contract.errors import ConversationDeleting, NotConfigured, NotFoundError
from sandbox_workspace.operator.naming import DEFAULT_TENANT, tenant_of

from ..backends.base import ConversationPhase, Session, SessionStatus
from ..identity import Caller
from ..runtime_client import RuntimeClient
from ..table_source import from_settings, identity_headers
from . import auto_snapshot
from .loop import run_agent
from .policy import Policy, effective_policies
from .progress import Progress
from .request import ChatRequest
from .run import Run
from .selected_files import history_names, selected_names
from .spec import RunSpec, spec_data, spec_from_data
from .tools import TOOL_NAMES


async def refuse_deleting(services, session: Session | None, cid: str) -> None:
    """409 ``conversation_deleting`` while the conversation is being deleted."""
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
    cid = ids.conversation_id_or_400(body.conversation_id)
    policies = effective_policies(TOOL_NAMES, settings.tool_policies, body.tool_policies)
    session_id = caller.session_id
    existing = await services.backend.get_session(session_id)
    await refuse_deleting(services, existing, cid)
    workspace = existing.workspace_path if existing is not None else None
    names = selected_names(cid, workspace, body.selected_files)
    await refuse_unknown_selected(services, existing, cid, names)
    return launch(
        services,
        caller,
        cid,
        llm,
        query=body.query,
        history=[
            {
                "role": m.role,
                "content": m.content,
                "selected_files": history_names(cid, workspace, m.selected_files, i),
            }
            for i, m in enumerate(body.history)
        ],
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
    ``RunSpec`` with this server's limits, registered with the run store (as JSON, for
    another replica), and spawned with its ``ServiceConversation``."""
    settings = services.settings
    session_id = caller.session_id
    run = Run(user_id=caller.user_id, session_id=session_id, conversation_id=cid)
    conversation = ServiceConversation(
        services, caller, session_id, cid, run.id, write_table, starts_turn=True
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
        table=table,
    )
    release = services.user_limits.runs.take(session_id)  # 429 when at the cap
    try:
        services.runs.add(run, spec_data(spec))
        run.task = services.spawn(run_agent(run, spec, conversation, llm, services.http))
    except BaseException:
        release()
        raise
    run.task.add_done_callback(lambda _: release())  # the slot is held while it runs
    return run


class ServiceConversation:
    """``RunConversation`` on this API's services: ensure the caller's session (opening
    the conversation), check the conversation again before each tool call, note writes
    and activity with the backend."""

    def __init__(
        self,
        services,
        caller: Caller,
        session_id: str,
        cid: str,
        run_id: str,
        table_writer: Callable[[Any], Awaitable[None]] | None = None,
        *,
        starts_turn: bool = False,
    ) -> None:
        self.services, self.caller, self.session_id, self.cid = services, caller, session_id, cid
        self.run_id = run_id
        self.table_writer = table_writer
        self._opened: Session | None = None
        self._snapshot_due = starts_turn  # a new run's turn: ``auto_snapshot`` first

    async def ensure_session(self) -> Session:
        session = await self.services.sessions.ensure_running(self.caller, self.session_id)
        await self.services.backend.conversation_opened(session, self.cid)
        self._opened = session
        if self._snapshot_due:
            self._snapshot_due = False
            await auto_snapshot.before_turn(self.services, session, self.cid, self.run_id)
        return session

    async def before_tool(self) -> None:
        # The lease fence first: a replica cut off from the run store starts no tool that
        # the replica taking the run over would run again.
        await self.services.runs.store.before_tool(self.run_id)
        if self._opened is not None:  # a deletion accepted by another replica: seen here
            await self.services.backend.conversation_opened(self._opened, self.cid)

    async def after_write(self) -> None:
        if self._opened is not None:
            await self.services.backend.conversation_written(self._opened, self.cid)

    async def record_activity(self) -> None:
        await self.services.backend.record_activity(self.session_id)


def resume_run(services, run: Run, data: dict, checkpoint: dict | None):
    """Carry on a run taken over from another replica (see chat/runstore/takeover.py)."""
    # The run's session names its tenant: the resumed caller acts in it, as the starter did.
    tenant = tenant_of(run.session_id) or DEFAULT_TENANT
    caller = Caller(user_id=run.user_id, via="resumed", tenant=tenant)
    spec = spec_from_data(data)
    table = spec.table or {}
    settings = services.settings
    table_writer = None
    if table.get("identity") == "user_id" and settings.table_source_url:
        # /agents with table_id from a caller known by user id alone: the same headers
        # (a caller's credential is never stored: without it, finish_table says so).
        source = from_settings(services.http, settings)
        table_writer = partial(
            source.put, table["table_id"], headers=identity_headers(caller, None)
        )
    conversation = ServiceConversation(
        services, caller, run.session_id, run.conversation_id, run.id, table_writer
    )
    progress = None if checkpoint is None else Progress.from_data(checkpoint)
    return services.spawn(
        run_agent(run, spec, conversation, services.llm, services.http, progress, resumed=True)
    )
