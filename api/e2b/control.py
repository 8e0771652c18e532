"""E2B's control plane (``E2B_API_URL=…/e2b``): create, get, list, kill, connect, timeout.

A sandbox is a conversation ``e2b-{sandboxID}`` of the caller's session (``ids``):
create opens a new one (kubernetes: its ConversationWorkspace with the finalizer), kill
deletes it with the guarantee ``DELETE …/conversations/{cid}`` gives, get/list read the
session's conversations. Answers use E2B's field names (``sandboxID``, ``envdVersion``…);
errors are E2B's ``{"code", "message"}``. Not supported yet (a clear 501): pause, resume,
snapshots, fork, metrics, logs, network updates; ``timeout`` is accepted and echoed in
``endAt`` but does not kill the sandbox when it passes.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Body, Request
from fastapi.responses import JSONResponse, Response

from sandbox_workspace.contract.errors import ApiError, BadRequest

from ..deps import Services, ServicesDep
from ..identity import Caller
from .conversation import EXECUTIONS, Sandbox, client
from .ids import (
    AccessTokens,
    caller_for_api_key,
    check_sandbox_id,
    conversation_of,
    new_sandbox_id,
    sandbox_of,
)

router = APIRouter(prefix="/e2b", tags=["e2b"], include_in_schema=False)

ENVD_VERSION = "0.5.7"  # what the SDK's feature checks see (octet-stream uploads: ≥0.5.7)
TEMPLATES = {"base": "base", "code-interpreter-v1": "code-interpreter-v1"}
DEFAULT_TIMEOUT = 300


def e2b_error(e: ApiError) -> JSONResponse:
    return JSONResponse({"code": e.status, "message": e.message}, status_code=e.status)


async def _caller(request: Request, services: Services) -> Caller:
    return caller_for_api_key(request.headers.get("x-api-key"), services.settings.auth_mode)


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


async def _create(request: Request, services: Services, body: dict) -> JSONResponse:
    caller = await _caller(request, services)
    template = body.get("templateID") or "base"
    if template not in TEMPLATES:
        raise BadRequest(
            f"template '{template}' is not available: use 'base' or 'code-interpreter-v1'",
            code="template_not_found",
        )
    if body.get("autoPause") or body.get("volumeMounts") or body.get("mcp"):
        raise NotSupported("autoPause, volumeMounts and mcp are not supported")
    timeout = int(body.get("timeout") or DEFAULT_TIMEOUT)
    session = await services.sessions.ensure_running(caller, caller.session_id)
    sandbox_id = new_sandbox_id()
    sandbox = Sandbox(services, session, conversation_of(sandbox_id))
    await services.backend.conversation_opened(session, sandbox.cid)
    # The conversation exists for the runtime (its listings) at once: its directories are
    # made directly, not by a process in the sandbox (that cost ~80 ms of the create).
    await client(services, session).ensure_conversation(sandbox.cid)
    answer = _describe(sandbox_id, template, timeout)
    answer["envdAccessToken"] = tokens(services).issue(caller, sandbox_id)
    return JSONResponse(answer, status_code=201)


class NotSupported(ApiError):
    status = 501
    code = "not_supported"


@router.post("/sandboxes")
@router.post("/v2/sandboxes")
async def create_sandbox(
    request: Request, services: ServicesDep, body: Annotated[dict, Body()]
) -> Response:
    try:
        return await _create(request, services, body)
    except ApiError as e:
        return e2b_error(e)


@router.get("/sandboxes/{sandbox_id}")
async def get_sandbox(sandbox_id: str, request: Request, services: ServicesDep) -> Response:
    try:
        caller = await _caller(request, services)
        sid = check_sandbox_id(sandbox_id)
        await Sandbox.open(services, caller, sid)
        return JSONResponse(_describe(sid, "base", DEFAULT_TIMEOUT))
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
        return JSONResponse([_describe(sid, "base", DEFAULT_TIMEOUT) for sid in found])
    except ApiError as e:
        return e2b_error(e)


@router.delete("/sandboxes/{sandbox_id}")
async def kill_sandbox(sandbox_id: str, request: Request, services: ServicesDep) -> Response:
    """Delete the conversation and its files (200/202 semantics of the v1 route collapse
    into E2B's 204: the deletion is accepted and completes under the guarantee)."""
    try:
        caller = await _caller(request, services)
        sandbox = await Sandbox.open(services, caller, check_sandbox_id(sandbox_id))
        await services.backend.delete_conversation(sandbox.session, sandbox.cid)
        services.runs.cancel_conversation(sandbox.session.session_id, sandbox.cid)
        EXECUTIONS.pop(sandbox.cid, None)
        return Response(status_code=204)
    except ApiError as e:
        return e2b_error(e)


@router.post("/sandboxes/{sandbox_id}/timeout")
async def set_timeout(sandbox_id: str, request: Request, services: ServicesDep) -> Response:
    try:
        caller = await _caller(request, services)
        await Sandbox.open(services, caller, check_sandbox_id(sandbox_id))
        return Response(status_code=204)
    except ApiError as e:
        return e2b_error(e)


@router.post("/sandboxes/{sandbox_id}/connect")
@router.post("/v2/sandboxes/{sandbox_id}/connect")
async def connect_sandbox(
    sandbox_id: str,
    request: Request,
    services: ServicesDep,
    body: Annotated[dict | None, Body()] = None,
) -> Response:
    """Resume the session if it stopped (``ensure_running``) and answer the sandbox."""
    try:
        caller = await _caller(request, services)
        sid = check_sandbox_id(sandbox_id)
        await Sandbox.open(services, caller, sid)
        answer = _describe(sid, "base", int((body or {}).get("timeout") or DEFAULT_TIMEOUT))
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
