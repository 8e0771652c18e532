"""Wire models of the runtime's HTTP interface (also used by the API and the operator)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

UPLOAD_SUBDIR = "temparea"


class UploadedFile(BaseModel):
    """One user upload in a conversation's temparea."""

    name: str
    path: str = Field(description="Full path as code in the sandbox opens it.")
    size: int
    sha256: str
    mime_type: str
    uploaded_at: datetime
    conversation_id: str
    subdir: str = UPLOAD_SUBDIR


class UploadResult(UploadedFile):
    replaced: bool = Field(False, description="True when a file of that name was overwritten.")


class UploadList(BaseModel):
    conversation_id: str
    subdir: str = UPLOAD_SUBDIR
    path: str = Field(description="The temparea directory as code in the sandbox sees it.")
    files: list[UploadedFile]


class ConversationInfo(BaseModel):
    conversation_id: str
    exists: bool
    path: str = Field(description="The conversation directory as code in the sandbox sees it.")
    uploads_path: str
    outputs_path: str
    file_count: int = 0
    total_bytes: int = 0


class ConversationDeleted(BaseModel):
    conversation_id: str
    deleted: bool = Field(description="False when there was nothing to delete.")
    exists: bool = Field(False, description="Always false on success: verified gone.")


class RuntimeStats(BaseModel):
    status: str = "ok"
    workspace_path: str
    started_at: datetime
    last_activity_at: datetime
    active_operations: int
    conversations: int


class Health(BaseModel):
    status: str = "ok"
