"""/api/v1/ui/chat — the chat runs as a Vercel AI SDK UI message stream (``useChat``).

``POST /ui/chat`` takes what ``DefaultChatTransport`` sends: ``id`` (the client's chat
id), ``messages`` (UI messages with parts), ``trigger``, ``messageId``, plus our body
fields ``conversation_id`` and ``selected_files``. When the last message is the user's,
it starts a run (the same engine as ``/chat``) from its text parts, the earlier messages
becoming the history. When the last message is the assistant's with tool parts in state
``approval-responded``, it decides those calls on the waiting run and streams the run's
continuation into that same message. ``GET /ui/chat/{id}/stream`` replays the chat's
active run from its start and follows it live (``DefaultChatTransport`` resumes with
replay semantics); 204 when the chat has no active run. Which run a chat is on, the
run's log and its approvals are kept in the run store, so any replica answers any of
these requests (``chat.runStore=redis``).
"""

from __future__ import annotations

import contextlib
from typing import Any, Literal

from fastapi import APIRouter, Response
from pydantic import BaseModel, ConfigDict, Field

from sandbox_workspace.contract.errors import BadRequest, NotFoundError

from ..chat.chat_index import ChatRun
from ..chat.run import Run
from ..chat.run_events import decided_approvals, encode_data, translated
from ..chat.selected_files import SelectedFileRef, selected_files_field
from ..chat.turns import Answer, answer_approvals, start_turn
from ..chat.ui_stream import DONE, HEADERS, UiMessageStream
from ..deps import CallerDep, ServicesDep
from ..event_stream import EventStream
from ..names import conversation_id_schema, name_schema
from ..openapi import RUN_START_ERRORS, rules_400

router = APIRouter(prefix="/api/v1/ui", tags=["ui-chat"])


class UiMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str = Field(max_length=200)
    role: Literal["system", "user", "assistant"]
    parts: list[dict[str, Any]] = Field(default_factory=list, max_length=1000)


_FILE_NAME = {k: v for k, v in name_schema("x").items() if k != "description"}

# The rules on ``messages`` no JSON Schema keyword can state (none addresses an array's
# last item): in the field's description and the operation's 400.
LAST_MESSAGE_RULES = (
    "The last message must be the user's, with a non-blank `text` part (it starts a run; "
    "else 400 `invalid_messages`), or the assistant's with tool parts in state "
    "`approval-responded` carrying `approval: {id, approved: true|false}` (they answer the "
    "run's approvals; else 400 `nothing_to_continue`, `invalid_approval` for an `approved` "
    "that is not a boolean, `invalid_approval_id` for an id this API did not issue, "
    "`mixed_runs` for approvals of more than one run)."
)


