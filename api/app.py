"""The API application: wiring of settings, backend, identity and routes.

``create_app(settings, backend=None)`` builds everything from one settings object; tests
inject a backend (STYLE 12) instead of patching.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI
from httpx_aiohttp import AiohttpTransport

from sandbox_workspace import __version__
from sandbox_workspace.runtime.errors import install_error_handlers

from . import garbage
from .backends.base import Backend
from .chat.chat_index import ChatIndex
from .chat.llm import LlmClient, LlmConfig
from .chat.runs import RunRegistry
from .chat.runstore import build_store
from .deps import Services
from .identity import Authenticator
from .metrics import install_metrics
from .routes import ag_ui, chat, conversations, execute, files, health, sessions, ui_chat, web
from .sessions import SessionService
from .settings import ApiSettings


def build_backend(settings: ApiSettings, http: httpx.AsyncClient) -> Backend:
    if settings.backend == "local":
        from .backends.bwrap import bwrap_path
        from .backends.local import LocalBackend

        bwrap = bwrap_path() if settings.sandbox_mount != "none" else None
        if settings.sandbox_mount == "bwrap" and bwrap is None:
            raise RuntimeError(
                "SANDBOX_WORKSPACE_SANDBOX_MOUNT=bwrap but bubblewrap is not installed"
            )
        runtime_env = {
            "SANDBOX_RUNTIME_CONFINEMENT": settings.confinement,
            "SANDBOX_RUNTIME_NETWORK": settings.session_network,
        }
        return LocalBackend(settings.data_dir, http, bwrap=bwrap, runtime_env=runtime_env)
    from sandbox_workspace.operator.kube import Kube, load_credentials

    from .backends.kubernetes import KubernetesBackend

    credentials = load_credentials(settings.kubeconfig)
    namespace = settings.namespace or credentials.namespace or "default"
    return KubernetesBackend(
        Kube(credentials),
        namespace,
        http,
        idle_timeout_seconds=settings.session_idle_timeout_seconds,
        storage=settings.session_storage,
        network_enabled=settings.session_network == "allow",
    )


def build_llm(settings: ApiSettings, http: httpx.AsyncClient) -> LlmClient | None:
    if not (settings.llm_base_url and settings.llm_model):
        return None  # chat answers 503 saying which settings to set
    key = settings.llm_api_key.get_secret_value() if settings.llm_api_key else None
    config = LlmConfig(
        base_url=settings.llm_base_url,
        model=settings.llm_model,
        api_key=key,
        connect_timeout=settings.llm_timeout_seconds,
        read_timeout=settings.llm_timeout_seconds,
        max_retries=settings.llm_max_retries,
    )
    return LlmClient(config, http)


def create_app(settings: ApiSettings | None = None, backend: Backend | None = None) -> FastAPI:
    settings = settings or ApiSettings()
    timeout = httpx.Timeout(
        connect=5.0,
        read=settings.runtime_request_timeout_seconds,
        write=settings.runtime_request_timeout_seconds,
        pool=30.0,
    )
    # Runtime calls and model streams: httpx over aiohttp's pool and C parser
    # (httpx-aiohttp). A model streams one token per chunk to hundreds of runs at once;
    # per chunk, httpcore's pure-Python parser and anyio's cancel scope per read cost
    # about twice as much — the API's largest CPU share in bench/chat.py. httpx stays
    # the interface; proxies from the environment still use httpx's own transports.
    # aiohttp has no write timeout: connect, read and pool apply.
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=64)
    http = httpx.AsyncClient(timeout=timeout, transport=AiohttpTransport(limits=limits))
    backend = backend or build_backend(settings, http)
    services = Services(
        settings=settings,
        backend=backend,
        sessions=SessionService(
            backend,
            default_upload=settings.file_upload,
            ready_timeout=settings.session_ready_timeout_seconds,
            default_ttl=settings.session_ttl_seconds,
        ),
        authenticator=Authenticator(settings),
        http=http,
        runs=RunRegistry(settings.chat_run_retention_seconds, build_store(settings)),
        llm=build_llm(settings, http),
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await backend.start()
        await services.runs.store.start(lambda *a: chat.resume_run(services, *a))
        garbage.tune()
        try:
            yield
        finally:
            await services.runs.aclose()
            await backend.aclose()
            await http.aclose()

    app = FastAPI(title="Sandbox Workspace API", version=__version__, lifespan=lifespan)
    app.state.services = services
    app.state.ui_chats = ChatIndex()
    install_error_handlers(app)
    if settings.backend != "local":
        from .backends.kube_errors import install_kube_error_handler

        install_kube_error_handler(app)
    install_metrics(app, services.runs)
    for module in (health, sessions, files, conversations, execute, chat, ui_chat, ag_ui):
        app.include_router(module.router)
    web.install(app, settings)
    return app
