"""The runtime's HTTP interface: the only server inside a sandbox pod.

Contract: every route but ``/healthz`` requires ``Authorization: Bearer <token>``; routes
are thin — names are checked and files touched only through ``Workspace``; bodies are
streamed both ways; errors use the shared ``{"error": {...}}`` shape.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import json
import os
import urllib.parse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

import anyio
from fastapi import APIRouter, Depends, FastAPI, Header, Query, Request
from fastapi.responses import Response, StreamingResponse

from sandbox_workspace.contract.errors import (
    ApiError,
    Conflict,
    Unauthorized,
    install_error_handlers,
)

from . import egress
from .activity import Activity
from .claim import Claimed, ClaimHeader, ClaimRequest, ClaimState
from .confinement import Confinement
from .copies import Copies
from .download_headers import download_headers
from .executor import Executor
from .output import ResultCaps
from .output_batch import read_outputs
from .outputs import delete_output, list_outputs, open_output, write_output
from .processes import Processes, ProcessInput, ProcessSignal, ProcessStart
from .raw_upload import FEATURE as RAW_UPLOAD
from .raw_upload import receive_raw_upload
from .schemas import (
    DEFAULT_OUTPUTS_LISTED,
    KEEPALIVE_HEADER,
    MAX_OUTPUTS_LISTED,
    PROCESS_KEEPALIVE_SECONDS,
    ConversationDeleted,
    ConversationIds,
    ConversationInfo,
    ExecuteRequest,
    ExecutionResult,
    ForkRequest,
    Health,
    KernelRestarted,
    Marks,
    MarksReport,
    OutputBatchRequest,
    OutputFile,
    OutputList,
    ProcessesStopped,
    RuntimeStats,
    SnapshotRequest,
    UploadList,
    UploadResult,
)
from .settings import RuntimeSettings
from .spawner import SpawnFailed
from .uploads import (
    ConversationLocks,
    ConversationQuota,
    UploadLimits,
    UploadTarget,
    receive_upload,
)
from .warm_routes import warm
from .workspace import Workspace

_READ_CHUNK = 1024 * 1024
PROCESS_STREAM_HEADERS = {KEEPALIVE_HEADER: str(PROCESS_KEEPALIVE_SECONDS)}


class RuntimeState:
    """Everything a runtime process holds; one per app, never module-level."""

    def __init__(self, settings: RuntimeSettings) -> None:
        self.settings = settings
        claim_key = settings.claim_key.get_secret_value() if settings.claim_key else None
        self.claim = ClaimState(settings.resolved_token(), claim_key)
        self.workspace = Workspace(settings.root, settings.visible_root)
        self.copies = Copies(self.workspace)
        self.limits = UploadLimits(
            max_file_size=settings.max_file_size_bytes,
            max_file_count=settings.max_file_count,
            allowed_types=tuple(settings.allowed_file_types),
        )
        limits = settings.limits()
        # Uploads count against the quota code is held to: the same directories.
        self.quota = (
            ConversationQuota(
                limits.conversation_size,
                lambda cid: [self.workspace.real_path(cid), self.executor.scratch(cid)],
            )
            if limits
            else None
        )
        self.locks = ConversationLocks()
        self.deletions = ConversationLocks()
        self.activity = Activity()
        self.executor = Executor(
            self.workspace,
            self.activity,
            output_cap=settings.output_cap_bytes,
            max_concurrent=settings.max_concurrent_executions,
            kernel_idle_seconds=settings.kernel_idle_seconds,
            limits=limits,
            session_memory=settings.session_memory,
            result_caps=ResultCaps(settings.max_results, settings.result_cap_bytes),
            confinement=Confinement(
                max_processes=settings.max_processes,
                mode=settings.confinement,
                network=settings.network,
                min_abi=settings.confinement_min_abi,
                connect_port=settings.connect_port(),
            ),
            extra_env={
                **settings.code_env,
                **(
                    egress.code_environment(settings.egress_relay_port)
                    if settings.network == "proxy"
                    else {}
                ),
            },
        )
        self.processes = Processes(
            self.executor,
            max_per_conversation=settings.max_background_processes,
            buffer_bytes=settings.process_buffer_bytes,
            max_lifetime=settings.max_process_seconds,
        )


def _state(request: Request) -> RuntimeState:
    return request.app.state.runtime


# ``async def`` dependencies: FastAPI would run plain ``def`` ones in a worker thread,
# two thread hand-offs per request for a few microseconds of work.
async def _authenticated(
    request: Request, authorization: Annotated[str | None, Header()] = None
) -> RuntimeState:
    """Token check only: for the idle reaper's polls, which must not count as activity."""
    state = _state(request)
    token = state.claim.token
    if token is None:
        raise Unauthorized("this pooled runtime is not claimed yet")
    scheme, _, presented = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        presented.strip().encode(), token.encode()
    ):
        raise Unauthorized("missing or invalid bearer token")
    return state


