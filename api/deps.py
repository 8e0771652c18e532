"""FastAPI dependencies: the per-process services and the authenticated caller."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Annotated

import httpx
from fastapi import Depends, Query, Request

from sandbox_workspace.store import ObjectStore

from .backends.base import Backend
from .chat.llm import LlmClient
from .chat.runs import RunRegistry
from .files import FileService
from .identity import Authenticator, Caller, StreamTokens
from .quotas import Quotas, UserLimits
from .sessions import SessionService
from .settings import ApiSettings


@dataclass
class Services:
    """Everything the routes use; built once per app in ``app.create_app``."""

    settings: ApiSettings
    backend: Backend
    files: FileService  # every file route's way to the files (one per mode)
    sessions: SessionService
    authenticator: Authenticator
    http: httpx.AsyncClient
    runs: RunRegistry
    stream_tokens: StreamTokens
    llm: LlmClient | None = None
    # SANDBOX_WORKSPACE_STORE=s3: the object store (opened and checked at start), else None.
    store: ObjectStore | None = None
    user_limits: UserLimits = field(default_factory=lambda: UserLimits(Quotas()))
    _tasks: set[asyncio.Task] = field(default_factory=set)

    def spawn(self, coro: Coroutine) -> asyncio.Task:
        """A background task that outlives the request (kept referenced until done)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


# Dependencies are ``async def`` on purpose: FastAPI runs a plain ``def`` dependency in
# a worker thread, a hand-off that cost more than everything else on a small request.
async def get_services(request: Request) -> Services:
    return request.app.state.services


async def get_caller(request: Request) -> Caller:
    authenticator: Authenticator = request.app.state.services.authenticator
    # On the loop: no thread hop for any credential (a JWKS refresh alone leaves it).
    return await authenticator.authenticate(request.headers)


async def get_stream_caller(
    request: Request,
    token: Annotated[
        str | None,
        Query(
            max_length=2048,
            description="A stream token from `POST /api/v1/runs/{run_id}/stream-token`, for "
            "clients that cannot send headers (EventSource); replaces `Authorization`.",
        ),
    ] = None,
) -> Caller:
    if token is None:
        return await get_caller(request)
    services: Services = request.app.state.services
    return services.stream_tokens.verify(token, request.path_params.get("run_id", ""))


ServicesDep = Annotated[Services, Depends(get_services)]
CallerDep = Annotated[Caller, Depends(get_caller)]
StreamCallerDep = Annotated[Caller, Depends(get_stream_caller)]
