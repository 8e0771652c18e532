"""/api/v1/ag-ui — the chat runs as AG-UI events (``HttpAgent`` and friends).

``POST /ag-ui`` takes a ``RunAgentInput``. ``threadId`` is the conversation (or
``forwardedProps.conversation_id`` when the thread id is the client's own);
``forwardedProps.selected_files`` selects uploads. Without ``resume`` it starts a run from
the last message, which must be the user's (earlier user/assistant messages become the
history). A run that
needs an approval ends with ``RUN_FINISHED`` and an interrupt outcome; the next
``RunAgentInput`` answers it in ``resume`` — ``status: "resolved"`` with ``payload:
{"approved": bool, "reason"?: str}``, or ``status: "cancelled"`` (a rejection) — and its
events continue the same engine run from the approval on — on whichever replica it lands
(the run is found, read and decided through the run store, see turns.py).
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from sandbox_workspace.contract.errors import BadRequest

from ..chat.ag_ui import AgUiStream
from ..chat.run import Run
from ..chat.run_events import encode_data, translated
from ..chat.selected_files import MAX_SELECTED, parse_selected
from ..chat.turns import Answer, answer_approvals, start_turn
from ..deps import CallerDep, ServicesDep
from ..event_stream import EventStream
from ..names import conversation_id_schema, name_schema
from ..openapi import RUN_START_ERRORS, rules_400
from ..sse import SSE_HEADERS

router = APIRouter(prefix="/api/v1", tags=["ag-ui"])


# A resolved approval interrupt carries the decision.
_RESOLVED_HAS_DECISION = {
    "if": {"properties": {"status": {"const": "resolved"}}},
    "then": {
        "required": ["payload"],
        "properties": {
            "payload": {
                "type": "object",
                "required": ["approved"],
                "properties": {"approved": {"type": "boolean"}},
            }
        },
    },
}


class ResumeEntry(BaseModel):
    model_config = ConfigDict(extra="allow", json_schema_extra=_RESOLVED_HAS_DECISION)

    interruptId: str = Field(
        max_length=400,
        # In the schema only: the server answers another id 400 invalid_approval_id,
        # saying where ids come from.
        json_schema_extra={"pattern": r"^run_[^:]*:[\s\S]+$"},
        description="The interrupt's id, as the run's interrupt outcome gave it.",
    )
    status: Literal["resolved", "cancelled"]
    payload: Any = Field(None, description='`resolved`: `{"approved": bool, "reason"?: str}`.')


_NAME = {k: v for k, v in name_schema("x").items() if k != "description"}
_FORWARDED_PROPS = {
    "properties": {
        "conversation_id": conversation_id_schema(),
        # The one selected-files model of every chat route (chat/selected_files.py).
        "selected_files": {
            "anyOf": [
                {
                    "type": "array",
                    "maxItems": MAX_SELECTED,
                    "items": {
                        "anyOf": [
                            _NAME,
                            {
                                "type": "object",
                                "required": ["file_name"],
                                "properties": {"file_name": _NAME},
                            },
                        ]
                    },
                },
                {"type": "null"},
            ]
        },
        "agent_id": {"type": "string", "maxLength": 253},
    }
}
# Without forwardedProps.conversation_id, the thread is the conversation.
_THREAD_IS_CONVERSATION = {
    "if": {
        "required": ["forwardedProps"],
        "properties": {"forwardedProps": {"type": "object", "required": ["conversation_id"]}},
    },
    "else": {"properties": {"threadId": conversation_id_schema()}},
}
# The rule on ``messages`` no JSON Schema keyword can state (none addresses an array's
# last item): in the field's description and the operation's 400.
LAST_MESSAGE_RULES = (
    "Without `resume` (absent, null or empty), the last message must be the user's, with "
    "text (`content` a non-blank string, or `text` parts): else 400 `invalid_messages`. "
    "With `resume`, its interrupts must all be of one run (else 400 `mixed_runs`)."
)


class RunAgentInput(BaseModel):
    """AG-UI's RunAgentInput (tools, context and state are accepted and unused)."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            **_THREAD_IS_CONVERSATION,
            "examples": [
                {
                    "threadId": "conv456",
                    "runId": "run-1",
                    "messages": [{"id": "m1", "role": "user", "content": "Sum column v."}],
                }
            ],
        },
    )

    threadId: str = Field(
        min_length=1,
        max_length=200,
        description="The conversation, unless `forwardedProps.conversation_id` names it.",
    )
    runId: str = Field(min_length=1, max_length=200)
    messages: list[dict[str, Any]] = Field(
        default_factory=list, max_length=500, description=f"The thread. {LAST_MESSAGE_RULES}"
    )
    forwardedProps: dict[str, Any] | None = Field(None, json_schema_extra=_FORWARDED_PROPS)
    resume: list[ResumeEntry] | None = Field(None, max_length=100)


