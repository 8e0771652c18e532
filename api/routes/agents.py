"""/api/v1/agents — seed 002's ``/api/agent`` (the chat sidebar's backend) over the one
run engine of ``/chat``.

``POST /agents`` validates the whole request first (400/422 before any stream: the
access points' JSON pointers, their overlap, ``workingDirectory`` inside the
conversation, the selected files as on every chat route), builds the table plan
(``chat/table_agent.py``), starts the run and answers seed 002's events
(``chat/agents_stream.py``). Without ``conversation_id`` the run gets a conversation of
its own, ``agent-{hex}``, named in the first ``status`` event; it is kept like any other
conversation (delete it with ``DELETE /sessions/{session_id}/conversations/{id}``), so a
client that wants the files of one chat sidebar together sends the same id each time.

With ``table_id`` the table comes from the table source (``api/table_source.py``) before
anything else: 403/404 there is our 404; a source that is down or slow answers the
stream at once with ``error`` and ``result {success: false}`` (no run). After a run with
a ``full`` node, the merged table is PUT back before the ``result`` event.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from functools import partial
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from sandbox_workspace.contract import ids
from sandbox_workspace.contract.errors import BadRequest, NotConfigured

from ..chat.agents_stream import EVENT_TYPES, AgentsStream, encode, failed
from ..chat.policy import effective_policies
from ..chat.request import HistoryMessage
from ..chat.run_events import translated
from ..chat.selected_files import SelectedFileRef, selected_files_field, selected_names
from ..chat.service import launch, refuse_deleting, refuse_unknown_selected, require_llm
from ..chat.table_agent import make_plan, working_directory
from ..deps import CallerDep, ServicesDep
from ..event_stream import EventStream
from ..names import conversation_id_schema
from ..openapi import errors, sse
from ..schemas import json_int
from ..sse import SSE_HEADERS
from ..table_source import TableSourceFailed, from_settings, identity_headers

router = APIRouter(prefix="/api/v1", tags=["agents"])
MAX_ITERATIONS = 15  # seed 002: maxIterations = 15


class AccessPoint(BaseModel):
    model_config = ConfigDict(strict=True)

    path: str = Field(
        "",
        max_length=4096,
        pattern=r"^(/([^~]|~[01])*)?$",
        description="A JSON pointer (RFC 6901) into the table: `/users/0/name`; empty or "
        "`/` for the root; `~1` for '/', `~0` for '~' in a key.",
    )
    mode: Literal["readonly", "full"]


class AgentRequest(BaseModel):
    """seed 002 §POST /agents, plus our ``conversation_id`` and ``selected_files``."""

    model_config = ConfigDict(
        strict=True,  # JSON types as documented: no "1" for 1
        json_schema_extra={"not": {"required": ["table_id", "tableData"]}},
    )

    prompt: str = Field(min_length=1, max_length=100_000, pattern=r"\S")
    chatHistory: list[HistoryMessage] = Field(default_factory=list, max_length=500)
    table_id: json_int(ge=0) | Annotated[str, Field(min_length=1, max_length=200)] | None = Field(
        None, description="A table of the table source (SANDBOX_WORKSPACE_TABLE_SOURCE_URL)."
    )
    tableData: Any = Field(None, description="The table inline (the frontend's current form).")
    workingDirectory: str | None = Field(
        None,
        max_length=4096,
        description="Root of the file tools: relative to the conversation, or a full path "
        "inside it (anything else 400).",
    )
    bashAccessPoints: list[AccessPoint] = Field(default_factory=list, max_length=50)
    conversation_id: str | None = Field(None, json_schema_extra=conversation_id_schema())
    selected_files: list[SelectedFileRef] = selected_files_field()


@router.post(
    "/agents",
    response_class=StreamingResponse,
    responses={
        **sse(EVENT_TYPES, "seed 002's events; `result` is always the last."),
        **errors(400, 404, 503),  # 404: table_id unknown to (or refused by) the source
    },
)
async def agents(
    body: AgentRequest, caller: CallerDep, services: ServicesDep, request: Request
) -> EventStream:
    """Run seed 002's table agent; answers its SSE events (`result` last, also on failure)."""
    llm = require_llm(services)
    settings = services.settings
    table, has_table = body.tableData, "tableData" in body.model_fields_set
    write_table = None
    if "table_id" in body.model_fields_set and has_table:
        raise BadRequest("send table_id or tableData, not both", code="invalid_table")
    if body.table_id is not None:
        if not settings.table_source_url:  # this server's configuration, not the request
            raise NotConfigured(
                "table_id needs a table source (SANDBOX_WORKSPACE_TABLE_SOURCE_URL); send "
                "tableData instead",
                code="table_source_not_configured",
            )
        source = from_settings(services.http, settings)
        authorization = request.headers.get("authorization")
        identity = identity_headers(caller, authorization)
        try:
            table = await source.get(body.table_id, identity)  # 403/404: our 404
        except TableSourceFailed as e:  # down or slow: the seed's stream, ending at once
            return EventStream(_once(failed(e.message, e.code)), SSE_HEADERS)
        has_table = True
        write_table = partial(source.put, body.table_id, headers=identity)

    cid = ids.conversation_id_or_400(body.conversation_id or f"agent-{uuid.uuid4().hex[:16]}")
    session_id = caller.session_id
    existing = await services.backend.get_session(session_id)
    workspace = existing.workspace_path if existing is not None else None
    root = working_directory(body.workingDirectory, cid, workspace)
    plan = make_plan(
        table,
        [p.model_dump() for p in body.bashAccessPoints],
        root,
        has_table=has_table,
        table_id=body.table_id,
    )
    if body.table_id is not None:
        # Another replica carrying the run on can write back as this caller only when the
        # identity is the user id alone: a credential (Authorization) is never stored.
        plan["identity"] = "authorization" if authorization else "user_id"
    await refuse_deleting(services, existing, cid)
    names = selected_names(cid, workspace, body.selected_files)
    await refuse_unknown_selected(services, existing, cid, names)
    run = launch(
        services,
        caller,
        cid,
        llm,
        query=body.prompt,
        history=[m.model_dump() for m in body.chatHistory],
        selected_files=names,
        policies=effective_policies(plan["tools"], settings.tool_policies, None),
        max_iterations=MAX_ITERATIONS,
        table=plan,
        write_table=write_table,
    )
    headers = {**SSE_HEADERS, "X-Run-Id": run.id}
    return translated(run, 0, AgentsStream(), encode, settings.chat_keepalive_seconds, headers)


async def _once(messages: list[dict]) -> AsyncIterator[list[bytes]]:
    yield [encode(m) for m in messages]
