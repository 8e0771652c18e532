"""Request and response models of the public API (v1).

Naming: every field of the public API is snake_case, in requests and answers alike (the
seed's ``file_upload_config``, ``max_file_size``…). The custom resources keep Kubernetes'
camelCase; ``UploadConfig`` converts between the two, so no camelCase name reaches a client.
A file's models, and their mappings from the runtime's and the store's shapes, are in
``file_models``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from sandbox_workspace.operator.models import FileUploadConfig

from .backends.base import Session, SessionStatus
from .file_models import StoredFile, WorkspaceFile
from .identity import MAX_USER_ID


def _integral(value: object) -> object:
    # JSON Schema's "integer" includes 28.0; strict models would refuse it.
    return int(value) if isinstance(value, float) and value.is_integer() else value


def json_int(**constraints: int) -> Any:
    """An integer as JSON Schema means it (``28.0`` is one; ``"28"`` is not). The bounds
    go before the validator, else pydantic documents them as ``ge`` instead of ``minimum``."""
    return Annotated[int, Field(**constraints), BeforeValidator(_integral)]


_FileSize = json_int(ge=1)
_FileCount = json_int(ge=1, le=100_000)
_Ttl = json_int(ge=60)
_EXTENSION = r"^\s*\.?[A-Za-z0-9_+\-]+\s*$"


class UploadConfig(BaseModel):
    """Upload limits of a session (seed 000 §5), in the API's snake_case."""

    model_config = ConfigDict(extra="forbid", strict=True)

    max_file_size: _FileSize = Field(
        100, description="Largest accepted file, in `max_file_size_unit`."
    )
    max_file_size_unit: Literal["B", "KB", "MB", "GB"] = Field(
        "MB", description="Unit of `max_file_size`."
    )
    max_file_count: _FileCount = Field(50, description="Most uploads per conversation.")
    allowed_file_types: list[str] = Field(
        default_factory=lambda: list(FileUploadConfig().allowed_file_types),
        description="Accepted file extensions without the dot (`csv`); empty accepts every type.",
        json_schema_extra={"items": {"type": "string", "pattern": _EXTENSION}},
    )

    @model_validator(mode="after")
    def _normalised(self) -> UploadConfig:
        # The CRD model's rules (extension syntax, normalisation) are the one definition.
        try:
            spec = FileUploadConfig.model_validate(self.model_dump())
        except ValidationError as e:
            raise ValueError("; ".join(err["msg"] for err in e.errors())) from None
        self.allowed_file_types = spec.allowed_file_types
        return self

    def to_spec(self) -> FileUploadConfig:
        return FileUploadConfig.model_validate(self.model_dump())

    @classmethod
    def of(cls, spec: FileUploadConfig) -> UploadConfig:
        return cls.model_validate(spec.model_dump(by_alias=False))


class SessionConfig(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    session_id: str | None = Field(
        None, description="Must be `sb-session-{user_id}` of the caller if given (else 403)."
    )
    file_upload_config: UploadConfig | None = Field(
        None,
        description="Upload limits; the file size may not exceed the platform's ceiling "
        "(the `maximum` per unit below).",
    )
    ttl: _Ttl | None = Field(None, description="Seconds until the session is deleted.")


class CreateSessionRequest(BaseModel):
    """seed 000 §4.2 CreateSessionReq."""

    model_config = ConfigDict(extra="ignore", strict=True)

    user_id: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_USER_ID,
        description="Must be the authenticated caller's id if given (else 403).",
    )
    agent_id: str = Field("", max_length=253)
    business_domain_id: str = Field("", max_length=253)
    config: SessionConfig = Field(default_factory=SessionConfig)


