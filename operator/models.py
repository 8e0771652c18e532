"""Typed models of the custom resources (the single source of the CRD schemas).

Contract:
- ``SandboxSessionSpec/Status`` and ``ConversationWorkspaceSpec/Status`` are what the
  custom resources hold; ``crds/*.yaml`` is rendered from them (``operator/crdgen.py``),
  so a field added here appears in the CRD, with its description, on the next render.
- Field names are camelCase on the wire (Kubernetes convention) and snake_case in Python;
  ``populate_by_name`` lets the API accept the seed's snake_case JSON as well.
- Every field has a description: it is what ``kubectl explain`` shows.
- Spec models refuse unknown fields; status models ignore them (an older operator must
  be able to read what a newer one wrote).
- The names of the resources, labels, annotations and the finalizer are the contract's
  (``sandbox_workspace/contract/crd.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from sandbox_workspace.contract.ids import (
    CRD_CONVERSATION_ID_PATTERN,
    CRD_MAX_BYTES,
    CRD_NAME_PATTERN,
    CRD_NOT_DOTS,
    check_conversation_id,
    check_user_id,
    pydantic_rule,
)
from sandbox_workspace.contract.quantity import parse_bytes
from sandbox_workspace.egress.cluster import placeholder_env, reserved_env
from sandbox_workspace.egress.policy import EgressPolicy, PolicyError, Rule, SecretBinding
from sandbox_workspace.runtime.settings import RuntimeSettings

from . import naming

SizeUnit = Literal["B", "KB", "MB", "GB"]
_UNIT_BYTES = {"B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3}

# seed 000 §5.2 defaults
DEFAULT_ALLOWED_FILE_TYPES = ("csv", "xlsx", "json", "txt", "pkl", "png", "jpg", "pdf")

# Kubernetes' resource.Quantity, as controller-gen writes it.
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
Quantity = int | Annotated[str, Field(pattern=QUANTITY_PATTERN)]
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


def _immutable(what: str) -> dict:
    """CEL rule making a field write-once (the apiserver refuses a change)."""
    return {"rule": "self == oldSelf", "message": f"{what} is immutable"}


def _cel(*rules: dict) -> dict:
    return {"x-kubernetes-validations": list(rules)}


class CamelModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class StatusModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class FileUploadConfig(CamelModel):
    """Upload limits of one session (seed 000 §5)."""

    max_file_size: int = Field(
        100, ge=1, description="Largest accepted file, in `maxFileSizeUnit`."
    )
    max_file_size_unit: SizeUnit = Field(
        "MB", description="Unit of `maxFileSize`: B, KB, MB or GB."
    )
    max_file_count: int = Field(50, ge=1, le=100_000, description="Most uploads per conversation.")
    allowed_file_types: list[str] = Field(
        default_factory=lambda: list(DEFAULT_ALLOWED_FILE_TYPES),
        description="Accepted file extensions without the dot; empty accepts every type.",
    )

    @field_validator("max_file_size_unit", mode="before")
    @classmethod
    def _upper_unit(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @field_validator("allowed_file_types")
    @classmethod
    def _normalise_types(cls, value: list[str]) -> list[str]:
        out = []
        for item in value:
            ext = item.strip().lower().lstrip(".")
            if not ext or not ext.isascii() or not all(c.isalnum() or c in "-_+" for c in ext):
                raise ValueError(f"'{item}' is not a file extension (letters/digits, e.g. 'csv')")
            out.append(ext)
        return out

    @property
    def max_file_size_bytes(self) -> int:
        return self.max_file_size * _UNIT_BYTES[self.max_file_size_unit]


class ResourceList(CamelModel):
    """Amounts of compute resources (Kubernetes quantities, e.g. `500m`, `1Gi`)."""

    cpu: Quantity | None = Field(None, description="CPU, in cores or millicores (`500m`).")
    memory: Quantity | None = Field(None, description="Memory, in bytes (`512Mi`, `2Gi`).")
    ephemeral_storage: Quantity | None = Field(
        None,
        alias="ephemeral-storage",
        description="Node-local scratch space (`/tmp`, logs), in bytes (`1Gi`).",
    )

    def as_dict(self) -> dict[str, str]:
        return {k: str(v) for k, v in self.model_dump(by_alias=True, exclude_none=True).items()}


class Resources(CamelModel):
    """Requests and limits of the runtime container; unset keys use the operator's
    defaults (SANDBOX_OPERATOR_DEFAULT_RESOURCES)."""

    requests: ResourceList | None = Field(
        None, description="Guaranteed resources the scheduler reserves for the sandbox."
    )
    limits: ResourceList | None = Field(
        None, description="Hard ceilings; a sandbox exceeding memory or storage is evicted."
    )


class StorageSpec(CamelModel):
    """Where `/workspace` lives."""

    persistent: bool = Field(
        True,
        description="Keep the workspace on a PersistentVolumeClaim, so files survive idle "
        "stops and pod restarts. When false, an emptyDir that dies with the pod.",
    )
    size: Annotated[str, Field(pattern=QUANTITY_PATTERN)] = Field(
        "1Gi", description="Size of the claim, or the emptyDir's sizeLimit (`1Gi`)."
    )
    storage_class_name: str | None = Field(
        None, description="StorageClass of the claim; unset uses the cluster's default."
    )


class NetworkSpec(CamelModel):
    """Network access of executed code."""

    enabled: bool = Field(
        False,
        description="Let code open sockets (SANDBOX_RUNTIME_NETWORK=allow). Off: the "
        "runtime denies TCP bind/connect and every socket but socketpairs and netlink "
        "(UDP, unix, vsock, raw) to every process it starts for code.",
    )


EGRESS_MAX_RULES = 100


class EgressRule(CamelModel):
    """One destination code may reach through the egress proxy."""

    host: str = Field(
        min_length=1,
        max_length=255,
        description="A host name exactly (`pypi.org`) or every name below a suffix "
        "(`*.pythonhosted.org`, not the suffix itself). Never an IP address.",
    )
    ports: list[int] = Field(
        default_factory=lambda: [443],
        min_length=1,
        max_length=16,
        description="Ports allowed on that host (1-65535).",
    )
    schemes: list[Literal["http", "https"]] = Field(
        default_factory=lambda: ["https"],
        min_length=1,
        max_length=2,
        description="`https`: a CONNECT tunnel carrying TLS to that very name; `http`: "
        "plain requests the proxy forwards.",
    )

    @model_validator(mode="after")
    def _valid(self) -> EgressRule:
        # The proxy's own rules decide what is valid (one definition of a host name).
        try:
            Rule.make(self.host, self.ports, self.schemes)
        except PolicyError as exc:
            raise ValueError(str(exc)) from None
        return self


EGRESS_MAX_SECRETS = 16


class SecretKeyRef(CamelModel):
    """A key of a Kubernetes Secret in the session's own namespace."""

    name: str = Field(
        min_length=1,
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="The Secret's name (the platform creates it, labelled "
        '`sandboxworkspace.io/egress-secret: "true"`; the egress proxy reads no other).',
    )
    key: str = Field(
        min_length=1,
        max_length=253,
        pattern=r"^[-._a-zA-Z0-9]+$",
        description="The key in the Secret's data holding the value.",
    )