def content_text(content: Any) -> str:
    if isinstance(content, str):
        return content.strip()
    if isinstance(content, list):
        return "".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") == "text"
        ).strip()
    return ""


def resume_answer(entry: ResumeEntry) -> Answer:
    if entry.status == "cancelled":
        return Answer(entry.interruptId, False, "cancelled by the user")
    payload = entry.payload
    if not (isinstance(payload, dict) and isinstance(payload.get("approved"), bool)):
        raise BadRequest(
            'a resolved tool_approval interrupt needs payload {"approved": true|false}',
            code="invalid_resume",
        )
    return Answer(entry.interruptId, payload["approved"], str(payload.get("reason") or ""))


def _respond(run: Run, translator: AgUiStream, after: int, keepalive: float):
    headers = {**SSE_HEADERS, "X-Run-Id": run.id}
    return translated(run, after, translator, encode_data, keepalive, headers)


@router.post(
    "/ag-ui",
    responses={
        200: {"content": {"text/event-stream": {}}},
        **rules_400(LAST_MESSAGE_RULES, *RUN_START_ERRORS),
    },
)
async def ag_ui(body: RunAgentInput, caller: CallerDep, services: ServicesDep) -> EventStream:
    """Run the agent for an AG-UI client (or resume it past an interrupt)."""
    keepalive = services.settings.chat_keepalive_seconds
    if body.resume:
        answers = [resume_answer(entry) for entry in body.resume]
        run, after, calls = await answer_approvals(caller, services, answers, "ag-ui")
        translator = AgUiStream(body.threadId, body.runId, run.id, announced=calls)
        return _respond(run, translator, after, keepalive)
    props = body.forwardedProps or {}
    conversation_id = props.get("conversation_id", body.threadId)
    agent_id = props.get("agent_id", "")
    if not (isinstance(conversation_id, str) and isinstance(agent_id, str)):
        raise BadRequest(
            "forwardedProps.conversation_id and agent_id must be strings",
            code="invalid_forwarded_props",
        )
    selected = parse_selected(
        props.get("selected_files"), ("body", "forwardedProps", "selected_files")
    )
    last = body.messages[-1] if body.messages else {}
    query = content_text(last.get("content")) if last.get("role") == "user" else ""
    if not query:
        raise BadRequest(
            "the last message must be the user's, with text (or answer the interrupt in resume)",
            code="invalid_messages",
        )
    history = [
        {"role": m["role"], "content": text}
        for m in body.messages[:-1]
        if m.get("role") in ("user", "assistant") and (text := content_text(m.get("content")))
    ]
    run = await start_turn(
        caller,
        services,
        query=query,
        history=history,
        conversation_id=conversation_id,
        selected_files=selected,
        agent_id=agent_id,
        protocol="ag-ui",
    )
    return _respond(run, AgUiStream(body.threadId, body.runId, run.id), 0, keepalive)
