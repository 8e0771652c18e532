"""Request and response models of the public API (v1)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from sandbox_workspace.operator.models import FileUploadConfig
from sandbox_workspace.runtime.schemas import UploadList, UploadResult

from .backends.base import Session


class SessionConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")

    session_id: str | None = Field(None, description="Must be sb-session-{user_id} if given.")
    file_upload_config: FileUploadConfig | None = None
    ttl: int | None = Field(None, ge=60, description="Seconds until the session is deleted.")


class CreateSessionRequest(BaseModel):
    """seed 000 §4.2 CreateSessionReq."""

    model_config = ConfigDict(extra="ignore")

    user_id: str | None = Field(None, description="Must match the caller if given.")
    agent_id: str = Field("", max_length=253)
    business_domain_id: str = Field("", max_length=253)
    config: SessionConfig = Field(default_factory=SessionConfig)


class SessionResponse(BaseModel):
    """seed 000 §4.2 Create/GetSessionResp, plus what a frontend needs to show."""

    session_id: str
    status: str = Field(description="pending, running, stopped or error")
    created_at: int = Field(description="Unix seconds")
    ttl: int = Field(description="Seconds until deletion; 0 means no TTL")
    user_id: str
    agent_id: str
    business_domain_id: str
    workspace_path: str
    message: str = ""
    file_upload_config: FileUploadConfig

    @classmethod
    def of(cls, s: Session) -> SessionResponse:
        return cls(
            session_id=s.session_id,
            status=s.status.value,
            created_at=int(s.created_at.timestamp()),
            ttl=s.spec.ttl_seconds or 0,
            user_id=s.spec.user_id,
            agent_id=s.spec.agent_id,
            business_domain_id=s.spec.business_domain_id,
            workspace_path=s.workspace_path,
            message=s.message,
            file_upload_config=s.spec.file_upload,
        )


class SessionDeleted(BaseModel):
    session_id: str
    deleted: bool = True


class FileUploaded(UploadResult):
    session_id: str


class FileList(UploadList):
    session_id: str


class FileDeleted(BaseModel):
    session_id: str
    conversation_id: str
    name: str
    deleted: bool = True


class ConversationDeletion(BaseModel):
    session_id: str
    conversation_id: str
    status: str = Field(description="'deleted' (files verified gone) or 'deleting' (in progress)")