class EgressSecret(CamelModel):
    """A secret the egress proxy puts into requests to one host; the sandbox holds only a
    placeholder (in the environment variable ``env``), never the value."""

    name: str = Field(
        min_length=1, max_length=63, description="The binding's name (`a-z`, `0-9`, `-`)."
    )
    host: str = Field(
        min_length=1, max_length=253, description="The one exact host it is sent to (HTTPS)."
    )
    header: str = Field(
        "authorization",
        min_length=1,
        max_length=64,
        description="The request header that carries it (`authorization`: after `Bearer `).",
    )
    prefix: str | None = Field(
        None,
        max_length=64,
        description="Text before the value in the header (default `Bearer ` for "
        "Authorization, nothing otherwise).",
    )
    env: str | None = Field(
        None,
        max_length=128,
        pattern=r"^[A-Z_][A-Z0-9_]*$",
        description="The variable holding the placeholder in the sandbox (default "
        "`SBW_SECRET_<NAME>`).",
    )
    secret_key_ref: SecretKeyRef = Field(description="Where the proxy reads the value.")

    @model_validator(mode="after")
    def _valid(self) -> EgressSecret:
        try:  # the proxy's own rules (one definition of a binding)
            SecretBinding.make(self.name, self.host, header=self.header, prefix=self.prefix)
        except PolicyError as exc:
            raise ValueError(str(exc)) from None
        if reserved_env(self.env_name):
            raise ValueError(f"egress secret {self.name!r}: {self.env_name} is the platform's")
        return self

    @property
    def env_name(self) -> str:
        return self.env or placeholder_env(self.name)


