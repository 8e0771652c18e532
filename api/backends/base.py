"""The backend interface: where sessions live and how to reach their runtimes.

Two implementations share it: ``local`` (runtime processes on loopback) and
``kubernetes`` (custom resources reconciled by the operator). Everything above it — the
ensure-session loop, file proxying, identity — is backend-agnostic, which is what lets
the whole API suite run without a cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Protocol

from sandbox_workspace.operator.models import FileUploadConfig
from sandbox_workspace.runtime.errors import Conflict


class SessionStatus(StrEnum):
    """The seed's four states (000 §4.2 GetSessionResp)."""

    PENDING = "pending"
    RUNNING = "running"
    STOPPED = "stopped"
    ERROR = "error"


class ConversationPhase(StrEnum):
    """Where a conversation's files are (INTERFACES.md; provisional until apidel's lands)."""

    READY = "ready"
    DELETING = "deleting"
    ABSENT = "absent"


@dataclass(frozen=True)
class SessionSpec:
    """What a caller asks for when creating a session."""

    session_id: str
    user_id: str
    agent_id: str = ""
    business_domain_id: str = ""
    file_upload: FileUploadConfig = field(default_factory=FileUploadConfig)
    ttl_seconds: int | None = None


@dataclass(frozen=True)
class RuntimeEndpoint:
    url: str
    token: str


@dataclass(frozen=True)
class Session:
    spec: SessionSpec
    status: SessionStatus
    created_at: datetime
    workspace_path: str
    message: str = ""
    endpoint: RuntimeEndpoint | None = None

    @property
    def session_id(self) -> str:
        return self.spec.session_id


class SessionExists(Conflict):
    """A session with that id exists already."""

    code = "session_exists"


class Backend(Protocol):
    async def start(self) -> None: ...

    async def aclose(self) -> None: ...

    async def get_session(self, session_id: str) -> Session | None: ...

    async def create_session(self, spec: SessionSpec) -> Session:
        """Create and start; raises ``SessionExists``. Returns without waiting to run."""

    async def resume_session(self, session_id: str) -> Session:
        """Start a stopped or failed session again, keeping its files."""

    async def delete_session(self, session_id: str) -> bool:
        """Delete the session and all its files; False when there was none."""

    async def wait_changed(self, session_id: str, timeout: float) -> None:
        """Return when the session may have changed, at the latest after ``timeout``."""

    async def record_activity(self, session_id: str) -> None:
        """Note activity the runtime cannot see (open chat runs, pending approvals)."""

    async def conversation_opened(self, session: Session, conversation_id: str) -> None:
        """Record that a conversation is in use (the kubernetes backend creates its CR)."""

    async def conversation_phase(self, session: Session, conversation_id: str) -> ConversationPhase:
        """Whether the conversation's files exist, are being deleted, or are absent."""

    async def delete_conversation(self, session: Session, conversation_id: str) -> bool:
        """Delete a conversation's files. True when deletion is complete on return,
        False when it was requested and completes asynchronously (finalizer)."""
