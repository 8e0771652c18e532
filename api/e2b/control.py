"""E2B's control plane (``E2B_API_URL=…/e2b``): create, get, list, kill, connect, timeout.

A sandbox is a conversation ``e2b-{sandboxID}`` of the caller's session (``ids``):
create opens a new one (kubernetes: its ConversationWorkspace with the finalizer), kill
deletes it with the guarantee ``DELETE …/conversations/{cid}`` gives, get/list read the
session's conversations. Answers use E2B's field names (``sandboxID``, ``envdVersion``…);
errors are E2B's ``{"code", "message"}``. Not supported yet (a clear 501): pause, resume,
snapshots, fork, metrics, logs, network updates. Timeouts kill (``lifetimes``);
``metadata["sandbox-workspace.conversation"]`` attaches an existing conversation of the
caller instead of making one, and killing it only detaches; ``Idempotency-Key`` is
honoured; API keys are ``keys``'s in ``required`` auth mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from sandbox_workspace.contract.errors import ApiError, BadRequest

from ..backends.base import Session
from ..deps import Services, ServicesDep
from ..identity import Caller
from . import connect, processes
from .conversation import EXECUTIONS, Sandbox, client
from .ids import (
    AccessTokens,
    E2BUnauthorized,
    attached_sandbox_id,
    check_sandbox_id,
    conversation_of,
    dev_caller_for_api_key,
    is_attached,
    new_sandbox_id,
    sandbox_of,
    well_formed_key,
)
from .keys import owner_of, records_of
from .keys import router as keys_router
from .lifetimes import MAX_TIMEOUT
from .state import idempotency, lifetimes

router = APIRouter(prefix="/e2b", tags=["e2b"], include_in_schema=False)
router.include_router(keys_router)  # before the catch-all "not supported"

ENVD_VERSION = "0.5.7"  # what the SDK's feature checks see (octet-stream uploads: ≥0.5.7)
TEMPLATES = {"base": "base", "code-interpreter-v1": "code-interpreter-v1"}
DEFAULT_TIMEOUT = 300
MAX_METADATA_BYTES = 64 * 1024


def timeout_of(body: dict | None) -> int:
    """The body's ``timeout`` in seconds (E2B's default when absent, at most E2B's cap,
    ``MAX_TIMEOUT``); 400 if not a finite number >= 0."""
    value = (body or {}).get("timeout")
    if value is None:
        return DEFAULT_TIMEOUT
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        raise BadRequest("timeout must be a number of seconds >= 0", code="invalid_timeout")
    return int(min(value, MAX_TIMEOUT)) or DEFAULT_TIMEOUT


def metadata_of(body: dict) -> dict[str, str]:
    """The body's ``metadata``: E2B's string → string map, at most ``MAX_METADATA_BYTES``
    (it is answered back, and remembered with an ``Idempotency-Key``'s answer)."""
    metadata = body.get("metadata") or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise BadRequest("metadata must be an object of string values", code="invalid_metadata")
    size = len(json.dumps(metadata))
    if size > MAX_METADATA_BYTES:
        raise BadRequest(
            f"metadata of {size} bytes: at most {MAX_METADATA_BYTES} (as JSON)",
            code="invalid_metadata",
        )
    return metadata


def e2b_error(e: ApiError) -> JSONResponse:
    return JSONResponse({"code": e.status, "message": e.message}, status_code=e.status)


async def _caller(request: Request, services: Services) -> Caller:
    timers = lifetimes(services)
    if timers.shared:  # any replica reaps shared timers: one that served an E2B call does
        _reap(services, timers)
    key = well_formed_key(request.headers.get("x-api-key"))
    if services.settings.auth_mode == "dev":
        return dev_caller_for_api_key(key)
    owner = await owner_of(records_of(request, services), key)
    if owner is None:
        raise E2BUnauthorized("unknown or revoked E2B API key (issue one: POST /e2b/keys)")
    return owner


def tokens(services: Services) -> AccessTokens:
    return AccessTokens(services.stream_tokens.key)


def _describe(sandbox_id: str, template: str, timeout: int) -> dict[str, Any]:
    now = datetime.now(UTC)
    return {
        "templateID": template,
        "alias": template,
        "sandboxID": sandbox_id,
        "clientID": "sandbox-workspace",
        "envdVersion": ENVD_VERSION,
        "startedAt": now.isoformat(),
        "endAt": (now + timedelta(seconds=timeout)).isoformat(),
        "cpuCount": 1,
        "memoryMB": 512,
        "diskSizeMB": 1024,
        "state": "running",
        "metadata": {},
        "domain": None,
    }


ATTACH_KEY = "sandbox-workspace.conversation"  # metadata naming a conversation to attach


async def _keep(services: Services, sandbox_id: str, caller: Caller, timeout: int, **how):
    timers = lifetimes(services)
    await timers.set(caller, sandbox_id, timeout, **how)
    _reap(services, timers)


def _reap(services: Services, timers) -> None:
    timers.start(services.spawn, lambda sid, who: _end(services, sid, who))


async def body_of(request: Request) -> dict:
    """The request's JSON object (no body: ``{}``); a 400 naming what is wrong — not
    FastAPI's "There was an error parsing the body", nor a 500 for ``NaN``."""
    return connect.message_of(await request.body(), "the body")


async def _create(request: Request, services: Services) -> JSONResponse:
    caller = await _caller(request, services)
    body = await body_of(request)
    template = body.get("templateID") or "base"
    if not isinstance(template, str) or template not in TEMPLATES:
        raise BadRequest(
            f"template {str(template)[:100]!r} is not available: use 'base' or "
            "'code-interpreter-v1'",
            code="template_not_found",
        )
    if body.get("autoPause") or body.get("volumeMounts") or body.get("mcp"):
        raise NotSupported("autoPause, volumeMounts and mcp are not supported")
    timeout = timeout_of(body)
    metadata = metadata_of(body)
    attach = metadata.get(ATTACH_KEY)

    async def make() -> dict[str, Any]:
        if attach:
            sandbox_id = attached_sandbox_id(str(attach))
            await _keep(services, sandbox_id, caller, timeout)
            try:  # 404 unless the conversation exists in the caller's own session
                await Sandbox.open(services, caller, sandbox_id)
            except ApiError:
                await lifetimes(services).forget(caller, sandbox_id)
                raise
        else:
            session = await services.sessions.ensure_running(caller, caller.session_id)
            sandbox_id = new_sandbox_id()
            sandbox = Sandbox(services, session, conversation_of(sandbox_id), caller=caller)
            await _made(services, session, sandbox.cid)
        await _keep(services, sandbox_id, caller, timeout)
        answer = _describe(sandbox_id, template, timeout)
        answer["metadata"] = metadata
        answer["envdAccessToken"] = tokens(services).issue(caller, sandbox_id)
        return answer

    key = request.headers.get("idempotency-key")
    if key is None:
        return JSONResponse(await make(), status_code=201)
    once = idempotency(services).once
    return JSONResponse(await once(caller, key, body, make), status_code=201)


async def _made(services: Services, session: Session, cid: str) -> None:
    """A new sandbox's conversation: tracked by the backend (kubernetes: its
    ConversationWorkspace with the finalizer; a new random id, so the store has nothing of
    it to fill or check — no read) and known to the runtime (its listings) at once, its
    directories made directly, not by a process in the sandbox (~80 ms). Both side by
    side, one round trip: the id is new and random, so nothing of anyone's is in the
    empty directories made before the backend's answer; a refused create (quota) takes
    them back."""
    runtime = client(services, session)
    made, dirs = await asyncio.gather(
        services.backend.conversation_created(session, cid),
        runtime.ensure_conversation(cid),
        return_exceptions=True,
    )
    if isinstance(made, BaseException):
        if not isinstance(dirs, BaseException):
            with contextlib.suppress(Exception):  # best effort: empty, and the id unused
                await runtime.delete_conversation(cid)
        raise made
    if isinstance(dirs, BaseException):
        raise dirs


async def _end(services: Services, sandbox_id: str, caller: Caller) -> bool:
    """Kill: a fresh sandbox's conversation is deleted with the guarantee; an attached
    one is only detached, its commands killed (the user's chat files are never deleted
    by an SDK call)."""
    sandbox = await Sandbox.open(services, caller, sandbox_id)
    if is_attached(sandbox_id):
        # Detached only, but the commands the SDK started there end with it: they would
        # run on (up to the runtime's max_process_seconds) out of any handle's reach.
        await processes.kill_all(sandbox)
    await lifetimes(services).forget(caller, sandbox_id)
    EXECUTIONS.pop(sandbox.key, None)  # the next attach is a new sandbox, counting from 1
    if is_attached(sandbox_id):
        return True
    await services.backend.delete_conversation(sandbox.session, sandbox.cid)
    services.runs.cancel_conversation(sandbox.session.session_id, sandbox.cid)
    return True


class NotSupported(ApiError):
    status = 501
    code = "not_supported"


@router.post("/sandboxes")
@router.post("/v2/sandboxes")
async def create_sandbox(request: Request, services: ServicesDep) -> Response:
    try:
        return await _create(request, services)
    except ApiError as e:
        return e2b_error(e)


@router.get("/sandboxes/{sandbox_id}")
async def get_sandbox(sandbox_id: str, request: Request, services: ServicesDep) -> Response:
    try:
        caller = await _caller(request, services)
        sid = check_sandbox_id(sandbox_id)
        await Sandbox.open(services, caller, sid)
        left = await lifetimes(services).remaining(caller, sid)
        return JSONResponse(_describe(sid, "base", int(left or 0)))
    except ApiError as e:
        return e2b_error(e)


@router.get("/sandboxes")
@router.get("/v2/sandboxes")
async def list_sandboxes(request: Request, services: ServicesDep) -> Response:
    try:
        caller = await _caller(request, services)
        session = await services.sessions.ensure_running(caller, caller.session_id)
        ids = await client(services, session).list_conversations()
        found = [sid for cid in ids if (sid := sandbox_of(cid))]
        timers = lifetimes(services)
        left = await asyncio.gather(*(timers.remaining(caller, sid) for sid in found))
        pairs = list(zip(found, left, strict=True))
        if timers.shared:  # a sandbox without a timer is gone there (get answers 404)
            pairs = [(sid, t) for sid, t in pairs if t is not None]
        ends = [(sid, int(DEFAULT_TIMEOUT if t is None else t)) for sid, t in pairs]
        return JSONResponse([_describe(sid, "base", t) for sid, t in ends])
    except ApiError as e:
        return e2b_error(e)


@router.delete("/sandboxes/{sandbox_id}")
async def kill_sandbox(sandbox_id: str, request: Request, services: ServicesDep) -> Response:
    """Delete the conversation and its files (200/202 semantics of the v1 route collapse
    into E2B's 204: the deletion is accepted and completes under the guarantee)."""
    try:
        caller = await _caller(request, services)
        await _end(services, check_sandbox_id(sandbox_id), caller)
        return Response(status_code=204)
    except ApiError as e:
        return e2b_error(e)


@router.post("/sandboxes/{sandbox_id}/timeout")
async def set_timeout(
    sandbox_id: str,
    request: Request,
    services: ServicesDep,
) -> Response:
    try:
        caller = await _caller(request, services)
        sid = check_sandbox_id(sandbox_id)
        await Sandbox.open(services, caller, sid)
        await _keep(services, sid, caller, timeout_of(await body_of(request)))
        return Response(status_code=204)
    except ApiError as e:
        return e2b_error(e)


@router.post("/sandboxes/{sandbox_id}/connect")
@router.post("/v2/sandboxes/{sandbox_id}/connect")
async def connect_sandbox(
    sandbox_id: str,
    request: Request,
    services: ServicesDep,
) -> Response:
    """Resume the session if it stopped (``ensure_running``) and answer the sandbox."""
    try:
        caller = await _caller(request, services)
        sid = check_sandbox_id(sandbox_id)
        await Sandbox.open(services, caller, sid)
        timeout = timeout_of(await body_of(request))
        await _keep(services, sid, caller, timeout, extend_only=True)
        left = await lifetimes(services).remaining(caller, sid)
        answer = _describe(sid, "base", int(left or timeout))
        answer["envdAccessToken"] = tokens(services).issue(caller, sid)
        return JSONResponse(answer, status_code=200)
    except ApiError as e:
        return e2b_error(e)


@router.api_route(
    "/{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"], include_in_schema=False
)
async def not_supported(rest: str, request: Request) -> Response:
    return e2b_error(
        NotSupported(f"{request.method} /{rest} is not supported by Sandbox Workspace's E2B API")
    )