class EgressSpec(CamelModel):
    """An egress policy: what code may reach by name through the egress proxy. Deny by
    default: no rules, nothing reachable; no policy at all, no network."""

    rules: list[EgressRule] = Field(
        default_factory=list,
        max_length=EGRESS_MAX_RULES,
        description=f"Allowed destinations (at most {EGRESS_MAX_RULES}); an empty list "
        "allows nothing.",
    )
    secrets: list[EgressSecret] = Field(
        default_factory=list,
        max_length=EGRESS_MAX_SECRETS,
        description="Secrets injected by the egress proxy on requests to their host (set "
        "by the platform on the SandboxSession; the API's egress calls change only "
        "`rules`). The sandbox sees a placeholder in an environment variable; its pod "
        "is replaced when these change.",
    )

    @model_validator(mode="after")
    def _unique(self) -> EgressSpec:
        for what in ("name", "env_name"):
            seen = [getattr(s, what) for s in self.secrets]
            if len(seen) != len(set(seen)):
                raise ValueError(f"egress secrets: each needs its own {what.split('_')[0]}")
        return self

    @classmethod
    def of(cls, policy: EgressPolicy) -> EgressSpec:
        return cls(
            rules=[
                EgressRule(host=r.host, ports=sorted(r.ports), schemes=sorted(r.schemes))
                for r in policy.rules
            ]
        )

    def policy(self) -> EgressPolicy:
        """The proxy's form of this policy."""
        return EgressPolicy(tuple(Rule.make(r.host, r.ports, r.schemes) for r in self.rules))


# Defaults of ExecutionLimits: inside the sandbox pod's default limits (1Gi memory, 1Gi
# workspace, 256Mi /tmp) with room for the runtime itself (~100 MiB).
DEFAULT_MEMORY_LIMIT = "512Mi"
DEFAULT_CPU_SECONDS = 300
DEFAULT_FILE_SIZE_LIMIT = "256Mi"
DEFAULT_CONVERSATION_SIZE = "512Mi"
_SIZE_MINIMUMS = {
    "memory": 64 * 2**20,  # an interpreter with numpy needs more address space than this
    "file_size": 1024,
    "conversation_size": 2**20,
}


