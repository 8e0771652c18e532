"""The API application: wiring of settings, backend, identity and routes.

``create_app(settings, backend=None)`` builds everything from one settings object; tests
inject a backend (STYLE 12) instead of patching.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI
from fastapi_offline import FastAPIOffline
from httpx_aiohttp import AiohttpTransport

from sandbox_workspace import __version__, tracing
from sandbox_workspace.contract.errors import JSONLineResponse, install_error_handlers
from sandbox_workspace.contract.quantity import parse_bytes
from sandbox_workspace.http_guard import HttpGuard
from sandbox_workspace.runtime.settings import RuntimeSettings
from sandbox_workspace.runtime.unix_transport import UnixSocketRouting

from . import cors, dev_guard, garbage, metrics_port, openapi, request_bounds
from .backends.base import Backend
from .chat.anthropic_messages import DEFAULT_BASE_URL as DEFAULT_ANTHROPIC_URL
from .chat.anthropic_messages import AnthropicClient
from .chat.demo_model import DemoModel
from .chat.llm import LlmClient, LlmConfig
from .chat.openai_chat import OpenAiClient
from .chat.policy import allowed_policies
from .chat.runs import RunRegistry
from .chat.runstore.factory import build_store
from .chat.service import resume_run
from .chat.tools import TOOL_NAMES
from .deps import Services
from .e2b import control as e2b_control
from .e2b import envd as e2b_envd
from .e2b import hosts as e2b_hosts
from .files import CacheFiles, FileService
from .identity import Authenticator, StreamTokens
from .metrics import install_metrics
from .quotas import UserLimits
from .routes import (
    ag_ui,
    agents,
    chat,
    conversation_state,
    conversations,
    egress,
    execute,
    files,
    health,
    sandboxes,
    sessions,
    snapshots,
    ui_chat,
    web,
    workspace,
)
from .sessions import SessionService
from .settings import ApiSettings

API_MODULES = (
    sessions,
    egress,
    files,
    conversation_state,
    conversations,
    execute,
    chat,
    ui_chat,
    ag_ui,
    agents,
    sandboxes,
    workspace,
    snapshots,
)


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
            **RuntimeSettings.env(
                confinement=settings.confinement,
                confinement_min_abi=settings.confinement_min_abi,
                network=settings.session_network,
                session_memory=parse_bytes(settings.local_session_memory),
            ),
            **settings.limits.runtime_env(),
        }
        egress = None
        if bwrap is not None and settings.session_network == "deny":
            from .backends.local_egress import LocalEgress

            egress = LocalEgress(
                hosts=settings.local_egress_hosts,
                permit=settings.local_egress_permit,
                max_connections=settings.egress_max_connections,
                idle_timeout=settings.egress_idle_seconds,
                secrets=settings.session_egress.secrets if settings.session_egress else (),
                secrets_dir=settings.local_egress_secrets_dir,
                ca_dir=settings.data_dir / "egress-ca",
                upstream_ca=settings.local_egress_upstream_ca,
            )
        return LocalBackend(
            settings.data_dir,
            http,
            bwrap=bwrap,
            egress=egress,
            runtime_env=runtime_env,
            max_conversations=settings.quotas.conversations_per_user,
            idle_timeout_seconds=settings.session_idle_timeout_seconds,
        )
    from sandbox_workspace.kube import Kube, load_credentials

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
        limits=settings.limits,
        max_conversations=settings.quotas.conversations_per_user,
        egress=settings.session_egress,
    )


def build_llm(settings: ApiSettings) -> LlmClient | DemoModel | None:
    """The model client the settings choose, or None (chat answers 503 naming the
    settings to set)."""
    anthropic = settings.llm_provider == "anthropic"
    base_url = settings.llm_base_url or (DEFAULT_ANTHROPIC_URL if anthropic else None)
    if not (base_url and settings.llm_model):
        # Dev mode only (the settings refuse it elsewhere): chat to try with no service.
        return DemoModel() if settings.demo_model else None
    key = settings.llm_api_key.get_secret_value() if settings.llm_api_key else None
    config = LlmConfig(
        base_url=base_url,
        model=settings.llm_model,
        api_key=key,
        connect_timeout=settings.llm_timeout_seconds,
        read_timeout=settings.llm_timeout_seconds,
        max_retries=settings.llm_max_retries,
        max_tokens=settings.llm_max_tokens,
        anthropic_version=settings.llm_anthropic_version,
    )
    return AnthropicClient(config) if anthropic else OpenAiClient(config)


def create_app(settings: ApiSettings | None = None, backend: Backend | None = None) -> FastAPI:
    settings = settings or ApiSettings()
    tracing.configure("sandbox-workspace-api")  # only when OTEL_EXPORTER_OTLP_ENDPOINT is set
    timeout = httpx.Timeout(
        connect=5.0,
        read=settings.runtime_request_timeout_seconds,
        write=settings.runtime_request_timeout_seconds,
        pool=30.0,
    )
    # Runtime calls: httpx over aiohttp's pool and C parser (httpx-aiohttp): httpcore's
    # pure-Python parser and anyio's cancel scope per read cost about twice as much.
    # httpx stays the interface; proxies from the environment still use httpx's own
    # transports. aiohttp has no write timeout: connect, read and pool apply. Model
    # streams go over aiohttp directly (``chat.llm.LlmClient``: per token, even httpx's layers
    # over aiohttp were the API's largest CPU share in bench/chat.py).
    limits = httpx.Limits(
        max_connections=settings.runtime_connections, max_keepalive_connections=64
    )
    transport = tracing.transport(AiohttpTransport(limits=limits))  # traced runtime calls
    # Local runtimes in network namespaces of their own listen on Unix sockets.
    transport = UnixSocketRouting(transport)
    http = httpx.AsyncClient(timeout=timeout, transport=transport)
    backend = backend or build_backend(settings, http)
    store = None
    file_service: FileService = CacheFiles(backend, http)
    if settings.store == "s3":  # the store becomes the files' source of truth
        from sandbox_workspace.store import S3Store
        from sandbox_workspace.store.layout import Layout

        from .backends.store_backend import StoreBackend
        from .files.stored import StoredFiles

        store = S3Store(settings.s3)
        backend = StoreBackend(backend, http, store, Layout(settings.s3.prefix))
        file_service = StoredFiles(backend, http)
    elif settings.backend == "local":  # the embedded default: seed 003's records beside it
        from sandbox_workspace.store import DirStore

        from .backends.cache_records import RecordsBackend

        records = RecordsBackend(backend, http, DirStore(settings.data_dir / "records"))
        backend = records
        file_service = CacheFiles(backend, http, records)
    services = Services(
        settings=settings,
        backend=backend,
        files=file_service,
        sessions=SessionService(
            backend,
            default_upload=settings.file_upload,
            ready_timeout=settings.session_ready_timeout_seconds,
            default_ttl=settings.session_ttl_seconds,
        ),
        authenticator=Authenticator(settings),
        http=http,
        runs=RunRegistry(settings.chat_run_retention_seconds, build_store(settings)),
        stream_tokens=StreamTokens(
            settings.stream_token_secret.get_secret_value().encode()
            if settings.stream_token_secret
            else secrets.token_bytes(32),
            settings.stream_token_ttl_seconds,
        ),
        llm=build_llm(settings),
        store=store,
        user_limits=UserLimits(settings.quotas, settings.runtime_connections),
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await backend.start()
        await services.runs.store.start(lambda *a: resume_run(services, *a))
        garbage.tune()
        try:
            async with contextlib.AsyncExitStack() as apart:
                if (port := settings.metrics_port) is not None:
                    listener = metrics_port.serving(app.state.metrics, settings.host, port)
                    await apart.enter_async_context(listener)
                yield
        finally:
            await services.runs.aclose()
            await backend.aclose()
            await http.aclose()
            if services.llm is not None:
                await services.llm.aclose()

    # /docs and /redoc with Swagger UI's and ReDoc's files from the fastapi-offline
    # package, served by the API itself: the pages work offline and air-gapped.
    app = FastAPIOffline(
        default_response_class=JSONLineResponse,
        title="Sandbox Workspace API",
        version=__version__,
        description=openapi.DESCRIPTION,
        lifespan=lifespan,
        generate_unique_id_function=openapi.operation_id,
        openapi_tags=openapi.TAGS,
        telemetry=tracing.fastapi_telemetry(),  # request spans only when tracing is on
    )
    app.state.services = services
    install_error_handlers(app, default_retry_after=openapi.RETRY_AFTER_SECONDS)
    openapi.install(
        app,
        settings.max_upload_bytes,
        allowed_policies(TOOL_NAMES, settings.tool_policies),
        settings.file_upload.allowed_file_types,
        settings.auth_mode,
    )
    if settings.backend != "local":
        from .backends.kube_errors import install_kube_error_handler

        install_kube_error_handler(app)
    app.state.metrics = install_metrics(app, services.runs, route=settings.metrics_port is None)
    # Before CORS, so its 413s carry the CORS headers.
    request_bounds.install(app, settings.bounds, (m.router for m in API_MODULES))
    if settings.auth_mode == "dev":  # Host check and JSON only (api/dev_guard.py)
        dev_guard.install(app, settings.host, (m.router for m in API_MODULES), settings.e2b_domain)
    app.state.http_guard = HttpGuard(  # read by sandbox_workspace.server.serve
        settings.bounds.max_header_bytes,
        settings.bounds.header_timeout_seconds,
        drain_seconds=settings.bounds.body_timeout_seconds,
    )
    if settings.cors_allow_origins:
        cors.install(app, settings.cors_allow_origins)  # outermost: see api/cors.py
    if settings.e2b_domain:  # before all else: it picks the route (api/e2b/hosts.py)
        app.add_middleware(e2b_hosts.HostRouting, domain=settings.e2b_domain)
    app.include_router(health.router)
    app.include_router(e2b_envd.router)  # E2B's SDKs (docs/e2b.md)
    app.include_router(e2b_control.router)
    for module in API_MODULES:
        app.include_router(module.router, responses=openapi.errors(*openapi.COMMON_ERRORS))
    web.install(app, settings)
    return app
