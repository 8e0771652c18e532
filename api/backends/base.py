"""The backend interface: where sessions live and how to reach their runtimes.

Two implementations share it: ``local`` (runtime processes on loopback) and
``kubernetes`` (custom resources reconciled by the operator). Everything above it — the
ensure-session loop, file proxying, identity — is backend-agnostic, which is what lets
the whole API suite run without a cluster.
"""

from __future__ import annotations

import json
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict, dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Protocol

from sandbox_workspace.contract.errors import Conflict, Unavailable
from sandbox_workspace.egress.policy import EgressPolicy
from sandbox_workspace.operator.models import FileUploadConfig


class SessionStatus(StrEnum):
    """The seed's four states (000 §4.2 GetSessionResp)."""

    PENDING = "pending"
    RUNNING = "running"
    STOPPED = "stopped"
    ERROR = "error"


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
    # Which runtime answers there (kubernetes: the pod and its start): a new pod keeps
    # the session's token and may reuse an address, yet its workspace starts empty.
    incarnation: str = ""
    # The runtime listens on this Unix socket (local backend, a network namespace per
    # session); ``url`` is then only a label.
    unix_socket: str = ""


@dataclass(frozen=True)
class Session:
    spec: SessionSpec
    status: SessionStatus
    created_at: datetime
    workspace_path: str
    message: str = ""
    endpoint: RuntimeEndpoint | None = None
    # Being deleted (kubernetes: deletionTimestamp set): no traffic may reach it.
    terminating: bool = False
    # A resume was requested and the operator has not acted on it yet: its status is
    # from before the resume and must not be judged (an old Error is not a new one).
    resume_pending: bool = False

    @property
    def session_id(self) -> str:
        return self.spec.session_id


class SessionExists(Conflict):
    """A session with that id exists already."""

    code = "session_exists"


class SessionTerminating(Unavailable):
    """The session is being deleted; a new one can be started once it is gone."""

    code = "session_terminating"
    retry_after = 2


class ConversationPhase(StrEnum):
    """Where a conversation stands with respect to deletion."""

    READY = "ready"  # tracked (kubernetes: its ConversationWorkspace exists)
    DELETING = "deleting"  # deletion accepted, files not yet verified gone
    ABSENT = "absent"  # never opened, or deleted: the next write starts it afresh


@dataclass(frozen=True)
class ForkOrigin:
    """What a fork makes its new conversation from: recorded by the backend in the same
    step that creates the conversation (``Backend.fork_opened``), so a fork cut off before
    anything else of it was written is still told from any other conversation."""

    conversation_id: str
    snapshot_id: str | None

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    @classmethod
    def parse(cls, text: str | None) -> ForkOrigin | None:
        """The origin ``text`` records; None for none, or for anything not of its shape
        (read as "not made by a fork": the safe side, a 409)."""
        try:
            doc = json.loads(text or "")
            origin = cls(doc["conversation_id"], doc["snapshot_id"])
        except (ValueError, TypeError, KeyError):
            return None
        ok = isinstance(origin.conversation_id, str) and isinstance(
            origin.snapshot_id, (str, type(None))
        )
        return origin if ok else None


@dataclass
class StoreFence:
    """One writer's hold on a conversation's store prefix (``Backend.store_writing``).
    ``late`` is set on leaving when the deletion may have gone past this writer (its
    hold outlived its lease while the conversation was being deleted, or the
    conversation is gone): the writer must then remove what it wrote itself."""

    late: bool = False


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

    async def egress_policy(self, session_id: str) -> EgressPolicy | None:
        """The session's egress policy; None: no network leaves it. KeyError: no session."""

    async def set_egress_policy(self, session_id: str, policy: EgressPolicy | None) -> None:
        """Change it on a live session: the next connection out is judged by it."""

    async def wait_changed(self, session_id: str, timeout: float) -> Session | None:
        """Return when the session may have changed, at the latest after ``timeout``: the
        session as the change left it when the backend has it at hand (no look-up), else
        None (the caller looks it up)."""

    async def record_activity(self, session_id: str) -> None:
        """Note activity the runtime cannot see (open chat runs, pending approvals)."""

    async def conversation_phase(
        self, session: Session, conversation_id: str
    ) -> ConversationPhase: ...

    async def conversation_opened(self, session: Session, conversation_id: str) -> None:
        """Make sure the conversation is tracked before anything of it is written (the
        kubernetes backend creates its CR, finalizer included); raises
        ``ConversationDeleting`` while it is being deleted. Cheap when already known."""

    async def conversation_created(self, session: Session, conversation_id: str) -> None:
        """``conversation_opened`` for an id the caller has just made at random and never
        given out (an E2B sandbox's): nothing of it can exist anywhere yet, so a store
        has nothing to fill or refuse — tracked, with no store round trip."""

    async def fork_opened(self, session: Session, conversation_id: str, origin: ForkOrigin) -> None:
        """As ``conversation_opened``, for a new conversation a fork makes: ``origin`` is
        recorded in the step that creates it (kubernetes: an annotation in the
        ConversationWorkspace's create; local: a record in the API's data directory
        written before its directory is made), where no code in a sandbox can write.
        ``Conflict`` (409 ``conversation_exists``) when the conversation exists already,
        unless the same fork made it (its recorded origin is ``origin``)."""

    async def fork_origin(self, session: Session, conversation_id: str) -> ForkOrigin | None:
        """The origin ``fork_opened`` recorded with the conversation; None for one made
        otherwise."""

    async def delete_conversation(self, session: Session, conversation_id: str) -> bool:
        """Delete a conversation's files. True when deletion is complete on return,
        False when it was requested and completes asynchronously (finalizer)."""

    async def conversation_written(self, session: Session, conversation_id: str) -> None:
        """After a write that may have raced a deletion: leave no untracked files behind.
        Still tracked → nothing; being deleted → the files are deleted (the finalizer
        may have looked already) and ``ConversationDeleting`` raised; gone → tracked
        afresh (the write counts as the first of a new conversation)."""

    def store_writing(
        self, session: Session, conversation_id: str
    ) -> AbstractAsyncContextManager[StoreFence]:
        """Around every write to the conversation's store prefix (store mode): entering
        raises ``ConversationDeleting`` when the conversation is being deleted or gone;
        while held, a deletion does not count the prefix empty — so no object can land
        under a prefix the deletion already found empty."""


class EgressUnavailable(Conflict):
    """This backend cannot enforce an egress policy (so it keeps none)."""

    code = "egress_unavailable"


class ConversationExists(Conflict):
    """The conversation a fork was to make exists already, and not as that fork's."""

    code = "conversation_exists"


class NameTaken(Conflict):
    """The name (resource or directory) holds another owner's object: never shared."""

    code = "name_taken"