class ExecutionLimits(CamelModel):
    """What one execution of code may use (seed 001 §4.9.3); a limit hit ends that
    execution with its own error code, never the runtime nor another conversation."""

    memory: Quantity = Field(
        DEFAULT_MEMORY_LIMIT,
        description="Memory of one execution's processes, in bytes or a quantity (`512Mi`): "
        "each process's address space (RLIMIT_AS; a Python allocation beyond it raises "
        "MemoryError, the interpreter keeps its state) and the resident memory of the "
        "execution's whole process tree (killed past it: memory_limit_exceeded). At least "
        "64Mi.",
    )
    cpu_seconds: int = Field(
        DEFAULT_CPU_SECONDS,
        ge=1,
        le=86400,
        description="CPU time of one execution's process tree, in seconds (all cores "
        "summed); past it the tree is killed: cpu_limit_exceeded. Every process also has "
        "RLIMIT_CPU.",
    )
    file_size: Quantity = Field(
        DEFAULT_FILE_SIZE_LIMIT,
        description="Largest file a code process may write (RLIMIT_FSIZE), in bytes or a "
        "quantity: a write beyond it fails (EFBIG): file_too_large. At least 1Ki.",
    )
    conversation_size: Quantity = Field(
        DEFAULT_CONVERSATION_SIZE,
        description="Bytes a conversation may hold (its directory plus its scratch "
        "space), enforced while code runs: an execution that grows it past this is "
        "killed (conversation_quota_exceeded; overshoot at most what the code writes in "
        "0.5 s); an upload that would take it past this is refused (413, nothing "
        "written). At least 1Mi.",
    )

    @field_validator("memory", "file_size", "conversation_size")
    @classmethod
    def _size(cls, value: int | str, info) -> int | str:
        minimum = _SIZE_MINIMUMS[info.field_name]
        if parse_bytes(value) < minimum:
            raise ValueError(f"{value!r} is below the minimum of {minimum} bytes")
        return value

    @property
    def memory_bytes(self) -> int:
        return parse_bytes(self.memory)

    @property
    def file_size_bytes(self) -> int:
        return parse_bytes(self.file_size)

    @property
    def conversation_size_bytes(self) -> int:
        return parse_bytes(self.conversation_size)

    def runtime_env(self) -> dict[str, str]:
        """The runtime's settings (runtime/settings.py) carrying these limits, in bytes."""
        return RuntimeSettings.env(
            limit_memory=self.memory_bytes,
            limit_cpu_seconds=self.cpu_seconds,
            limit_file_size=self.file_size_bytes,
            limit_conversation_size=self.conversation_size_bytes,
        )


class SandboxSessionSpec(CamelModel):
    """One user's sandbox: a pod running the runtime, with the user's workspace."""

    user_id: str = Field(
        min_length=1,
        max_length=253,
        pattern=CRD_NAME_PATTERN,
        description="The platform's user id (verbatim; the resource name is its DNS slug). "
        "A name as the runtime accepts it: no '/', '\\', control characters or surrounding "
        "whitespace, not '.' or '..'.",
        json_schema_extra=_cel(_immutable("userId"), CRD_NOT_DOTS, CRD_MAX_BYTES),
    )
    agent_id: str | None = Field(None, max_length=253, description="Agent the session serves.")
    business_domain_id: str | None = Field(
        None, max_length=253, description="Business domain the user belongs to (seed 000)."
    )
    idle_timeout_seconds: int = Field(
        1800,
        ge=0,
        description="Stop the pod (keeping the workspace) after this many seconds without "
        "activity; running executions count as activity. 0 never stops.",
    )
    ttl_seconds: int | None = Field(
        None,
        ge=1,
        description="Delete the session and all its files this many seconds after "
        "creation. Unset keeps it until deleted.",
    )
    file_upload_config: FileUploadConfig = Field(
        default_factory=FileUploadConfig,
        description="Upload limits enforced by the runtime (seed 000 §5).",
    )
    resources: Resources | None = Field(
        None, description="Container resources; unset keys use the operator's defaults."
    )
    image: str | None = Field(
        None, min_length=1, description="Runtime image; unset uses the operator's default."
    )
    storage: StorageSpec = Field(
        default_factory=StorageSpec,
        description="Where the workspace is kept. Immutable: the files live there, and the "
        "deletion guarantee follows them (a change would strand them on the old storage).",
        json_schema_extra=_cel(_immutable("storage")),
    )
    network: NetworkSpec = Field(
        default_factory=NetworkSpec,
        description="Network access of the code the sandbox runs (off by default).",
    )
    egress: EgressSpec | None = Field(
        None,
        description="Egress by name through the platform's egress proxy (deny by "
        "default; changeable on a live session). Unset: no egress policy, no network "
        "beyond what `network` and the cluster's NetworkPolicy allow.",
    )
    limits: ExecutionLimits = Field(
        default_factory=ExecutionLimits,
        description="Memory, CPU time, file size and conversation size of each execution "
        "of code (the API's SANDBOX_WORKSPACE_LIMITS__* for new sessions).",
    )

    # "before": the runtime's own message says what is wrong, not the pattern's.
    _user_rule = field_validator("user_id", mode="before")(pydantic_rule(check_user_id))


