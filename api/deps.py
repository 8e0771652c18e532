"""FastAPI dependencies: the per-process services and the authenticated caller."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import httpx
from fastapi import Depends, Request

from .backends.base import Backend
from .identity import Authenticator, Caller
from .sessions import SessionService
from .settings import ApiSettings


@dataclass
class Services:
    """Everything the routes use; built once per app in ``app.create_app``."""

    settings: ApiSettings
    backend: Backend
    sessions: SessionService
    authenticator: Authenticator
    http: httpx.AsyncClient


def get_services(request: Request) -> Services:
    return request.app.state.services


def get_caller(request: Request) -> Caller:
    return get_services(request).authenticator.authenticate(request.headers)


ServicesDep = Annotated[Services, Depends(get_services)]
CallerDep = Annotated[Caller, Depends(get_caller)]
