"""What /ui/chat and /ag-ui share: a turn either starts a run from the protocol's
messages, or answers the approvals the run waits on and continues it.

Contract: ``start_turn`` validates like ``POST /chat`` (the same ``ChatRequest``; a
malformed turn is a 422 naming the field) and starts the run on the one engine;
``answer_approvals`` decides each answered call on its run (only the caller's runs: any
other is 404; a call already decided or timed out is 409) and returns the run with the
event id after which the continuation streams, and the calls it answered. The run may be
held by any replica: it is found, read and decided through the run store
(``services.runs.find`` / ``decide``, ``run_events.events_of``), so every replica answers
alike.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from sandbox_workspace.contract.errors import BadRequest

from ..identity import Caller
from .request import ChatRequest
from .run import Run
from .run_events import approval_event_id, events_of, parse_approval_id
from .selected_files import SelectedFileRef
from .service import start_run

MAX_APPROVALS = 100
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Answer:
    approval_id: str
    approved: bool
    reason: str = ""


async def start_turn(
    caller: Caller,
    services,
    *,
    query: str,
    history: list[dict],
    conversation_id: str,
    selected_files: list[SelectedFileRef],
    agent_id: str = "",
    protocol: str,
) -> Run:
    try:
        body = ChatRequest(
            query=query,
            history=history,
            conversation_id=conversation_id,
            selected_files=selected_files,
            agent_id=agent_id,
        )
    except ValidationError as e:
        raise RequestValidationError(e.errors()) from e
    run = await start_run(body, caller, services)
    log.info(
        "run started",
        extra={"run_id": run.id, "conversation_id": run.conversation_id, "protocol": protocol},
    )
    return run


async def answer_approvals(
    caller: Caller, services, answers: list[Answer], protocol: str
) -> tuple[Run, int, set[str]]:
    if not answers:
        raise BadRequest("no approval to answer", code="no_approval")
    if len(answers) > MAX_APPROVALS:
        raise BadRequest(f"at most {MAX_APPROVALS} approvals per request", code="too_many")
    targets = [(a, *parse_approval_id(a.approval_id)) for a in answers]
    run_ids = {run_id for _, run_id, _ in targets}
    if len(run_ids) > 1:
        raise BadRequest(
            "the approvals answered belong to different runs; answer one run's at a time",
            code="mixed_runs",
        )
    run = await services.runs.find(run_ids.pop(), caller.session_id)
    events = await events_of(services.runs.store, run)
    positions = [approval_event_id(run.id, events, call_id) for _, _, call_id in targets]
    for answer, _, call_id in targets:
        await services.runs.decide(run, call_id, answer.approved, answer.reason)
        log.info(
            "tool call decided",
            extra={
                "run_id": run.id,
                "tool_call_id": call_id,
                "approved": answer.approved,
                "protocol": protocol,
            },
        )
    return run, max(positions), {call_id for _, _, call_id in targets}