# The workspace root a runtime names (``status.workspacePath``): an absolute path with no
# NUL, at most PATH_MAX long — what a runtime's answer must look like to be recorded.
WORKSPACE_PATH_MAX = 4096
WORKSPACE_PATH_PATTERN = r"^/[^\x00]*$"


def workspace_path_of(value: object) -> str | None:
    """``value`` when it is a workspace path a status may record (a string, absolute, no
    NUL, at most ``WORKSPACE_PATH_MAX`` characters); else None. A runtime's answer is
    never trusted to have that shape: this is its one check."""
    if not isinstance(value, str) or len(value) > WORKSPACE_PATH_MAX:
        return None
    return value if value.startswith("/") and "\x00" not in value else None


SessionPhase = Literal["Pending", "Running", "Stopped", "Error"]
WorkspacePhase = Literal["Pending", "Ready", "Deleting", "Error"]


class Condition(StatusModel):
    """One observation about the resource, in the Kubernetes condition convention."""

    type: str = Field(description="What is observed: Ready, Stopped, Expired, ...")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="CamelCase machine-readable cause of the last transition.")
    message: str = Field("", description="Human-readable detail.")
    last_transition_time: datetime | None = Field(None, description="When `status` last changed.")


class SandboxSessionStatus(StatusModel):
    """What the operator observed of the session (written only by the operator)."""

    phase: SessionPhase | None = Field(
        None, description="Pending, Running, Stopped (idle; resumes on use) or Error."
    )
    pod_name: str | None = Field(None, description="Name of the sandbox pod.")
    pod_ip: str | None = Field(None, alias="podIP", description="IP address of the sandbox pod.")
    endpoint: str | None = Field(None, description="URL of the runtime (`http://{podIP}:8080`).")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready, Stopped and Expired conditions, each with reason and message.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    last_activity_time: datetime | None = Field(
        None, description="Last request or operation the runtime reported."
    )
    started_at: datetime | None = Field(None, description="When the current pod started.")
    started_from: Literal["pool", "cold"] | None = Field(
        None,
        description="How the current pod started: `pool` (a ready pod claimed from the "
        "warm pool) or `cold` (created for this session).",
    )
    workspace_path: str | None = Field(
        None,
        max_length=WORKSPACE_PATH_MAX,
        pattern=WORKSPACE_PATH_PATTERN,
        description="The workspace root as code in the current pod sees it, as its runtime "
        "named it (its claim's answer, or its first stats); unset until then.",
    )
    expires_at: datetime | None = Field(
        None, description="When `ttlSeconds` deletes the session (unset: never)."
    )
    observed_generation: int | None = Field(
        None, description="The `metadata.generation` this status describes."
    )

    # A reader drops a path of another shape rather than refuse the whole status (the
    # apiserver refuses one anyway; a later release may widen the rule).
    _workspace_path = field_validator("workspace_path", mode="before")(workspace_path_of)


