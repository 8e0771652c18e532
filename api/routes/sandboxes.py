"""/api/v1/sandboxes — seed 002's ``/api/sandbox``: one sandbox per ``session_id``, driven
by actions.

A sandbox is a conversation of the caller's own session: ``session_id`` is its
conversation id (the seed's frontend makes one per chat sidebar). Another user's
sandbox can never be named — the same id in a different user's request is that user's
own conversation, which they did not start: 404.

``POST /sandboxes`` ``{action, session_id, …}`` answers ``{success, output, error, data}``:
- ``start`` (``data?``, ``readonly?``): ensures the session runs, opens the conversation,
  writes ``data`` (any JSON, when given) to ``data.json`` in its directory and remembers
  ``readonly`` (``.sandbox.json``, itself read-only while readonly holds) — ``data``:
  ``{session_id, path, readonly}``;
- ``exec`` (``command``): runs it with bash in the conversation's directory; under
  ``readonly`` the runtime denies any change to ``data.json`` (Landlock, see
  runtime/readonly.py). ``success`` is exit code 0; ``output`` stdout, ``error`` stderr,
  ``data`` ``{exit_code, stdout, stderr}``;
- ``read``: ``data`` is ``data.json`` parsed; not valid JSON → ``success: false`` with
  the parser's reason (HTTP 200);
- ``stop``: every process of the sandbox is killed — a command still running (its
  ``exec`` answers ``ConversationStopped``), the Python interpreter — its files stay;
- ``status``: ``data`` ``{session_id, status, readonly, has_data, path}``.
Errors of an action answer the same shape with ``success: false``, ``error`` the message
and ``data: {"code"}``, and the HTTP status of the error: 404 ``sandbox_not_found``
(never started, or not this user's), 404 ``data_not_found`` (``read`` without
``data.json``), 409 ``conversation_deleting``, 503 when the session cannot start or the
runtime cannot enforce ``readonly`` (``read_only_unavailable``, checked at ``start``). A
malformed request (unknown action, ``exec`` without ``command``, a bad ``session_id``)
is the API's usual 422/400 error body.
``GET /sandboxes?session_id=…`` is ``status``; without ``session_id`` it lists the
conversations of the caller's session while it runs — each one a sandbox id — as
``data: {session_status, sandboxes: [{session_id}]}`` (a session not running: none).

The store (``SANDBOX_WORKSPACE_STORE=s3``): ``start``, ``exec`` and ``read`` open the
conversation (``conversation_opened``: filled from the store the first time per runtime)
and ``start`` and ``exec`` end with ``conversation_written`` (the write-back), as every
route that writes does. The store keeps ``uploads/temparea`` and ``outputs/``, not the
conversation's top level, so in that mode ``data.json`` and the marker are mirrored into
``outputs/.sandbox/`` after ``start`` and each ``exec`` (readonly too: the mirror is
rewritten from the protected files, so what code did to it is undone) and put back from
there when the top level lacks them (a new runtime whose cache was filled from the store).
In ``local`` mode the files live on the session's volume and there is no mirror (it
would cost every ``exec`` a second command).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from sandbox_workspace.contract import ids
from sandbox_workspace.contract.errors import (
    ApiError,
    ConversationDeleting,
    JSONLineResponse,
    NotFoundError,
)
from sandbox_workspace.runtime.schemas import ExecuteRequest, ExecutionResult

from ..backends.base import ConversationPhase, Session, SessionStatus
from ..backends.store_backend import conversation_exists
from ..chat.table_agent import conversation_root, write_command
from ..chat.table_run import check_read_only_enforced
from ..deps import CallerDep, ServicesDep
from ..identity import Caller
from ..names import conversation_id_schema
from ..openapi import RETRY_AFTER_SECONDS, RETRY_HEADER, errors
from ..runtime_client import RuntimeClient

router = APIRouter(prefix="/api/v1", tags=["sandboxes"])
DATA_FILE = "data.json"
MARKER = ".sandbox.json"
MIRROR = "outputs/.sandbox"  # the store keeps outputs/, not the top level


class _Action(BaseModel):
    model_config = ConfigDict(strict=True)  # JSON types as documented: no "1" for 1

    session_id: str = Field(
        description="The sandbox: a conversation id of the caller's session.",
        json_schema_extra=conversation_id_schema(),
    )


class StartAction(_Action):
    action: Literal["start"]
    data: Any = Field(None, description="Written to data.json (any JSON), when given.")
    readonly: bool = Field(False, description="data.json may not be changed by exec.")


class ExecAction(_Action):
    action: Literal["exec"]
    command: str = Field(min_length=1, max_length=100_000, pattern=r"\S", description="Bash.")
    timeout: float = Field(120.0, gt=0, le=3600, description="Seconds before it is killed.")


class ReadAction(_Action):
    action: Literal["read"]


class StopAction(_Action):
    action: Literal["stop"]


class StatusAction(_Action):
    action: Literal["status"]


SandboxAction = Annotated[
    StartAction | ExecAction | ReadAction | StopAction | StatusAction,
    Field(discriminator="action"),
]


class SandboxAnswer(BaseModel):
    success: bool
    output: str = ""
    error: str | None = None
    data: Any = None


def _failure(e: ApiError) -> JSONLineResponse:
    body = SandboxAnswer(success=False, error=e.message, data={"code": e.code})
    retry = e.retry_after or (RETRY_AFTER_SECONDS if e.status in (429, 503) else None)
    headers = {"Retry-After": str(retry)} if retry else None
    return JSONLineResponse(body.model_dump(), status_code=e.status, headers=headers)


class _Sandbox:
    """One sandbox (conversation) of the caller, reached through the runtime client."""

    def __init__(self, services, caller: Caller, cid: str) -> None:
        self.services, self.caller = services, caller
        self.cid = ids.conversation_id_or_400(cid)
        self.session_id = caller.session_id
        # Only where a refill loses the top level (the store's cache) are its files
        # mirrored under outputs/ (see above); the file service says which.
        self.mirrored = not services.files.top_level_kept

    async def running(self) -> tuple[Session, RuntimeClient]:
        session = await self.services.sessions.ensure_running(self.caller, self.session_id)
        if (
            await self.services.backend.conversation_phase(session, self.cid)
            == ConversationPhase.DELETING
        ):
            raise ConversationDeleting(self.cid)
        assert session.endpoint is not None
        return session, RuntimeClient(self.services.http, session.endpoint)

    async def _bash(
        self, client: RuntimeClient, code: str, timeout: float = 60, read_only=()
    ) -> ExecutionResult:
        request = ExecuteRequest(
            language="bash", code=code, timeout=timeout, read_only=list(read_only)
        )
        return await client.execute(self.cid, request)

    async def _state(self, client: RuntimeClient) -> dict:
        """The sandbox's marker, or 404 when it was never started (by this user)."""
        info = await client.conversation_info(self.cid)
        if info.exists:  # (executing in a conversation that has none would create it)
            out = await self._bash(client, _state_command(self.mirrored))
            if out.exit_code == 0:
                first, _, rest = out.stdout.partition("\n")
                try:
                    state = json.loads(first)
                except ValueError:
                    state = {"readonly": True}  # unreadable: keep the stricter reading
                return {"readonly": bool(state.get("readonly")), "has_data": rest.strip() == "+"}
        raise self._not_started()

    def _not_started(self) -> NotFoundError:
        return NotFoundError(f"no sandbox '{self.cid}': start it first", code="sandbox_not_found")

    async def start(self, body: StartAction) -> SandboxAnswer:
        session, client = await self.running()
        if body.readonly:
            await check_read_only_enforced(client)
        await self.services.backend.conversation_opened(session, self.cid)
        marker = {"node": {"readonly": body.readonly}, "file": MARKER}
        code = write_command(marker)
        if "data" in body.model_fields_set:
            code += write_command({"node": body.data, "file": DATA_FILE})
        out = await self._bash(client, code + _MIRROR if self.mirrored else code)
        await self.services.backend.conversation_written(session, self.cid)
        if out.exit_code != 0:
            return SandboxAnswer(success=False, error=out.stderr or "could not write data.json")
        path = f"{conversation_root(session.workspace_path, self.cid)}/{DATA_FILE}"
        return SandboxAnswer(
            success=True,
            output=f"sandbox {self.cid} started",
            data={"session_id": self.cid, "path": path, "readonly": body.readonly},
        )

    async def exec(self, body: ExecAction) -> SandboxAnswer:
        session, client = await self.running()
        await self.services.backend.conversation_opened(session, self.cid)
        state = await self._state(client)
        read_only = [DATA_FILE, MARKER] if state["readonly"] else []
        out = await self._bash(client, body.command, body.timeout, read_only)
        if self.mirrored:
            await self._bash(client, _MIRROR, read_only=read_only)
        await self.services.backend.conversation_written(session, self.cid)
        error = out.stderr or (f"{out.error.name}: {out.error.value}" if out.error else None)
        return SandboxAnswer(
            success=out.exit_code == 0 and out.error is None,
            output=out.stdout,
            error=error,
            data={"exit_code": out.exit_code, "stdout": out.stdout, "stderr": out.stderr},
        )

    async def read(self, _: ReadAction) -> SandboxAnswer:
        session, client = await self.running()
        backend = self.services.backend
        if not await conversation_exists(backend, session, self.cid):
            # A read creates nothing (no resource for an id nobody started).
            raise self._not_started()
        await backend.conversation_opened(session, self.cid)
        state = await self._state(client)
        if not state["has_data"]:
            raise NotFoundError(f"sandbox '{self.cid}' has no data.json", code="data_not_found")
        out = await self._bash(client, f"cat -- {DATA_FILE}")
        if out.truncated:
            return SandboxAnswer(success=False, error="data.json is larger than the output limit")
        try:
            data = json.loads(out.stdout)
        except ValueError as e:
            return SandboxAnswer(success=False, output=out.stdout, error=f"not valid JSON: {e}")
        return SandboxAnswer(success=True, output=out.stdout, data=data)

    async def stop(self, _: StopAction) -> SandboxAnswer:
        _, client = await self.running()
        if not (await client.conversation_info(self.cid)).exists:
            raise NotFoundError(
                f"no sandbox '{self.cid}': start it first", code="sandbox_not_found"
            )
        # Kill first, check the marker after: the check runs a command, and code that
        # filled the process ceiling (a fork bomb) leaves no room for one until it is
        # stopped. A conversation that was never a sandbox still answers 404; the
        # processes stopped were the caller's own.
        await client.stop_processes(self.cid)
        await self._state(client)
        return SandboxAnswer(success=True, output=f"sandbox {self.cid} stopped; files kept")

    async def status(self, _: StatusAction | None = None) -> SandboxAnswer:
        session = await self.services.backend.get_session(self.session_id)
        if session is None or session.status != SessionStatus.RUNNING:
            status = "none" if session is None else str(session.status)
            raise NotFoundError(
                f"no sandbox '{self.cid}' running (session {status})", code="sandbox_not_found"
            )
        _, client = await self.running()
        state = await self._state(client)
        path = f"{conversation_root(session.workspace_path, self.cid)}/{DATA_FILE}"
        data = {"session_id": self.cid, "status": "running", "path": path, **state}
        return SandboxAnswer(success=True, output="running", data=data)