async def _authorized(state: Annotated[RuntimeState, Depends(_authenticated)]) -> RuntimeState:
    """Token check, and the request counts as activity (idle detection)."""
    state.activity.touch()
    return state


State = Annotated[RuntimeState, Depends(_authorized)]
Observer = Annotated[RuntimeState, Depends(_authenticated)]
router = APIRouter(prefix="/v1")


@router.get("/stats")
async def stats(state: Observer) -> RuntimeStats:
    """Liveness plus the activity figures the idle reaper needs."""
    return RuntimeStats(
        workspace_path=state.workspace.visible_root,
        started_at=state.activity.started_at,
        last_activity_at=state.activity.last_activity_at,
        active_operations=state.activity.active,
        conversations=len(state.workspace.conversation_ids()),
        confinement=state.executor.confinement.report(),
    )


@router.get("/conversations")
async def list_conversations(state: State, holding: str | None = None) -> ConversationIds:
    """The conversations with a directory; with ``holding``, those whose temparea holds an
    upload of that name (how the API resolves a download by bare name)."""
    ws = state.workspace

    def find() -> list[str]:
        ids = ws.conversation_ids()
        if holding is None:
            return ids
        name = ws.check_file_name(holding)
        return [cid for cid in ids if ws.has_upload(cid, name)]

    return ConversationIds(conversations=await anyio.to_thread.run_sync(find))


@router.put("/conversations/{conversation_id}")
async def ensure_conversation(conversation_id: str, state: State) -> ConversationInfo:
    """Create the conversation's directories if missing — on the loop, so no deletion
    starts between the deletion gate's check and the directories — then count its files
    in a thread: a conversation of 20,000 files took 191 ms to count, every other request
    of the runtime (other conversations' too) waiting meanwhile."""
    cid = state.workspace.ensure_layout(conversation_id)
    return await anyio.to_thread.run_sync(state.workspace.conversation_info, cid)


@router.get("/conversations/{conversation_id}")
async def conversation_info(conversation_id: str, state: State) -> ConversationInfo:
    """Whether the conversation directory exists, with its file count and bytes."""
    return await anyio.to_thread.run_sync(state.workspace.conversation_info, conversation_id)


@router.delete("/conversations/{conversation_id}")
async def delete_conversation(conversation_id: str, state: State) -> ConversationDeleted:
    """Delete the conversation's files and state; idempotent, answers once verified gone."""
    ws = state.workspace
    with state.activity.track(), ws.deleting(conversation_id) as cid:
        # One deletion of a conversation at a time; writes are refused (409) meanwhile.
        async with state.deletions.get(cid):
            # Its processes go first: nothing may keep writing into what we delete.
            await state.executor.stop_conversation(cid)
            await anyio.to_thread.run_sync(state.copies.drop, cid)  # its snapshots too
            return await anyio.to_thread.run_sync(ws.delete_conversation, cid)


# -- snapshots and forks (``copies``: local store mode) ---------------------------------


def _public(doc: dict) -> dict:
    return {k: v for k, v in doc.items() if k != "uploads"}