class SessionResponse(BaseModel):
    """seed 000 §4.2 Create/GetSessionResp, plus what a frontend needs to show."""

    session_id: str
    status: Literal["pending", "running", "stopped", "error"]
    created_at: int = Field(description="Unix seconds")
    ttl: int = Field(
        description="The session's TTL in seconds, counted from created_at (the kubernetes "
        "backend deletes it then; the local backend does not); 0 means no TTL"
    )
    user_id: str
    agent_id: str
    business_domain_id: str
    workspace_path: str
    message: str = ""
    file_upload_config: UploadConfig
    info: dict[str, str] = Field(
        description="Seed 000 §4.2's free-form `info` map: the session's workspace path, "
        "user, agent and business domain (the same values as the fields above)."
    )

    @classmethod
    def of(cls, s: Session) -> SessionResponse:
        return cls(
            session_id=s.session_id,
            status=_reported_status(s),
            created_at=int(s.created_at.timestamp()),
            ttl=s.spec.ttl_seconds or 0,
            user_id=s.spec.user_id,
            agent_id=s.spec.agent_id,
            business_domain_id=s.spec.business_domain_id,
            workspace_path=s.workspace_path,
            message=s.message,
            file_upload_config=UploadConfig.of(s.spec.file_upload),
            info={
                "workspace_path": s.workspace_path,
                "user_id": s.spec.user_id,
                "agent_id": s.spec.agent_id,
                "business_domain_id": s.spec.business_domain_id,
            },
        )


def _reported_status(s: Session) -> str:
    """A resume asked for and not yet acted on is ``pending``: the backend still holds the
    old ``stopped``/``error``, which the seed's client (§3.2) would take as a failure."""
    if s.resume_pending and s.status in (SessionStatus.STOPPED, SessionStatus.ERROR):
        return SessionStatus.PENDING.value
    return s.status.value


class SessionDeleted(BaseModel):
    session_id: str
    deleted: bool = True


class ConversationDeletion(BaseModel):
    session_id: str
    conversation_id: str
    status: Literal["deleted", "deleting"] = Field(
        description="`deleted` (files verified gone) or `deleting` (in progress)"
    )


# -- conversation state (seed 003 "workspace information") ------------------------------


class ConversationState(BaseModel):
    session_id: str
    conversation_id: str
    status: Literal["ready", "deleting", "absent"] = Field(
        description="`ready`: usable; `deleting`: deletion in progress (writes answer 409); "
        "`absent`: no files (never used, or deleted)."
    )
    path: str = Field(description="The conversation directory as code in the sandbox sees it.")
    file_count: int = Field(description="Every file in the directory (uploads, outputs, other).")
    total_size: int = Field(description="Their bytes.")
    uploads: list[WorkspaceFile]
    outputs: list[WorkspaceFile]
    outputs_truncated: bool = Field(False, description="More outputs exist than were listed.")


class ConversationSummary(BaseModel):
    conversation_id: str
    status: Literal["ready", "deleting", "absent"]


class ConversationList(BaseModel):
    session_id: str
    conversations: list[ConversationSummary]


class RunSummary(BaseModel):
    run_id: str
    conversation_id: str
    state: Literal["running", "awaiting_approval", "finished"]
    started_at: datetime
    finished: bool
    awaiting_approval: bool
    last_event_id: int = Field(description="Re-attach with `Last-Event-ID` (0: from the start).")
    events_url: str


class RunList(BaseModel):
    session_id: str
    conversation_id: str
    runs: list[RunSummary]


class StreamToken(BaseModel):
    run_id: str
    token: str = Field(description="Send as `?token=` to the events URL; grants only that.")
    expires_at: int = Field(description="Unix seconds.")
    events_url: str = Field(description="The events URL with the token, for EventSource.")


class WorkspaceInfo(BaseModel):
    """Seed 003's workspace information of a conversation."""

    conversation_id: str
    session_id: str
    workspace_enabled: bool
    workspace_path: str = Field(description="The conversation directory as code opens it.")
    store_prefix: str = Field(description="Key prefix of its objects in the bucket.")
    workspace_created_at: datetime | None = Field(description="First file operation.")
    file_count: int
    total_size: int
    files: list[StoredFile] = Field(description="Active files.")


class WorkspaceSettings(BaseModel):
    model_config = ConfigDict(strict=True)  # JSON types as documented: no 0 for false

    workspace_enabled: bool = Field(
        description="false: uploads, executions and tool calls in it answer 409."
    )
