"""API settings, from ``SANDBOX_WORKSPACE_*`` environment variables (docs/operations.md).

Refuses unsafe combinations at start-up with a message naming the setting to change:
``dev`` auth off loopback, ``required`` auth with no credential configured.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from sandbox_workspace.contract.quantity import parse_bytes
from sandbox_workspace.operator.models import (
    EgressSpec,
    ExecutionLimits,
    FileUploadConfig,
    Quantity,
    StorageSpec,
)
from sandbox_workspace.store.settings import S3Settings, StoreMode

from .e2b.domain import check_domain
from .quotas import Quotas
from .request_bounds import RequestBounds

ENV_PREFIX = "SANDBOX_WORKSPACE_"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class ApiSettings(BaseSettings):
    """One settings object per API process."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="ignore"
    )

    backend: Literal["local", "kubernetes"] = Field(
        "local", description="Where sessions live: runtime processes on this machine, or CRs."
    )
    host: str = "127.0.0.1"
    port: int = 8000
    metrics_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="Serve /metrics on this port (same host) instead of the API's own "
        "port, which then answers /metrics with 404; unset: on the API's port.",
    )
    e2b_domain: str | None = Field(
        None,
        description="E2B's host routing: requests for `api.{domain}` reach E2B's API and "
        "`{port}-{sandboxID}.{domain}` that sandbox (SDKs with `E2B_DOMAIN`; wildcard DNS "
        "and certificate, docs/e2b.md); unset: header routing only.",
    )
    auth_mode: Literal["dev", "required"] = Field(
        "required",
        description="`dev`: no credentials, user from X-User-Id (loopback only); "
        "`required`: service token + X-User-Id, or a JWT whose `sub` is the user.",
    )
    service_token: SecretStr | None = None
    jwt_secret: SecretStr | None = Field(None, description="HS256 key for caller JWTs.")
    jwt_jwks_url: str | None = Field(None, description="JWKS URL for RS/ES-signed JWTs.")
    jwt_audience: str | None = Field(
        None, description="Required `aud` of caller JWTs (needed whenever JWTs are accepted)."
    )
    jwt_issuer: str | None = Field(
        None, description="Required `iss` of caller JWTs (needed whenever JWTs are accepted)."
    )
    jwt_leeway_seconds: int = Field(
        30, ge=0, le=300, description="Clock skew allowed on a JWT's exp, nbf and iat."
    )
    jwt_jwks_min_refresh_seconds: float = Field(
        30.0,
        ge=1,
        le=3600,
        description="At most one JWKS fetch per this many seconds, however many unknown key "
        "ids callers send (a rotated key is picked up within it).",
    )
    jwt_tenant_claim: str = Field(
        "tenant_id", description="JWT claim naming the caller's tenant (seed 003's routes)."
    )
    data_dir: Path = Field(Path("./data"), description="Local backend: where workspaces live.")
    sandbox_mount: Literal["auto", "bwrap", "none"] = Field(
        "auto",
        description="Local backend: `bwrap` shows each session's workspace at /workspace "
        "(as in a pod); `none` uses the data directory path; `auto` picks bwrap if present.",
    )
    confinement: Literal["auto", "require", "none"] = Field(
        "auto",
        description="Local backend: how runtimes confine executed code with Landlock "
        "(`auto`: when the kernel allows; `require`: refuse to run code otherwise; `none`).",
    )
    confinement_min_abi: int = Field(
        6,
        ge=1,
        description="Local backend, with `require`: the lowest Landlock ABI runtimes accept "
        "(3: truncate confined, 6: signals scoped; docs/security.md).",
    )
    session_network: Literal["deny", "allow"] = Field(
        "deny",
        description="Whether executed code of new sessions may open TCP connections (local "
        "runtimes; on Kubernetes written into new SandboxSessions as `spec.network.enabled`).",
    )
    session_egress: EgressSpec | None = Field(
        None,
        description='Egress policy of new sessions as JSON (`{"rules": [{"host": '
        '"pypi.org"}]}`): the hosts code may reach through the egress proxy; unset: none '
        "(no network). On Kubernetes written into new SandboxSessions as `spec.egress`; "
        "changeable per session (PUT /api/v1/sessions/{id}/egress).",
    )
    local_egress_hosts: dict[str, list[str]] | None = Field(
        None,
        description="Dev mode only (tests, demos): the names the local backend's egress "
        'proxy resolves, with their addresses, as JSON (`{"index.test": ["127.0.0.1"]}`); '
        "set, the proxy resolves no other name.",
    )
    local_egress_permit: list[str] = Field(
        default_factory=list,
        description="Dev mode only (tests, demos): networks taken off the egress proxy's "
        'forbidden ranges (e.g. `["127.0.0.0/8"]` for servers of a test on loopback).',
    )
    local_egress_secrets_dir: Path | None = Field(
        None,
        description="Local backend: where the values of the secrets bound in "
        "`SESSION_EGRESS` are, one file per key (`<dir>/<secretKeyRef.name>/<key>`, a "
        "mounted Kubernetes Secret's layout). Only the API's egress proxy reads them; the "
        "directory is hidden from sandboxes.",
    )
    local_egress_upstream_ca: str | None = Field(
        None,
        description="Dev mode only (tests, demos): the CA file that hosts with a secret "
        "bound must chain to (default: the system's).",
    )
    egress_max_connections: int = Field(
        64,
        ge=1,
        le=4096,
        description="Local backend: connections one session's code may have open through "
        "the egress proxy at once (tunnels, requests); the next is answered `429 Egress "
        "refused` naming this setting. On Kubernetes: chart "
        "`egressProxy.maxConnectionsPerSession`.",
    )
    egress_idle_seconds: float = Field(
        600.0,
        gt=0,
        le=86400,
        description="Local backend: seconds an egress tunnel (or an answer being relayed) "
        "may move no byte before the proxy closes it. On Kubernetes: chart "
        "`egressProxy.idleTimeoutSeconds`.",
    )
    limits: ExecutionLimits = Field(
        default_factory=ExecutionLimits,
        description="Limits of each execution of code in new sessions: memory, cpu_seconds, "
        "file_size, conversation_size (sizes in bytes or quantities such as 512Mi); local "
        "runtimes get them directly, on Kubernetes they are written into new "
        "SandboxSessions as `spec.limits`.",
    )
    local_session_memory: Quantity = Field(
        "2Gi",
        description="Local backend: ceiling on the memory of all code of one session "
        "together (bytes or a quantity); past it the execution holding the most is "
        "stopped (memory_limit_exceeded), so trying the product cannot take the machine "
        "down. On Kubernetes the sandbox pod's memory limit is that ceiling.",
    )
    kubeconfig: Path | None = Field(
        None, description="Kubernetes backend: kubeconfig (default: $KUBECONFIG, then in-pod)."
    )
    namespace: str | None = Field(
        None, description="Kubernetes backend: namespace of the CRs (default: the pod's own)."
    )
    session_storage: StorageSpec | None = Field(
        None,
        description="Kubernetes backend: workspace storage of new sessions "
        "(persistent, size, storage_class_name); unset uses the CRD's default.",
    )
    session_idle_timeout_seconds: int | None = Field(
        None,
        ge=0,
        description="Stop a session's runtime (pod or process; files kept, resumed on next "
        "use) after this many seconds idle; unset: 1800 (the custom resource's default); "
        "0 never. Kubernetes backend: idleTimeoutSeconds of new sessions.",
    )
    store: StoreMode = Field(
        "local",
        description="Where conversation files are kept: `local` (only in the sandboxes' "
        "workspaces) or `s3` (an S3-compatible bucket is their source of truth; the "
        "workspaces are caches). See the README's object store section.",
    )
    s3: S3Settings = Field(
        default_factory=S3Settings,
        description="Store `s3`: endpoint_url, bucket, prefix, region, access_key_id, "
        "secret_access_key (SANDBOX_WORKSPACE_S3__BUCKET …).",
    )
    file_upload: FileUploadConfig = Field(default_factory=FileUploadConfig)
    max_upload_bytes: int = Field(
        5 * 1024**3, ge=1, description="Ceiling no session's upload config may exceed."
    )
    session_ready_timeout_seconds: float = Field(60.0, gt=0)
    session_ttl_seconds: int | None = Field(None, ge=60)
    runtime_request_timeout_seconds: float = Field(
        300.0, gt=0, description="Read timeout for calls to a sandbox runtime."
    )
    runtime_connections: int = Field(
        512,
        ge=8,
        description="Connections to sandbox runtimes one API replica keeps at most (all "
        "runtimes together). Calls that hold one while code runs (`/execute`, E2B commands, "
        "`run_code`) take at most half together (then 429), so other calls always find one.",
    )
    llm_provider: Literal["openai", "anthropic"] = Field(
        "openai",
        description="The model's API: `openai` (Chat Completions, any compatible endpoint) "
        "or `anthropic` (the Messages API).",
    )
    llm_base_url: str | None = Field(
        None,
        description="The endpoint, e.g. https://host/v1 (provider `openai`: chat needs it; "
        "`anthropic`: default https://api.anthropic.com/v1).",
    )
    llm_model: str | None = Field(None, description="Model name sent to the endpoint.")
    demo_model: bool = Field(
        False,
        description="Dev mode only: with no model configured, chat is answered by a scripted "
        "demo model that says it is one and runs the real tools on the user's files "
        "(`sandbox-workspace dev` turns it on unless set).",
    )
    llm_api_key: SecretStr | None = Field(
        None, description="The endpoint's key (a bearer token; `anthropic`: x-api-key)."
    )
    llm_max_tokens: int = Field(
        4096, ge=1, description="Provider `anthropic`: max_tokens of each model turn."
    )
    llm_anthropic_version: str = Field(
        "2023-06-01", description="Provider `anthropic`: the anthropic-version header."
    )
    llm_timeout_seconds: float = Field(60.0, gt=0, description="Connect/read timeout.")
    llm_max_retries: int = Field(2, ge=0, le=10, description="Retries on 429/529/5xx/connect.")
    chat_max_iterations: int = Field(15, ge=1, le=100, description="Model turns per run.")
    chat_run_deadline_seconds: float = Field(900.0, gt=0, description="Hard limit per run.")
    chat_auto_snapshot: bool = Field(
        False,
        description="Take a snapshot of the conversation's files before each chat turn "
        "(named `auto: before turn {run_id}`), so a retry from that turn can restore it.",
    )
    chat_auto_snapshot_keep: int = Field(
        10, ge=1, description="Automatic snapshots kept per conversation (oldest deleted)."
    )
    chat_approval_timeout_seconds: float = Field(
        300.0, gt=0, description="Undecided approvals count as rejected after this."
    )
    chat_run_retention_seconds: float = Field(
        900.0, ge=0, description="Finished runs stay re-attachable this long."
    )
    chat_run_store: Literal["memory", "redis"] = Field(
        "memory",
        description="Where chat runs live: `memory` (this process; one replica) or `redis` "
        "(a Redis-protocol server: several replicas, runs survive restarts).",
    )
    chat_redis_url: SecretStr | None = Field(
        None, description="Run store `redis`: redis://[:password@]host:port/db (or rediss://)."
    )
    chat_redis_prefix: str = Field("sbw:", description="Run store `redis`: key prefix.")
    chat_run_lease_seconds: float = Field(
        10.0, gt=0, description="Run store `redis`: a dead owner's runs move after this."
    )
    chat_run_handover_seconds: float = Field(
        20.0, ge=0, description="Run store `redis`: shutdown waits this long for tool calls."
    )
    chat_keepalive_seconds: float = Field(15.0, gt=0, description="SSE keep-alive interval.")
    chat_tool_timeout_seconds: float = Field(120.0, gt=0, description="Per tool call.")
    table_source_url: str | None = Field(
        None,
        description="/agents with table_id: the platform's tables, read with GET {url}/{id} "
        'and written back with PUT {url}/{id} (JSON {"data": …}), the caller\'s identity '
        "forwarded.",
    )
    table_source_timeout_seconds: float = Field(
        10.0, gt=0, description="Per request to the table source (a slower one fails the run)."
    )
    tool_policies: dict[str, Literal["auto", "require_approval", "deny"]] = Field(
        default_factory=dict,
        description='Per tool: auto | require_approval | deny, e.g. {"bash": '
        '"require_approval"}; requests may only make them stricter.',
    )
    cors_allow_origins: list[str] = Field(
        default_factory=list,
        description="Browser origins allowed to call the API directly, e.g. "
        '["https://app.example.com"] (JSON list); empty: no CORS headers (same-origin or '
        'a backend in front). "*" allows any origin — never with credentials.',
    )
    stream_token_ttl_seconds: int = Field(
        300, ge=10, le=86400, description="Lifetime of run stream tokens (EventSource)."
    )
    stream_token_secret: SecretStr | None = Field(
        None,
        description="HMAC key of run stream tokens; unset: a random key per process (set "
        "the same value on every replica so any of them accepts a token).",
    )
    web_ui: bool | None = Field(
        None,
        description="Serve the web page at /ui/ (unset: on with auth_mode=dev, off otherwise).",
    )
    bounds: RequestBounds = Field(
        default_factory=RequestBounds,
        description="Size and time bounds of requests: max_body_bytes, "
        "body_timeout_seconds, max_header_bytes, header_timeout_seconds.",
    )
    quotas: Quotas = Field(
        default_factory=Quotas,
        description="Per-user caps: conversations_per_user (409 quota_exceeded), "
        "runs_per_user, followers_per_user, executions_per_user/_per_tenant (429 with "
        "Retry-After), "
        "e2b_streams_per_user/_per_tenant, e2b_watchers_per_user/_per_tenant (429), "
        "snapshot_bytes_per_user (413).",
    )
    log_level: str = "info"

    @model_validator(mode="after")
    def _safe_auth(self) -> ApiSettings:
        parse_bytes(self.local_session_memory)  # the pattern admits forms it refuses
        if self.e2b_domain is not None:
            try:
                self.e2b_domain = check_domain(self.e2b_domain)
            except ValueError as e:
                raise ValueError(f"{ENV_PREFIX}E2B_DOMAIN: {e}") from None
        if self.auth_mode == "dev" and not is_loopback(self.host):
            raise ValueError(
                f"auth_mode=dev is only allowed on a loopback host, not {self.host!r}; set "
                f"{ENV_PREFIX}AUTH_MODE=required with a service token or JWT settings"
            )
        if self.auth_mode == "required" and not (
            self.service_token or self.jwt_secret or self.jwt_jwks_url
        ):
            raise ValueError(
                f"auth_mode=required needs {ENV_PREFIX}SERVICE_TOKEN, {ENV_PREFIX}JWT_SECRET "
                f"or {ENV_PREFIX}JWT_JWKS_URL"
            )
        if (self.jwt_secret or self.jwt_jwks_url) and not (self.jwt_audience and self.jwt_issuer):
            # Without them any token the IdP signs for another application is accepted.
            raise ValueError(
                f"JWT authentication ({ENV_PREFIX}JWT_SECRET or {ENV_PREFIX}JWT_JWKS_URL) "
                f"needs {ENV_PREFIX}JWT_AUDIENCE and {ENV_PREFIX}JWT_ISSUER: the `aud` and "
                "`iss` your IdP puts in tokens for this API"
            )
        if self.chat_run_store == "redis" and self.chat_redis_url is None:
            raise ValueError(
                f"{ENV_PREFIX}CHAT_RUN_STORE=redis needs {ENV_PREFIX}CHAT_REDIS_URL "
                "(redis://host:6379/0)"
            )
        egress_dev = (
            self.local_egress_hosts is not None
            or self.local_egress_permit
            or self.local_egress_upstream_ca
        )
        if egress_dev and self.auth_mode != "dev":
            raise ValueError(
                f"{ENV_PREFIX}LOCAL_EGRESS_* are for dev mode only, never a deployment"
            )
        if self.demo_model and self.auth_mode != "dev":
            raise ValueError(f"{ENV_PREFIX}DEMO_MODEL is for dev mode only, never a deployment")
        if self.store == "s3" and not self.s3.bucket:
            raise ValueError(f"{ENV_PREFIX}STORE=s3 needs {ENV_PREFIX}S3__BUCKET")
        if self.service_token is not None and len(self.service_token.get_secret_value()) < 16:
            raise ValueError(f"{ENV_PREFIX}SERVICE_TOKEN must be at least 16 characters")
        return self
