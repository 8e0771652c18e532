"""Operator settings, from ``SANDBOX_OPERATOR_*`` environment variables (pydantic-settings).

One object per operator process; nested values use ``__``
(``SANDBOX_OPERATOR_DEFAULT_RESOURCES__LIMITS__MEMORY=2Gi``). Lists take JSON or a comma
list (``SANDBOX_OPERATOR_NAMESPACES=team-a,team-b``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from sandbox_workspace.store.settings import S3Settings, StoreMode

from .models import ResourceList, Resources

RUNTIME_PORT = 8080
RUNTIME_UID = 10001


def host_port(value: str) -> tuple[str, int]:
    """``host:port`` (an IPv6 host in brackets) as (host, port): the one parser of
    ``egress_proxy``, checked at start. ValueError naming the value when it is not that
    or the port is not 1-65535."""
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"egress_proxy {value!r}: give host:port (port 1-65535)")
    return host, int(port)


def _default_resources() -> Resources:
    return Resources(
        requests=ResourceList(cpu="100m", memory="256Mi", ephemeral_storage="256Mi"),
        limits=ResourceList(cpu="1", memory="1Gi", ephemeral_storage="1Gi"),
    )


class OperatorSettings(BaseSettings):
    """Everything the operator is told; read once at start-up."""

    model_config = SettingsConfigDict(
        env_prefix="SANDBOX_OPERATOR_", env_nested_delimiter="__", extra="ignore"
    )

    namespaces: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Namespaces to watch (kopf patterns allowed); empty watches the cluster.",
    )
    kubeconfig: Path | None = Field(
        None,
        description="Kubeconfig to use; unset: $KUBECONFIG, ~/.kube/config, then the pod's "
        "service account.",
    )
    image: str = Field(
        "sandbox-workspace:latest",
        description="Runtime image of sessions that name none (the chart passes its own).",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    runtime_class_name: str | None = Field(
        None, description="RuntimeClass of sandbox pods (gVisor, Kata), when the cluster has one."
    )
    default_resources: Resources = Field(
        default_factory=_default_resources,
        description="Resources of sandbox pods, key by key, where the session sets none.",
    )
    confinement: Literal["auto", "require"] = Field(
        "auto",
        description="Landlock confinement of executed code in sandbox pods "
        "(SANDBOX_RUNTIME_CONFINEMENT): auto confines when the node's kernel allows and "
        "reports it (condition Confined); require refuses to run code unconfined.",
    )
    confinement_min_abi: int = Field(
        6,
        ge=1,
        description="With require: the lowest Landlock ABI sandbox pods accept "
        "(SANDBOX_RUNTIME_CONFINEMENT_MIN_ABI; 3: truncate confined, 6: signals scoped).",
    )
    tmp_size_limit: str = Field("256Mi", description="sizeLimit of the /tmp emptyDir.")
    egress_proxy: str | None = Field(
        None,
        description="`host:port` of the egress proxy; sandbox pods get it as "
        "HTTP_PROXY/HTTPS_PROXY (a host name is resolved once at start: sandboxes have no "
        "DNS). Not port 8080, the runtime's own (code may reach the proxy's port on any "
        "address). Unset: no proxy, egress policies are not enforced on this cluster.",
    )
    egress_ca_configmap: str | None = Field(
        None,
        description="ConfigMap (in each session's namespace) with the egress proxy's CA "
        "certificate and trust bundle (`bundle.pem`, no key); sandbox pods of sessions "
        "with an egress policy mount it and get SSL_CERT_FILE, REQUESTS_CA_BUNDLE, "
        "PIP_CERT, NODE_EXTRA_CA_CERTS... pointing at it. Chart: set with "
        "egressProxy.enabled.",
    )
    termination_grace_seconds: int = Field(
        10, ge=0, description="Grace period of sandbox pods (the runtime stops fast)."
    )

    # Warm pool (operator/pool): ready sandbox pods claimed by starting sessions.
    pool_size: int = Field(
        0,
        ge=0,
        le=1000,
        description="Free ready sandbox pods kept in each pool namespace; 0: no pool, "
        "every session starts cold.",
    )
    pool_namespaces: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Namespaces that get a pool (each must be watched); empty: every "
        "namespace in `namespaces` (a cluster-wide operator then has no pool).",
    )
    pool_refill_batch: int = Field(
        5,
        ge=1,
        le=100,
        description="Pool pods starting at once while refilling (created, not ready yet): "
        "bounds the refill's load on the node; the next ones start as these become ready.",
    )

    # Timings. Defaults suit a real cluster; tests shorten them.
    check_interval_seconds: float = Field(
        30.0,
        gt=0,
        description="Sessions are looked at only when a deadline of theirs is due (idle, "
        "TTL); this is the pace of the looks that have none: a busy runtime past its idle "
        "deadline, an unreachable one, the quiet time before an outdated pod is rolled.",
    )
    # 32 and 50, not 8 and 20: 1,000 idle stops at once went p99 40.4 s -> 13.1 s past
    # their deadline (a plain client's floor 9-10 s) — with 8 in flight at ~120 ms each
    # under load, the operator waited on its own semaphore (bench operator --sessions
    # 1000, 2026-11-27 02:12 and 02:20 UTC). Those two runs also differ in py-spy being
    # attached (02:12) and in load, so the step is not concurrency's alone.
    api_concurrency: int = Field(
        32,
        ge=1,
        description="Requests to the apiserver in flight at once (connections kept open); "
        "more wait their turn in the operator.",
    )
    check_concurrency: int = Field(
        50, ge=1, description="Due sessions looked at side by side (each asks its runtime)."
    )
    runtime_timeout_seconds: float = Field(
        10.0, gt=0, description="Timeout of one request to a runtime; slower counts as down."
    )
    retry_max_delay_seconds: float = Field(
        30.0, gt=0, description="Ceiling of the backoff when a runtime is unreachable."
    )
    watch_server_timeout_seconds: int = Field(
        300, ge=10, description="Server-side watch timeout; the watch reconnects after it."
    )

    # Processes around the handlers.
    liveness_endpoint: str | None = Field(
        "http://0.0.0.0:8081/healthz", description="kopf's liveness probe URL; empty disables."
    )
    metrics_port: int | None = Field(
        9090, description="Port of the Prometheus /metrics endpoint; empty disables."
    )
    metrics_host: str = "0.0.0.0"
    standalone: bool = Field(
        True,
        description="Run without kopf peering (one replica). With more replicas set false "
        "and a peering name: only the highest-priority replica handles resources.",
    )
    peering_name: str = Field("sandbox-workspace", description="KopfPeering object name.")
    priority: int = Field(0, description="Peering priority of this replica.")
    peering_lifetime_seconds: int = Field(
        10,
        ge=2,
        description="How long a replica counts as alive after its last keep-alive in the "
        "peering object (kopf renews it every 1-5 s at 10): a killed active replica's "
        "standby takes over after at most this long.",
    )
    identity: str | None = Field(
        None,
        description="This replica's id in the peering object; unset: $POD_ID (the chart "
        "sets the pod's name), else user@host/time/random.",
    )
    log_level: str = "info"
    log_format: Literal["json", "text"] | None = None
    # The object store (SANDBOX_OPERATOR_STORE=s3, SANDBOX_OPERATOR_S3__BUCKET…, the same
    # values as the API's SANDBOX_WORKSPACE_* ones): a ConversationWorkspace's finalizer is
    # released only once no object is left under the conversation's prefix.
    store: StoreMode = Field("local", description="`s3`: conversation files are in a bucket.")
    s3: S3Settings = Field(default_factory=S3Settings, description="Store `s3`: the bucket.")

    @field_validator("namespaces", "pool_namespaces", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        if isinstance(value, str):
            value = value.strip()
            if value.startswith("["):
                import json

                return json.loads(value)
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("liveness_endpoint", "runtime_class_name", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if value == "" else value

    @field_validator("egress_proxy")
    @classmethod
    def _host_and_port(cls, value: str | None) -> str | None:
        # Sandbox code may connect to this port alone (network proxy_port): say at start
        # what is wrong, not when the first sandbox pod is built.
        if value and host_port(value)[1] == RUNTIME_PORT:
            # proxy_port opens the port on every address, not the proxy's alone: on a
            # CNI that does not enforce NetworkPolicy, code would reach every other
            # sandbox's runtime.
            raise ValueError(
                f"egress_proxy {value!r}: port {RUNTIME_PORT} is the sandbox runtime's "
                "own; serve the proxy on another (chart: egressProxy.port, 3128)"
            )
        return value

    @field_validator("metrics_port", mode="before")
    @classmethod
    def _empty_port(cls, value: object) -> object:
        return None if value in ("", 0, "0") else value