# s3 mode: the sandbox's files → their mirror under outputs/ (each present one copied, an
# absent one's mirror removed); and back (``_state_command``) when the top level lacks the
# marker. Code may have planted links there: a link is removed, never written through,
# and under ``readonly`` this call runs with the same read_only rules as the code's.
_MIRROR = f"""rc=$?
if [ ! -L outputs ] && mkdir -p outputs; then
  if [ -L {MIRROR} ] || {{ [ -e {MIRROR} ] && [ ! -d {MIRROR} ]; }}; then rm -f -- {MIRROR}; fi
  mkdir -p {MIRROR} && for f in {MARKER} {DATA_FILE}; do
    rm -rf -- {MIRROR}/"$f"
    if [ -f "$f" ]; then cp -- "$f" {MIRROR}/"$f"; fi
  done
fi
exit $rc
"""
_RESTORE = f"""if [ ! -f {MARKER} ] && [ -f {MIRROR}/{MARKER} ]; then
  for f in {MARKER} {DATA_FILE}; do
    [ -f {MIRROR}/"$f" ] && cp -- {MIRROR}/"$f" "$f"
  done
fi
"""
_STATE = f"""if [ -f {MARKER} ]; then
  cat -- {MARKER}; echo; [ -f {DATA_FILE} ] && echo +; true
else
  exit 3
fi"""