@router.post("/conversations/{conversation_id}/snapshots", status_code=201)
async def take_snapshot(conversation_id: str, body: SnapshotRequest, state: State) -> dict:
    """Copy the conversation's files as they are now (reflinks where possible)."""
    with state.activity.track():
        async with state.locks.get(conversation_id):
            doc = await anyio.to_thread.run_sync(
                state.copies.snapshot, conversation_id, body.snapshot_id, body.name
            )
    return _public(doc)


@router.get("/conversations/{conversation_id}/snapshots")
async def list_snapshots(conversation_id: str, state: State) -> dict:
    docs = await anyio.to_thread.run_sync(state.copies.list, conversation_id)
    return {"snapshots": [_public(d) for d in docs]}


@router.get("/conversations/{conversation_id}/snapshots/{snapshot_id}")
async def get_snapshot(conversation_id: str, snapshot_id: str, state: State) -> dict:
    return _public(await anyio.to_thread.run_sync(state.copies.get, conversation_id, snapshot_id))


@router.delete("/conversations/{conversation_id}/snapshots/{snapshot_id}", status_code=204)
async def delete_snapshot(conversation_id: str, snapshot_id: str, state: State) -> None:
    await anyio.to_thread.run_sync(state.copies.delete, conversation_id, snapshot_id)


@router.post("/conversations/{conversation_id}/snapshots/{snapshot_id}/restore")
async def restore_snapshot(conversation_id: str, snapshot_id: str, state: State) -> dict:
    """The conversation's files become the snapshot's; its processes (the kernel
    included) are stopped first — their state is not in a snapshot."""
    ws = state.workspace
    await anyio.to_thread.run_sync(state.copies.get, conversation_id, snapshot_id)  # 404
    with state.activity.track(), ws.deleting(conversation_id) as cid:
        async with state.deletions.get(cid):
            await state.executor.stop_conversation(cid)
            doc = await anyio.to_thread.run_sync(state.copies.restore, cid, snapshot_id)
    return _public(doc)


@router.post("/conversations/{conversation_id}/fork", status_code=201)
async def fork_conversation(conversation_id: str, body: ForkRequest, state: State) -> dict:
    """Fill the empty conversation ``body.conversation_id`` with copies of this one's
    files (or of one of its snapshots)."""
    with state.activity.track():
        async with state.locks.get(body.conversation_id):
            copied = await anyio.to_thread.run_sync(
                state.copies.fork, conversation_id, body.conversation_id, body.snapshot_id
            )
    return {"conversation_id": body.conversation_id, "file_count": copied.files,
            "bytes": copied.bytes, "reflinked": copied.reflinked}  # fmt: skip


@router.get("/snapshots/bytes")
async def snapshot_bytes(state: State) -> dict:
    """What every snapshot of this workspace holds (the per-user stored-bytes quota)."""
    return {"bytes": await anyio.to_thread.run_sync(state.copies.stored_bytes)}


@router.post("/uploads", status_code=201)
async def upload(
    request: Request,
    state: State,
    conversation_id: Annotated[str | None, Query()] = None,
    subdir: Annotated[str | None, Query()] = None,
    name: Annotated[str | None, Query()] = None,
) -> UploadResult:
    """Stream a multipart upload (`file`, `conversation_id`, `subdir`) into temparea
    (named `name` when given, else by the file part's filename)."""
    with state.activity.track():
        target = _target(state, conversation_id, subdir, name)
        return await receive_upload(
            request.stream(), request.headers.get("content-type", ""), target
        )


@router.post("/uploads/raw", status_code=201)
async def upload_raw(
    request: Request,
    state: State,
    filename: Annotated[str | None, Query()] = None,
    conversation_id: Annotated[str | None, Query()] = None,
    subdir: Annotated[str | None, Query()] = None,
    name: Annotated[str | None, Query()] = None,
) -> UploadResult:
    """Stream a raw upload (the file's bytes, then the form's fields and the file's digest
    in a trailer: ``raw_upload``) into temparea — the API's way once it parsed the form."""
    with state.activity.track():
        target = _target(state, conversation_id, subdir, name)
        return await receive_raw_upload(request.stream(), target, filename=filename)


