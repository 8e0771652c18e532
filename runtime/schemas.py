"""Wire models of the runtime's HTTP interface (also used by the API and the operator)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, Field, field_validator

UPLOAD_SUBDIR = "temparea"
MAX_MARK_PATH = 4096  # bytes of a path in a marks report (PATH_MAX)
MAX_MARKS_PER_REPORT = 1000


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
    modified: bool = Field(
        False,
        description="True when executed code changed the file after the upload (its bytes "
        "or its inode: write, chmod, link): size is the current one, sha256 the uploaded "
        "bytes' digest.",
    )
    presented: bool = Field(False, description="A run presented this file to the user.")


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
    complete: bool = Field(
        True,
        description="False when the tree was too large or partly unreadable to count "
        "whole: file_count and total_bytes are then lower bounds.",
    )


class ConversationIds(BaseModel):
    conversations: list[str] = Field(description="Conversation ids, sorted.")


class ConversationDeleted(BaseModel):
    conversation_id: str
    deleted: bool = Field(description="False when there was nothing to delete.")
    exists: bool = Field(False, description="Always false on success: verified gone.")


class ConfinementReport(BaseModel):
    """What confines executed code in this runtime (see runtime/confinement.py)."""

    mode: str = Field(description="The setting: auto, require or none.")
    confined: bool = Field(description="Executed code runs under Landlock.")
    landlock_abi: int = Field(description="The kernel's Landlock ABI; 0 = unavailable.")
    network: str = Field(
        description="TCP for code: denied, allowed, proxy (only the egress relay, in a "
        "network namespace of its own) or unrestricted."
    )
    features: list[str] = Field(description="Measures applied (filesystem, tcp, scope_signal…).")
    reason: str = Field(description="Empty when fully confined; else what is missing and why.")


class RuntimeStats(BaseModel):
    status: str = "ok"
    workspace_path: str
    started_at: datetime
    last_activity_at: datetime
    active_operations: int
    conversations: int
    confinement: ConfinementReport | None = None


class Health(BaseModel):
    status: str = "ok"
    # What this runtime's release takes beyond the first release's routes (an API asks
    # before using one: runtimes of an older release run on through an upgrade).
    features: list[str] = Field(default_factory=list)


# -- code execution -------------------------------------------------------------------

MAX_CODE_BYTES = 256 * 1024

# A process stream (``…/processes``, ``…/processes/{pid}/events``) sends
# ``{"type": "keepalive"}`` after this many seconds without an event, and says so in the
# header: a follower may take a much longer silence for a dead connection (a runtime
# that does not send the header — an older one — gets no such deadline).
PROCESS_KEEPALIVE_SECONDS = 15.0
KEEPALIVE_HEADER = "x-sandbox-keepalive-seconds"


class ExecuteRequest(BaseModel):
    """Run code in a conversation's directory."""

    language: Literal["python", "bash"] = Field(
        description="`python` runs in the conversation's persistent interpreter; `bash` runs "
        "a fresh process per call."
    )
    code: str = Field(min_length=1, description=f"Source, at most {MAX_CODE_BYTES} bytes.")
    timeout: float = Field(30.0, gt=0, le=3600, description="Wall-clock limit in seconds.")
    read_only: list[str] = Field(
        default_factory=list,
        max_length=50,
        description="`bash` only: names at the top of the conversation's directory that this "
        "call's processes may read but not change in any way (Landlock; the directory's top "
        "level is then read-only too, its subdirectories stay writable). 503 where Landlock "
        "is unavailable.",
    )

    @field_validator("code")
    @classmethod
    def _code_fits(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("code must not be blank")
        if len(value.encode("utf-8", "surrogatepass")) > MAX_CODE_BYTES:
            raise ValueError(f"code is larger than {MAX_CODE_BYTES} bytes")
        if "\x00" in value:
            raise ValueError("code must not contain NUL")
        return value


LimitCode = Literal[
    "memory_limit_exceeded",
    "cpu_limit_exceeded",
    "file_too_large",
    "conversation_quota_exceeded",
]


class ExecutionError(BaseModel):
    name: str = Field(description="Exception class, or TimeoutError / KernelDied.")
    value: str
    traceback: str = ""
    code: LimitCode | None = Field(
        None,
        description="Set when the execution hit one of the session's limits: "
        "memory_limit_exceeded, cpu_limit_exceeded, file_too_large or "
        "conversation_quota_exceeded (the runtime and other conversations are unaffected).",
    )


class DisplayData(BaseModel):
    """A rich result, Jupyter-style: MIME type → content (binary types base64-encoded)."""

    data: dict[str, str]


class ExecutionResult(BaseModel):
    conversation_id: str
    language: str
    stdout: str
    stderr: str
    exit_code: int
    error: ExecutionError | None = None
    results: list[DisplayData] = Field(default_factory=list)
    duration_ms: float
    truncated: bool = Field(False, description="stdout or stderr exceeded its cap.")
    kernel_restarted: bool = Field(
        False,
        description="The conversation's Python state from earlier calls is gone: this call "
        "ended the interpreter (timeout, a limit, the interpreter exiting), or it ended since "
        "the last call (reaped when idle, died). Said once; false on a conversation's first "
        "call, which has no earlier state.",
    )


class KernelRestarted(BaseModel):
    conversation_id: str
    restarted: bool


class ProcessesStopped(BaseModel):
    conversation_id: str
    stopped: bool = Field(True, description="Every process of the conversation is gone.")


# -- agent outputs --------------------------------------------------------------------


class OutputFile(BaseModel):
    """A file under a conversation's outputs/ (written by code, never listed as upload)."""

    relative_path: str = Field(description="Path below outputs/, '/'-separated.")
    path: str = Field(description="Full path as code in the sandbox opens it.")
    size: int
    modified_at: datetime
    mime_type: str
    modified: bool = Field(
        False, description="A run reported it modified this file (it existed before the run)."
    )
    presented: bool = Field(False, description="A run presented this file to the user.")


class ChangedFile(BaseModel):
    path: str = Field(max_length=MAX_MARK_PATH, description="Full path as code opens it.")
    status: Literal["created", "modified"]


class MarksReport(BaseModel):
    """What one run did to a conversation's files (``POST .../marks``)."""

    changed: list[ChangedFile] = Field(default_factory=list, max_length=MAX_MARKS_PER_REPORT)
    presented: list[Annotated[str, Field(max_length=MAX_MARK_PATH)]] = Field(
        default_factory=list, max_length=MAX_MARKS_PER_REPORT
    )


class Marks(BaseModel):
    conversation_id: str
    modified: list[str] = Field(description="Paths runs modified, oldest first.")
    presented: list[str] = Field(description="Paths runs presented, oldest first.")


class OutputBatchRequest(BaseModel):
    """Small outputs to read in one answer (``POST .../outputs-batch``; ``output_batch``)."""

    paths: list[Annotated[str, Field(max_length=4096)]] = Field(max_length=512)
    max_bytes: int = Field(ge=0, description="Bytes of files the answer may hold at most.")


# An outputs listing's default window (result events, present_file) and the largest one
# asked for (the store's write-back and fill, which must see every output to lose none).
DEFAULT_OUTPUTS_LISTED = 2000
MAX_OUTPUTS_LISTED = 100_000


class OutputList(BaseModel):
    conversation_id: str
    path: str
    files: list[OutputFile]
    truncated: bool = Field(False, description="More files exist than were listed.")


class SnapshotRequest(BaseModel):
    """A snapshot to take (``copies``): its id (conversation-id rules) and a name."""

    snapshot_id: str
    name: str = ""


class ForkRequest(BaseModel):
    """The conversation to fill, from the live one or from ``snapshot_id``."""

    conversation_id: str
    snapshot_id: str | None = None