class UiChatRequest(BaseModel):
    """The body ``DefaultChatTransport.sendMessages`` posts, plus our fields."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "examples": [
                {
                    "id": "chat-1",
                    "messages": [
                        {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "Hi"}]}
                    ],
                    "conversation_id": "conv456",
                }
            ]
        },
    )

    id: str = Field(min_length=1, max_length=200, description="The client's chat id.")
    messages: list[UiMessage] = Field(
        min_length=1, max_length=500, description=f"The chat so far. {LAST_MESSAGE_RULES}"
    )
    trigger: Literal["submit-message", "regenerate-message"] = "submit-message"
    messageId: str | None = Field(None, max_length=200)
    conversation_id: str = Field(json_schema_extra=conversation_id_schema())
    selected_files: list[SelectedFileRef] = selected_files_field()
    agent_id: str = ""


def text_of(message: UiMessage) -> str:
    return "".join(str(p.get("text", "")) for p in message.parts if p.get("type") == "text").strip()


def approval_answers(message: UiMessage) -> list[Answer]:
    answers = []
    for part in message.parts:
        kind = str(part.get("type", ""))
        is_tool = kind.startswith("tool-") or kind == "dynamic-tool"
        approval = part.get("approval")
        if is_tool and part.get("state") == "approval-responded" and isinstance(approval, dict):
            if not isinstance(approval.get("approved"), bool):
                raise BadRequest(
                    "an approval response needs approved: true or false", code="invalid_approval"
                )
            answers.append(
                Answer(
                    str(approval.get("id", "")), approval["approved"], approval.get("reason") or ""
                )
            )
    return answers


async def _remember(services, session_id: str, chat_id: str, entry: ChatRun) -> None:
    # Resuming matters while the run is open: at most its deadline (plus the retention).
    settings = services.settings
    ttl = settings.chat_run_deadline_seconds + settings.chat_run_retention_seconds
    await services.runs.store.set_chat_run(session_id, chat_id, entry, ttl)


def _respond(run: Run, translator: UiMessageStream, after: int, keepalive: float):
    headers = {**HEADERS, "X-Run-Id": run.id}
    return translated(run, after, translator, encode_data, keepalive, headers, tail=DONE)


def _metadata(run: Run) -> dict[str, str]:
    return {"run_id": run.id, "conversation_id": run.conversation_id}


@router.post(
    "/chat",
    responses={
        200: {"content": {"text/event-stream": {}}},
        **rules_400(LAST_MESSAGE_RULES, *RUN_START_ERRORS),
    },
)
async def ui_chat(body: UiChatRequest, caller: CallerDep, services: ServicesDep) -> EventStream:
    """Start a run, or answer its approvals; answers a UI message stream (v1)."""
    keepalive = services.settings.chat_keepalive_seconds
    last = body.messages[-1]
    if last.role == "assistant":
        answers = approval_answers(last)
        if not answers:
            raise BadRequest(
                "the last message is the assistant's and answers no approval; "
                "send a user message to start a run",
                code="nothing_to_continue",
            )
        run, after, calls = await answer_approvals(caller, services, answers, "ui")
        await _remember(services, caller.session_id, body.id, ChatRun(run.id, last.id))
        translator = UiMessageStream(run.id, last.id, _metadata(run), announced=calls)
        return _respond(run, translator, after, keepalive)
    query = text_of(last)
    if last.role != "user" or not query:
        raise BadRequest(
            "the last message must be the user's, with a text part", code="invalid_messages"
        )
    history = [
        {"role": m.role, "content": text}
        for m in body.messages[:-1]
        if m.role in ("user", "assistant") and (text := text_of(m))
    ]
    previous = await services.runs.store.chat_run(caller.session_id, body.id)
    run = await start_turn(
        caller,
        services,
        query=query,
        history=history,
        conversation_id=body.conversation_id,
        selected_files=body.selected_files,
        agent_id=body.agent_id,
        protocol="ui",
    )
    if previous is not None:  # the new message supersedes the chat's run still open
        with contextlib.suppress(NotFoundError):
            await services.runs.cancel(await services.runs.find(previous.run_id, caller.session_id))
    message_id = f"msg_{run.id}"
    await _remember(services, caller.session_id, body.id, ChatRun(run.id, message_id))
    return _respond(run, UiMessageStream(run.id, message_id, _metadata(run)), 0, keepalive)


@router.get(
    "/chat/{chat_id}/stream",
    responses={200: {"content": {"text/event-stream": {}}}, 204: {"description": "no active run"}},
)
async def ui_chat_stream(chat_id: str, caller: CallerDep, services: ServicesDep) -> Response:
    """Resume the chat's active run: replayed from its start, then live (204 when none)."""
    entry = await services.runs.store.chat_run(caller.session_id, chat_id)
    if entry is None:
        return Response(status_code=204)
    try:
        run = await services.runs.find(entry.run_id, caller.session_id)
    except NotFoundError:
        return Response(status_code=204)
    if run.finished:
        return Response(status_code=204)
    decided = await decided_approvals(services.runs.store, run)
    translator = UiMessageStream(run.id, entry.message_id, _metadata(run), decided=decided)
    release = services.user_limits.followers.take(caller.session_id)  # 429 when at the cap
    stream = _respond(run, translator, 0, services.settings.chat_keepalive_seconds)
    stream.on_close = release
    return stream