def _target(state, conversation_id: str | None, subdir: str | None, name: str | None):
    """Where an upload request goes: this runtime's workspace, limits, locks and quota."""
    return UploadTarget(
        state.workspace, state.limits, state.locks, state.quota, conversation_id, subdir, name
    )


@router.get("/conversations/{conversation_id}/uploads")
async def list_uploads(conversation_id: str, state: State) -> UploadList:
    """The user's uploads in this conversation (never files that code wrote)."""
    ws = state.workspace
    cid = ws.check_conversation_id(conversation_id)
    return UploadList(
        conversation_id=cid,
        path=ws.visible(cid, "uploads", "temparea"),
        files=ws.list_uploads(cid),
    )


@router.get("/conversations/{conversation_id}/uploads/{name}")
async def download(conversation_id: str, name: str, state: State) -> StreamingResponse:
    """Stream one uploaded file with its type and a Unicode-safe Content-Disposition."""
    opened = state.workspace.open_upload(conversation_id, name)
    headers = {
        "Content-Length": str(opened.size),
        **download_headers(opened.info.name),
        "X-Sandbox-Path": urllib.parse.quote(opened.info.path),
    }
    if not opened.info.modified:  # after code changed the bytes, the digest would lie
        headers["X-Content-SHA256"] = opened.info.sha256
    return StreamingResponse(
        _read_fd(opened.fd, state.activity), media_type=opened.info.mime_type, headers=headers
    )


@router.get("/conversations/{conversation_id}/outputs")
async def outputs(
    conversation_id: str,
    state: State,
    limit: Annotated[int, Query(ge=1, le=MAX_OUTPUTS_LISTED)] = DEFAULT_OUTPUTS_LISTED,
) -> OutputList:
    """Files code wrote under outputs/ (for result events and present_file), at most
    ``limit`` of them (``truncated`` says when there are more)."""
    return await anyio.to_thread.run_sync(list_outputs, state.workspace, conversation_id, limit)


@router.post("/conversations/{conversation_id}/outputs-batch")
async def read_output_batch(
    conversation_id: str, body: OutputBatchRequest, state: State
) -> Response:
    """Many small outputs in one answer, framed (``output_batch``): the write-back's read
    of thousands of small files in a few requests."""

    def frames() -> bytes:
        return b"".join(read_outputs(state.workspace, cid, body.paths, body.max_bytes))

    cid = state.workspace.check_conversation_id(conversation_id)
    with state.activity.track():
        data = await anyio.to_thread.run_sync(frames)
    return Response(data, media_type="application/octet-stream")


@router.get("/conversations/{conversation_id}/outputs/{relative_path:path}")
async def download_output(
    conversation_id: str, relative_path: str, state: State
) -> StreamingResponse:
    """Stream one output file (path below outputs/, no symlink followed)."""
    opened = open_output(state.workspace, conversation_id, relative_path)
    headers = {
        "Content-Length": str(opened.size),
        **download_headers(opened.name),
        "X-Sandbox-Path": urllib.parse.quote(opened.path),
    }
    return StreamingResponse(
        _read_fd(opened.fd, state.activity), media_type=opened.mime_type, headers=headers
    )


@router.put("/conversations/{conversation_id}/outputs/{relative_path:path}")
async def write_output_file(
    conversation_id: str, relative_path: str, request: Request, state: State
) -> OutputFile:
    """Write the request body at ``outputs/{relative_path}`` (the store's fill of a new
    pod): path-checked like uploads, staged then renamed in whole, no link followed."""
    with state.activity.track():
        async with state.locks.get(state.workspace.check_conversation_id(conversation_id)):
            return await write_output(
                state.workspace,
                conversation_id,
                relative_path,
                request.stream(),
                state.limits.max_file_size,
            )


@router.delete("/conversations/{conversation_id}/outputs/{relative_path:path}", status_code=204)
async def delete_output_file(conversation_id: str, relative_path: str, state: State) -> None:
    """Delete one output file (the store's delete by file_id; no link followed)."""
    with state.activity.track():
        async with state.locks.get(state.workspace.check_conversation_id(conversation_id)):
            delete_output(state.workspace, conversation_id, relative_path)