def _state_command(mirrored: bool) -> str:
    """The marker's content (and ``+`` when data.json exists); exit 3 without one. In s3
    mode the files come back from their mirror first; in local mode a file code put
    under outputs/.sandbox/ is just a file (it never makes a sandbox)."""
    return _RESTORE + _STATE if mirrored else _STATE


# An action's errors answer the seed's shape; a malformed request the usual error body.
_ERRORS: dict[int | str, dict] = {
    **errors(400),
    **{
        status: {
            "model": SandboxAnswer,
            "description": f"{what} (`success: false`)",
            **({"headers": RETRY_HEADER} if status == 503 else {}),
        }
        for status, what in (
            (404, "no such sandbox (never started, or not this user's), or no data.json"),
            (409, "the conversation is being deleted"),
            (503, "the session cannot start, or read-only cannot be enforced"),
        )
    },
}


@router.post("/sandboxes", responses=_ERRORS)
async def sandboxes(body: SandboxAction, caller: CallerDep, services: ServicesDep) -> SandboxAnswer:
    """Act on one of the caller's sandboxes (seed 002's `/api/sandbox`)."""
    sandbox = _Sandbox(services, caller, body.session_id)
    try:
        return await getattr(sandbox, body.action)(body)
    except ApiError as e:
        return _failure(e)


@router.get("/sandboxes", responses=_ERRORS)
async def sandbox_status(
    caller: CallerDep,
    services: ServicesDep,
    session_id: Annotated[
        str | None,
        Query(
            description="One sandbox; else the caller's list.",
            json_schema_extra=conversation_id_schema(),
        ),
    ] = None,
) -> SandboxAnswer:
    """One sandbox's status, or the caller's sandboxes while their session runs."""
    if session_id is not None:
        sandbox = _Sandbox(services, caller, session_id)
        try:
            return await sandbox.status()
        except ApiError as e:
            return _failure(e)
    session = await services.backend.get_session(caller.session_id)
    if session is None or session.status != SessionStatus.RUNNING or session.endpoint is None:
        status = "none" if session is None else str(session.status)
        return SandboxAnswer(success=True, data={"session_status": status, "sandboxes": []})
    client = RuntimeClient(services.http, session.endpoint)
    ids = await client.list_conversations()
    return SandboxAnswer(
        success=True,
        output=f"{len(ids)} sandbox(es)",
        data={"session_status": "running", "sandboxes": [{"session_id": c} for c in ids]},
    )
