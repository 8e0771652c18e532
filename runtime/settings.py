"""Runtime settings, read from ``SANDBOX_RUNTIME_*`` environment variables or CLI flags.

The runtime knows nothing about Kubernetes: whoever starts it (the operator's pod spec,
the local backend, a test) passes the token, the workspace root and the upload limits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


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
    max_concurrent_executions: int = Field(8, ge=1)
    max_processes: int = Field(
        512, ge=16, description="Ceiling on processes of executed code (fork bombs stop here)."
    )
    confinement: Literal["auto", "require", "none"] = Field(
        "auto",
        description="`auto`: confine executed code with Landlock when the kernel allows, "
        "say so loudly when not; `require`: refuse to run code unconfined (execute answers "
        "503 confinement_unavailable); `none`: no Landlock (a baseline for benchmarks).",
    )
    network: Literal["deny", "allow"] = Field(
        "deny", description="TCP bind/connect for executed code (Landlock ABI >= 4)."
    )
    kernel_idle_seconds: float = Field(
        1800.0, gt=0, description="A Python interpreter unused this long is stopped."
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