@router.post("/conversations/{conversation_id}/marks")
async def record_marks(conversation_id: str, body: MarksReport, state: State) -> Marks:
    """Note what a run modified under outputs/ and presented (listings answer from it)."""
    return state.workspace.record_marks(conversation_id, body)


@router.delete("/conversations/{conversation_id}/uploads/{name}", status_code=204)
async def delete_upload(conversation_id: str, name: str, state: State) -> None:
    """Delete one uploaded file."""
    state.workspace.delete_upload(conversation_id, name)


@router.post("/conversations/{conversation_id}/execute", response_model=ExecutionResult)
async def execute(
    conversation_id: str,
    body: ExecuteRequest,
    state: State,
    stream: Annotated[bool, Query()] = False,
):
    """Run code; with `stream=true` answer NDJSON events (stdout/stderr/result, then done)."""
    if not stream:
        return await state.executor.execute(conversation_id, body)
    state.workspace.check_conversation_id(conversation_id)
    return StreamingResponse(
        _stream_execution(state, conversation_id, body), media_type="application/x-ndjson"
    )


async def _stream_execution(
    state: RuntimeState, cid: str, body: ExecuteRequest
) -> AsyncIterator[bytes]:
    queue: asyncio.Queue[dict] = asyncio.Queue()
    task = asyncio.create_task(state.executor.execute(cid, body, on_event=queue.put_nowait))
    task.add_done_callback(lambda _: queue.put_nowait({"type": "_end"}))
    while (event := await queue.get())["type"] != "_end":
        yield _ndjson(event)
    try:
        result = task.result()
    except ApiError as e:
        yield _ndjson({"type": "error", "error": {"code": e.code, "message": e.message}})
        return
    yield _ndjson({"type": "done", "result": result.model_dump(mode="json")})


def _ndjson(event: dict) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode() + b"\n"


@router.post("/conversations/{conversation_id}/kernel/restart")
async def restart_kernel(conversation_id: str, state: State) -> KernelRestarted:
    """Stop the conversation's Python interpreter; the next call starts a fresh one."""
    restarted = await state.executor.restart(conversation_id)
    return KernelRestarted(conversation_id=conversation_id, restarted=restarted)


@router.post("/conversations/{conversation_id}/processes/stop")
async def stop_processes(conversation_id: str, state: State) -> ProcessesStopped:
    """Kill every process of the conversation (interpreter, bash calls, daemons) and drop
    its scratch directory; its files stay (seed 002's sandbox ``stop``)."""
    with state.activity.track():
        await state.executor.stop_conversation(conversation_id)
    return ProcessesStopped(conversation_id=conversation_id)


@router.post("/conversations/{conversation_id}/processes")
async def start_process(conversation_id: str, body: ProcessStart, state: State):
    """Start ``bash -c code`` that outlives this request; NDJSON: ``start`` (its pid), then
    its output (``data`` base64) and ``end``. Disconnecting does not stop it."""
    cid = state.workspace.check_conversation_id(conversation_id)  # NFC, as the others
    proc = await state.processes.start(cid, body.code, timeout=body.timeout, stdin=body.stdin)
    return StreamingResponse(
        _process_stream(state, proc, {"type": "start", "pid": proc.pid}),
        media_type="application/x-ndjson",
        headers=PROCESS_STREAM_HEADERS,
    )


@router.get("/conversations/{conversation_id}/processes")
async def list_processes(conversation_id: str, state: State) -> dict:
    """The conversation's background processes (ended ones for a while, not running)."""
    cid = state.workspace.check_conversation_id(conversation_id)
    return {"processes": state.processes.listing(cid)}


@router.get("/conversations/{conversation_id}/processes/{pid}/events")
async def process_events(conversation_id: str, pid: int, state: State):
    """A running process's buffered and new output, up to its ``end`` (NDJSON)."""
    proc = state.processes.get(state.workspace.check_conversation_id(conversation_id), pid)
    return StreamingResponse(
        _process_stream(state, proc, {"type": "start", "pid": proc.pid}),
        media_type="application/x-ndjson",
        headers=PROCESS_STREAM_HEADERS,
    )


