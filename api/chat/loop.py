"""The ReAct loop of one run: think (model) → act (tools, after approval if required) →
observe, until the model answers or a limit is hit.

Contract: every run emits ``run_started`` first and ``done`` last, whatever happens in
between — a model failure, a sandbox that will not start, a cancel or the deadline each
emit ``error`` (with a code) before ``done``; a run never hangs. A successful run emits
``result`` with the answer, the files created or modified under outputs/ during the run,
and the presented files with their download URLs. While the session starts, ``status``
events keep the client informed. A tool under ``require_approval`` emits
``tool_approval`` and runs only once approved; a rejection (or no decision in time) is
told to the model, and the loop goes on.

Every completed step is handed to ``Run.checkpoint`` (a ``Progress``); with a replicated
run store another replica resumes from there (``run_agent(..., progress, resumed=True)``)
when the owner is gone. A run handed over (``Run.relay`` set) stops here without ending
its stream: the replica that carries it on emits the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from sandbox_workspace import tracing
from sandbox_workspace.contract.errors import ApiError
from sandbox_workspace.kube import KubeError
from sandbox_workspace.runtime.schemas import ChangedFile, MarksReport, OutputList, UploadedFile

from ..backends import kube_errors
from ..backends.base import Session
from ..runtime_client import RuntimeClient
from .context import (
    build_messages,
    history_with_context,
    system_prompt,
    temparea,
    workspace_context_message,
)
from .conversation import RunConversation
from .llm import Completion, LlmClient, LlmError
from .progress import Progress
from .run import Run, RunFailed
from .spec import RunSpec
from .table_run import finish_table, prepare_table, table_read_only, table_tools_root
from .tools import TOOL_SPECS, PresentedFile, SandboxTools

log = logging.getLogger(__name__)
_STATUS_EVERY = 2.0


async def run_agent(
    run: Run,
    spec: RunSpec,
    conversation: RunConversation,
    llm: LlmClient,
    http,
    progress: Progress | None = None,
    *,
    resumed: bool = False,
) -> None:
    if not resumed:
        run.emit(
            "run_started",
            {
                "run_id": run.id,
                "session_id": run.session_id,
                "conversation_id": run.conversation_id,
            },
        )
    heartbeat: asyncio.Task | None = None

    def started(session: Session) -> None:
        nonlocal heartbeat  # from the moment the session exists until the run ends
        heartbeat = asyncio.create_task(_heartbeat(conversation))

    try:
        async with asyncio.timeout(spec.deadline_seconds):
            with tracing.span("chat.run", _run_attributes(run)):
                await _loop(run, spec, conversation, llm, http, started, progress)
    except TimeoutError:
        run.emit(
            "error",
            {
                "code": "deadline_exceeded",
                "message": f"the run exceeded its {spec.deadline_seconds:g}s limit",
            },
        )
    except asyncio.CancelledError:
        if run.relay is not None:  # handed over: another replica carries the stream on
            raise
        code, message = run.cancelled_because
        run.emit("error", {"code": code, "message": message})
    except RunFailed as e:
        run.emit("error", {"code": e.code, "message": e.message})
    except LlmError as e:
        run.emit("error", {"code": e.code, "message": str(e)})
    except ApiError as e:
        run.emit("error", {"code": e.code, "message": e.message})
    except KubeError as e:  # e.g. its session deleted meanwhile: said as the API says it
        error = kube_errors.api_error(e)
        run.emit("error", {"code": error.code, "message": error.message})
    except Exception as e:  # a run must end with error + done, never hang or vanish
        log.exception("run failed", extra={"run_id": run.id})
        run.emit("error", {"code": "internal_error", "message": f"{e.__class__.__name__}: {e}"})
    finally:
        if heartbeat is not None:
            heartbeat.cancel()
        if run.relay is None:
            run.emit("done", {"run_id": run.id})
            run.finish()


def _run_attributes(run: Run) -> dict[str, str]:
    return {
        "run_id": run.id,
        "session_id": run.session_id,
        "conversation_id": run.conversation_id,
    }


async def _heartbeat(conversation: RunConversation) -> None:
    """Open runs (and pending approvals) count as session activity."""
    while True:
        with contextlib.suppress(Exception):
            await conversation.record_activity()
        await asyncio.sleep(30)


async def _ensure(run: Run, conversation: RunConversation) -> Session:
    run.emit("status", {"stage": "session", "message": "starting the sandbox session"})
    task = asyncio.ensure_future(conversation.ensure_session())
    started = time.monotonic()
    while True:
        done, _ = await asyncio.wait({task}, timeout=_STATUS_EVERY)
        if done:
            session = task.result()
            run.emit("status", {"stage": "session_ready", "message": "sandbox session running"})
            return session
        run.emit(
            "status",
            {
                "stage": "session",
                "message": "still starting the sandbox "
                f"session ({time.monotonic() - started:.0f}s)",
            },
        )


def _resolve_selected(names: list[str], uploads: list[UploadedFile]) -> list[UploadedFile]:
    by_name = {f.name: f for f in uploads}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise RunFailed(
            "file_not_found",
            f"selected file(s) {', '.join(missing)} are not uploads of this conversation",
        )
    return [by_name[n] for n in names]


async def _loop(
    run: Run,
    spec: RunSpec,
    conversation: RunConversation,
    llm: LlmClient,
    http,
    started: Callable[[Session], None],
    progress: Progress | None = None,
) -> None:
    session = await _ensure(run, conversation)
    started(session)
    assert session.endpoint is not None
    client = RuntimeClient(http, session.endpoint)
    cid = run.conversation_id
    tools = SandboxTools(
        client,
        session_id=run.session_id,
        conversation_id=cid,
        workspace_path=session.workspace_path,
        exec_timeout=spec.tool_timeout,
        root=table_tools_root(spec.table, session.workspace_path, cid),
        read_only=table_read_only(spec.table),
    )
    if progress is None:
        uploads = (await client.list_uploads(cid)).files
        selected = _resolve_selected(spec.selected_files, uploads)
        system = system_prompt(session.workspace_path, cid, run.session_id, uploads)
        if spec.table is not None:
            system += "\n\n" + await prepare_table(run, tools, spec.table)
        area = temparea(session.workspace_path, cid)

        def context_of(names: list[str]) -> str | None:
            # An earlier turn's file may be gone since: its path is where it was.
            files = [(n, area + n) for n in names]
            return workspace_context_message(session.workspace_path, cid, run.session_id, files)

        messages = build_messages(
            system,
            history_with_context(spec.history, context_of),
            workspace_context_message(
                session.workspace_path, cid, run.session_id, [(f.name, f.path) for f in selected]
            ),
            spec.query,
        )
        progress = Progress(messages=messages)
    else:  # carried on from another replica's last completed step
        tools.presented = [PresentedFile(**p) for p in progress.presented]
    messages = progress.messages
    # Only tools change outputs/, so the "before" listing waits for the first tool call:
    # a run that only talks costs the runtime one call (the uploads), not three.
    before = None if progress.before is None else OutputList.model_validate(progress.before)
    offered = [TOOL_SPECS[n] for n, p in spec.policies.items() if p != "deny"]
    for iteration in range(progress.iteration, spec.max_iterations + 1):
        if not progress.calls:  # a model turn (resumed runs may still owe tool calls)
            progress.iteration = iteration
            run.checkpoint(progress)
            run.emit("status", {"stage": "thinking", "iteration": iteration})
            completion: Completion | None = None
            async for item in llm.stream(messages, offered):
                if type(item) is str:
                    run.emit("text", {"delta": item})
                else:
                    completion = item
            assert completion is not None
            messages.append(completion.as_message())
            if not completion.tool_calls:
                files = [] if before is None else _changed(before, await _outputs(client, cid))
                await _record_marks(client, cid, files, [p.path for p in tools.presented])
                await conversation.after_write()
                outcome = {"success": True}
                if spec.table is not None:
                    outcome = await finish_table(run, tools, spec.table, conversation.table_writer)
                run.emit(
                    "result",
                    {
                        **outcome,
                        "answer": completion.content,
                        "files": files,
                        "presented": [p.__dict__ for p in tools.presented],
                        "iterations": iteration,
                    },
                )
                return
            progress.calls = [
                {"id": c.id, "name": c.name, "arguments": c.arguments}
                for c in completion.tool_calls
            ]
            run.checkpoint(progress)
        if before is None:
            before = await _outputs(client, cid)
            progress.before = before.model_dump(mode="json")
        while progress.calls:
            call = progress.calls[0]
            output = await _act(
                run,
                spec,
                conversation,
                tools,
                call["id"],
                call["name"],
                call["arguments"],
                progress,
            )
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})
            progress.calls.pop(0)
            progress.in_flight = progress.approval = None
            progress.presented = [p.__dict__ for p in tools.presented]
            run.checkpoint(progress)
    raise RunFailed("max_iterations", f"no answer after {spec.max_iterations} iterations")


async def _act(
    run: Run,
    spec: RunSpec,
    conversation: RunConversation,
    tools: SandboxTools,
    call_id: str,
    name: str,
    arguments: str,
    progress: Progress | None = None,
) -> str:
    progress = progress or Progress()
    policy = spec.policies.get(name)
    if policy == "deny" or policy is None:
        reason = "denied by policy" if policy == "deny" else "unknown tool"
        run.emit(
            "tool_end",
            {
                "tool_call_id": call_id,
                "name": name,
                "ok": False,
                "decision": "denied",
                "output": reason,
            },
        )
        return f"The tool call was not run: {reason}."
    if policy == "require_approval":
        run.open_approval(call_id, name)  # before the event: the client may answer at once
        if progress.approval == call_id and progress.approval_deadline is not None:
            # Announced before the run changed replicas: the same approval, same deadline.
            timeout = max(0.0, progress.approval_deadline - time.time())
        else:
            timeout = spec.approval_timeout
            progress.approval, progress.approval_deadline = call_id, time.time() + timeout
            run.checkpoint(progress)
            run.emit(
                "tool_approval",
                {
                    "tool_call_id": call_id,
                    "name": name,
                    "arguments": arguments,
                    "timeout_seconds": spec.approval_timeout,
                },
            )
        with contextlib.suppress(Exception):  # a pending approval is activity, now
            await conversation.record_activity()
        decision = await run.decision(call_id, timeout)
        if not decision.approved:
            why = decision.reason or "no reason given"
            run.emit(
                "tool_end",
                {
                    "tool_call_id": call_id,
                    "name": name,
                    "ok": False,
                    "decision": "timeout" if decision.by_timeout else "rejected",
                    "output": why,
                },
            )
            return f"The user rejected this tool call ({why}). Do not retry it unchanged."
    await conversation.before_tool()
    progress.in_flight = call_id  # from here on, this step must not be repeated elsewhere
    run.checkpoint(progress)
    run.emit("tool_start", {"tool_call_id": call_id, "name": name, "arguments": arguments})
    with tracing.span("chat.tool", {"gen_ai.tool.name": name, "gen_ai.tool.call.id": call_id}):
        outcome = await tools.call(name, arguments)
    await conversation.after_write()
    run.emit(
        "tool_end",
        {
            "tool_call_id": call_id,
            "name": name,
            "ok": outcome.ok,
            "output": outcome.output,
            "duration_ms": outcome.duration_ms,
            **({"data": outcome.data} if outcome.data else {}),
        },
    )
    return outcome.output


async def _record_marks(
    client: RuntimeClient, cid: str, files: list[dict], presented: list[str]
) -> None:
    """Keep what the run modified and presented with the files (the runtime's marks), so
    every replica and a restarted API answer ``source``/``is_presented`` alike. A view
    for the frontend: failing to record it never fails the run."""
    if not files and not presented:
        return
    report = MarksReport(
        changed=[ChangedFile(path=f["path"], status=f["status"]) for f in files],
        presented=presented,
    )
    try:
        await client.record_marks(cid, report)
    except ApiError as e:
        log.warning(
            "could not record the run's file marks",
            extra={"conversation_id": cid, "error": str(e)},
        )


async def _outputs(client: RuntimeClient, cid: str) -> OutputList:
    return await client.list_outputs(cid)


def _changed(before: OutputList, after: OutputList) -> list[dict]:
    seen = {f.relative_path: (f.size, f.modified_at) for f in before.files}
    changed = []
    for f in after.files:
        old = seen.get(f.relative_path)
        if old != (f.size, f.modified_at):
            changed.append(
                {
                    "path": f.path,
                    "relative_path": f.relative_path,
                    "size": f.size,
                    "status": "created" if old is None else "modified",
                }
            )
    return changed
