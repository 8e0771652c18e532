"""Runtime settings, read from ``SANDBOX_RUNTIME_*`` environment variables or CLI flags.

The runtime knows nothing about Kubernetes: whoever starts it (the operator's pod spec,
the local backend, a test) passes the token, the workspace root and the upload limits —
written by ``RuntimeSettings.env`` (and ``env_name`` for a value from elsewhere, such as
a Secret), the one writer of this environment: a field name it does not know raises
there, so a misspelt setting fails the writer's test instead of being ignored here.
Reading stays lenient (``extra="ignore"``): a runtime of an older release, meeting a
setting a newer writer added (during an upgrade), starts and ignores it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from sandbox_workspace.contract.quantity import parse_bytes

from .limits import Limits

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_CODE_ENV_BYTES = 64 * 1024


class RuntimeSettings(BaseSettings):
    """One settings object per runtime process."""

    model_config = SettingsConfigDict(env_prefix="SANDBOX_RUNTIME_", extra="ignore")

    token: SecretStr | None = Field(
        default=None, description="Bearer token every request but /healthz must present."
    )
    token_file: Path | None = Field(
        default=None, description="File holding the token (read once at start-up)."
    )
    claim_key: SecretStr | None = Field(
        default=None,
        description="A pooled runtime: starts with no token and accepts exactly one "
        "`POST /v1/claim` authenticated by this key, which sets the token (runtime/claim.py).",
    )
    root: Path = Field(default=Path("/workspace"), description="Workspace root on disk.")
    workspace_path: str | None = Field(
        default=None,
        description="The root as code in the sandbox sees it (defaults to `root`); "
        "file paths reported to clients start with it.",
    )
    host: str = "0.0.0.0"
    port: int = 8080
    max_file_size_bytes: int = Field(default=100 * 1024 * 1024, ge=1)
    max_file_count: int = Field(default=50, ge=1)
    allowed_file_types: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="File extensions accepted for upload, without dots; empty allows all.",
    )

    output_cap_bytes: int = Field(
        1024 * 1024, ge=1024, description="Per execution, per stream (stdout, stderr)."
    )
    max_results: int = Field(
        100, ge=1, description="Rich results (display, the last value) kept per execution."
    )
    result_cap_bytes: int = Field(
        8 * 1024 * 1024, ge=1024, description="Bytes of rich results kept per execution."
    )
    max_concurrent_executions: int = Field(8, ge=1)
    max_background_processes: int = Field(
        8,
        ge=1,
        description="Processes that outlive a request (E2B background commands) "
        "running at once per conversation; one more answers 429 too_many_processes.",
    )
    process_buffer_bytes: int = Field(
        1024 * 1024,
        ge=4096,
        description="Output kept per background process (oldest dropped first).",
    )
    max_process_seconds: float = Field(
        3600.0,
        gt=0,
        description="Longest life of a background process; then its tree is killed.",
    )
    max_processes: int = Field(
        512, ge=16, description="Ceiling on processes of executed code (fork bombs stop here)."
    )
    confinement: Literal["auto", "require", "none"] = Field(
        "auto",
        description="`auto`: confine executed code with Landlock when the kernel allows, "
        "say so loudly when not; `require`: refuse to run code unconfined (execute answers "
        "503 confinement_unavailable); `none`: no Landlock (a baseline for benchmarks).",
    )
    confinement_min_abi: int = Field(
        6,
        ge=1,
        description="With `require`: the lowest Landlock ABI accepted (below it execute "
        "answers 503). 1 (Linux 5.13): file access confined, not truncate(2); 2 (5.19): "
        "refer; 3 (6.2): truncate; 4 (6.7): TCP; 5 (6.10): device ioctl; 6 (6.12): "
        "signals and abstract unix sockets scoped (below it code can signal the runtime "
        "and other conversations' interpreters). No ABI mediates chmod, chown, utime, "
        "setxattr or stat.",
    )
    network: Literal["deny", "allow", "proxy", "proxy_port"] = Field(
        "deny",
        description="TCP bind/connect for executed code (Landlock ABI >= 4). `proxy`: only "
        "to the egress relay the runtime runs on 127.0.0.1:`egress_relay_port`, which "
        "forwards to `egress_socket`; the runtime refuses to start with it unless its "
        "network namespace has nothing but loopback (the local backend's bubblewrap). "
        "`proxy_port`: IPv4 TCP connect to `egress_proxy_port` alone, no UDP (a sandbox "
        "pod with an egress policy: its NetworkPolicy narrows the address to the "
        "cluster's egress proxy; this keeps code at one port where no policy is enforced).",
    )
    egress_proxy_port: int | None = Field(
        None, ge=1, le=65535, description="With network `proxy_port`: the proxy's port."
    )
    code_env: dict[str, str] = Field(
        default_factory=dict,
        description="Variables executed code sees beside the runtime's own (which win on "
        "a clash): the egress proxy's address, its CA's trust variables, the placeholders "
        "of bound secrets. JSON object in the environment.",
    )
    egress_socket: Path | None = Field(
        None, description="With network `proxy`: the egress proxy's Unix socket."
    )
    egress_relay_port: int = Field(
        3128, ge=1, le=65535, description="With network `proxy`: the relay's port."
    )
    limit_memory: int | None = Field(
        None,
        description="Memory of one execution (bytes or a quantity such as 512Mi): each "
        "code process's address space and the tree's resident memory. Unset with the "
        "other limit_* settings: no limits (set all four or none).",
    )
    limit_cpu_seconds: int | None = Field(
        None, ge=1, description="CPU seconds of one execution's process tree."
    )
    limit_file_size: int | None = Field(
        None, description="Largest file a code process may write (bytes or a quantity)."
    )
    limit_conversation_size: int | None = Field(
        None, description="Bytes a conversation may hold while code runs (bytes or a quantity)."
    )
    session_memory: int | None = Field(
        None,
        description="Ceiling on the memory of all executed code together (bytes or a "
        "quantity); past it the execution holding the most is stopped. Unset: the pod's "
        "limit is the ceiling (the local backend sets one: a machine has no pod).",
    )
    kernel_idle_seconds: float = Field(
        1800.0, gt=0, description="A Python interpreter unused this long is stopped."
    )

    @field_validator(
        "limit_memory", "limit_file_size", "limit_conversation_size", "session_memory",
        mode="before",
    )  # fmt: skip
    @classmethod
    def _size(cls, value: object) -> object:
        return parse_bytes(value) if value is not None else None

    @model_validator(mode="after")
    def _all_or_no_limits(self) -> RuntimeSettings:
        given = [self.limit_memory, self.limit_cpu_seconds, self.limit_file_size]
        given.append(self.limit_conversation_size)
        if any(v is not None for v in given) and any(v is None for v in given):
            raise ValueError(
                "set every SANDBOX_RUNTIME_LIMIT_* (MEMORY, CPU_SECONDS, FILE_SIZE, "
                "CONVERSATION_SIZE) or none"
            )
        return self

    @model_validator(mode="after")
    def _proxy_needs_socket(self) -> RuntimeSettings:
        if self.network == "proxy" and self.egress_socket is None:
            raise ValueError("network `proxy` needs SANDBOX_RUNTIME_EGRESS_SOCKET")
        if self.network == "proxy_port" and self.egress_proxy_port is None:
            raise ValueError("network `proxy_port` needs SANDBOX_RUNTIME_EGRESS_PROXY_PORT")
        return self

    @field_validator("code_env")
    @classmethod
    def _code_env_names(cls, value: dict[str, str]) -> dict[str, str]:
        return check_code_env(value)

    def connect_port(self) -> int | None:
        """The one TCP port executed code may connect to (None: network's own rule)."""
        if self.network == "proxy":
            return self.egress_relay_port
        return self.egress_proxy_port if self.network == "proxy_port" else None

    @classmethod
    def env_name(cls, field: str) -> str:
        """The environment variable of one field (``KeyError`` for a name it has not)."""
        if field not in cls.model_fields:
            raise KeyError(f"RuntimeSettings has no setting {field!r}")
        return f"{cls.model_config['env_prefix']}{field.upper()}"

    @classmethod
    def env(cls, **values: Any) -> dict[str, str]:
        """The environment starting a runtime with these settings, in the order given:
        ``SANDBOX_RUNTIME_<FIELD>`` per value (a list comma-separated, None left out).
        The values are validated as the runtime will read them, so what is written is
        what starts; an unknown field name raises ``KeyError``."""
        given = {k: v for k, v in values.items() if v is not None}
        names = {k: cls.env_name(k) for k in given}
        _Given(**given)  # the runtime's own checks, on these values alone
        return {names[k]: _env_value(v) for k, v in given.items()}

    def limits(self) -> Limits | None:
        if self.limit_memory is None:
            return None
        return Limits(
            memory=self.limit_memory,
            cpu_seconds=self.limit_cpu_seconds or 0,
            file_size=self.limit_file_size or 0,
            conversation_size=self.limit_conversation_size or 0,
        )

    @field_validator("allowed_file_types", mode="before")
    @classmethod
    def _split_types(cls, value: object) -> object:
        # Accept "csv,xlsx" from an environment variable as well as a JSON list.
        if isinstance(value, str):
            value = [part for part in value.replace(" ", ",").split(",") if part]
        if isinstance(value, list):
            return [str(v).lower().lstrip(".") for v in value]
        return value

    def resolved_token(self) -> str | None:
        """The bearer token; None for a pooled runtime (a claim key and no token)."""
        if self.pooled:
            return None
        if self.token is not None and self.token.get_secret_value():
            return self.token.get_secret_value()
        if self.token_file is not None:
            return self.token_file.read_text().strip()
        raise ValueError(
            "the runtime needs a bearer token: set SANDBOX_RUNTIME_TOKEN or "
            "SANDBOX_RUNTIME_TOKEN_FILE"
        )

    @property
    def pooled(self) -> bool:
        given = self.token is not None and self.token.get_secret_value()
        return bool(self.claim_key and self.claim_key.get_secret_value()) and not given

    @property
    def visible_root(self) -> str:
        return (self.workspace_path or str(self.root)).rstrip("/") or "/"


class _Given(RuntimeSettings):
    """RuntimeSettings from the values given only: ``env`` checks what it writes without
    this process's own environment taking part."""

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, **_sources):
        return (init_settings,)


def check_code_env(value: dict[str, str]) -> dict[str, str]:
    """``code_env`` as code may get it: variable names only, at most 64 KiB in all."""
    for name in value:
        if not _ENV_NAME.fullmatch(name):
            raise ValueError(f"code_env: {name!r} is not an environment variable name")
    if sum(len(k) + len(v) for k, v in value.items()) > _CODE_ENV_BYTES:
        raise ValueError(f"code_env: more than {_CODE_ENV_BYTES} bytes")
    return value


def _env_value(value: Any) -> str:
    if isinstance(value, dict):  # read back as JSON, as pydantic-settings reads a dict
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