@router.post("/conversations/{conversation_id}/processes/{pid}/input", status_code=204)
async def process_input(conversation_id: str, pid: int, body: ProcessInput, state: State) -> None:
    """Write to the process's stdin (``data`` base64); ``close`` ends its stdin."""
    proc = state.processes.get(state.workspace.check_conversation_id(conversation_id), pid)
    if body.data:
        await state.processes.write(proc, body.decoded())
    if body.close:
        proc.pipes.close_stdin()


@router.post("/conversations/{conversation_id}/processes/{pid}/signal", status_code=204)
async def process_signal(conversation_id: str, pid: int, body: ProcessSignal, state: State) -> None:
    """SIGTERM/SIGINT the process; SIGKILL kills its whole tree."""
    proc = state.processes.get(state.workspace.check_conversation_id(conversation_id), pid)
    state.processes.signal(proc, body.signal)


async def _process_stream(state: RuntimeState, proc, first: dict) -> AsyncIterator[bytes]:
    yield _ndjson(first)
    async for event in state.processes.events(proc, idle=PROCESS_KEEPALIVE_SECONDS):
        if "data" in event:
            event = {**event, "data": base64.b64encode(event["data"]).decode()}
        yield _ndjson(event)


async def _read_fd(fd: int, activity: Activity) -> AsyncIterator[bytes]:
    with activity.track():
        try:
            while chunk := await anyio.to_thread.run_sync(os.read, fd, _READ_CHUNK):
                yield chunk
        finally:
            os.close(fd)


def create_app(settings: RuntimeSettings | None = None) -> FastAPI:
    settings = settings or RuntimeSettings()
    if settings.network == "proxy":
        egress.check_isolated()
    state = RuntimeState(settings)  # fails loudly at start-up, not on first request

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # Look twice per idle period (at most every 30 s) so reaping is never late by more
        # than half a period.
        interval = min(30.0, settings.kernel_idle_seconds / 2)
        await state.executor.start()
        # anyio's backend and worker thread, as ``warm`` does the routes: else a new
        # session's first file or streaming call imports and starts them (~14 ms).
        await anyio.to_thread.run_sync(int)
        relay = await egress.start_relay(settings) if settings.network == "proxy" else None
        reaper = asyncio.create_task(state.executor.reap_forever(interval=interval))
        memory = asyncio.create_task(state.executor.watch_session_memory())
        try:
            yield
        finally:
            if relay is not None:
                relay.close()
            for task in (reaper, memory):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await state.processes.aclose()
            await state.executor.aclose()
            state.workspace.close()

    app = FastAPI(
        title="Sandbox Workspace runtime", lifespan=lifespan, docs_url=None, redoc_url=None
    )
    app.state.runtime = state
    install_error_handlers(app)

    @app.get("/healthz")
    async def healthz() -> Health:
        """Unauthenticated liveness/readiness probe; names the release's features."""
        return Health(features=[RAW_UPLOAD])

    @app.post("/v1/claim")
    async def claim(body: ClaimRequest, authorization: ClaimHeader = None) -> Claimed:
        """A pooled runtime's one claim (runtime/claim.py): sets its bearer token."""
        state.claim.claim(authorization, body.token)
        if body.egress is not None:
            try:
                state.executor.proxy_through(body.egress.proxy_port, body.egress.code_env)
            except (ValueError, SpawnFailed) as e:
                raise Conflict(f"this runtime cannot take the claim's egress: {e}") from None
        claimed = Claimed(
            network=state.executor.confinement.network,
            workspace_path=state.workspace.visible_root,
        )
        # The session's life starts here, not when the pod started to wait in the pool:
        # else its idle deadline counted the pool's wait, and a session on a pod pooled for
        # longer than its idleTimeoutSeconds was stopped at the operator's first look.
        state.activity.touch()
        return claimed

    app.include_router(router)
    warm(app)  # a new session's first call does not prepare every route (warm_routes)
    return app