class ConversationWorkspaceSpec(CamelModel):
    """One conversation's directory inside its user's sandbox session."""

    conversation_id: str = Field(
        min_length=1,
        max_length=255,
        pattern=CRD_CONVERSATION_ID_PATTERN,
        description="The conversation id; the directory is `/workspace/{conversationId}`. "
        "One directory name as the runtime accepts it: no '/', '\\', control characters, "
        "leading '.' or surrounding whitespace; at most 255 bytes in UTF-8.",
        json_schema_extra=_cel(_immutable("conversationId"), CRD_MAX_BYTES),
    )
    session_ref: str = Field(
        min_length=1,
        max_length=63,
        pattern=DNS_LABEL_PATTERN,
        description="Name of the SandboxSession (same namespace) holding the directory.",
        json_schema_extra=_cel(_immutable("sessionRef")),
    )
    agent_id: str | None = Field(None, max_length=253, description="Agent of the conversation.")
    user_id: str | None = Field(
        None,
        max_length=253,
        pattern=CRD_NAME_PATTERN,
        description="User owning the conversation (the rules of SandboxSession `userId`).",
        json_schema_extra=_cel(CRD_NOT_DOTS, CRD_MAX_BYTES),
    )

    _id_rule = field_validator("conversation_id", mode="before")(
        pydantic_rule(check_conversation_id)
    )
    # "before": the runtime's own message says what is wrong, not the pattern's.
    _user_rule = field_validator("user_id", mode="before")(pydantic_rule(check_user_id))


class ConversationWorkspaceStatus(StatusModel):
    """What the operator observed of the directory."""

    phase: WorkspacePhase | None = Field(
        None, description="Pending, Ready, Deleting (files being removed) or Error."
    )
    path: str | None = Field(None, description="The directory as code in the sandbox sees it.")
    file_count: int | None = Field(None, description="Files in the directory (all subdirectories).")
    total_bytes: int | None = Field(None, description="Bytes of those files.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready and Deleting conditions with reason and message.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    observed_generation: int | None = Field(
        None, description="The `metadata.generation` this status describes."
    )


class SandboxSession(BaseModel):
    """A SandboxSession as read from the cluster: the metadata the operator uses, and the
    typed spec and status. ``from_body`` raises ``pydantic.ValidationError`` on a spec
    the models refuse (which the apiserver should already have refused)."""

    model_config = ConfigDict(frozen=True)

    name: str
    namespace: str
    uid: str = ""
    generation: int | None = None
    creation_timestamp: datetime | None = None
    deletion_timestamp: datetime | None = None
    annotations: dict[str, str] = Field(default_factory=dict)
    spec: SandboxSessionSpec
    status: SandboxSessionStatus = Field(default_factory=SandboxSessionStatus)

    @property
    def legacy_children(self) -> bool:
        """Its pod, Secret and claim keep the names of before 2026-11-28 (naming)."""
        return naming.legacy_children(self.annotations)

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> SandboxSession:
        meta = body.get("metadata", {})
        return cls(
            name=meta["name"],
            namespace=meta.get("namespace", ""),
            uid=meta.get("uid", ""),
            generation=meta.get("generation"),
            creation_timestamp=meta.get("creationTimestamp"),
            deletion_timestamp=meta.get("deletionTimestamp"),
            annotations=dict(meta.get("annotations") or {}),
            spec=SandboxSessionSpec.model_validate(body.get("spec") or {}),
            status=SandboxSessionStatus.model_validate(body.get("status") or {}),
        )


class ConversationWorkspace(BaseModel):
    """A ConversationWorkspace as read from the cluster (see ``SandboxSession``)."""

    model_config = ConfigDict(frozen=True)

    name: str
    namespace: str
    uid: str = ""
    generation: int | None = None
    deletion_timestamp: datetime | None = None
    spec: ConversationWorkspaceSpec
    status: ConversationWorkspaceStatus = Field(default_factory=ConversationWorkspaceStatus)

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> ConversationWorkspace:
        meta = body.get("metadata", {})
        return cls(
            name=meta["name"],
            namespace=meta.get("namespace", ""),
            uid=meta.get("uid", ""),
            generation=meta.get("generation"),
            deletion_timestamp=meta.get("deletionTimestamp"),
            spec=ConversationWorkspaceSpec.model_validate(body.get("spec") or {}),
            status=ConversationWorkspaceStatus.model_validate(body.get("status") or {}),
        )
