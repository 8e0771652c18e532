"""The ``local`` backend: every session is a runtime process on 127.0.0.1.

Contract:
- A session is a directory ``{data_dir}/sessions/{dns_name(session_id)}/`` holding
  ``session.json`` (the spec), ``workspace/`` (the runtime's root, kept while the session
  exists, also across restarts of the API), ``run/`` (the runtime's port file: the only
  part its sandbox sees) and ``runtime.log``.
- Whose directory is in its ``session.json``, not its name: at start each session is
  found where its record is (a directory made before 2026-11-28 keeps its legacy 32-bit
  name and files), and a new session never takes a directory whose record names another
  session (409 ``name_taken``) — it is never overwritten or shared.
- Its runtime is started on create and on resume, on port 0 (the real port comes back
  through a port file), with a fresh bearer token and the session's upload limits.
  Status: no process → ``stopped``; starting → ``pending``; answering health →
  ``running``; exited without being asked to → ``error``.
- Conversations are tracked in-process: one being deleted (from the API's acceptance of
  the deletion until the runtime confirmed it gone) is DELETING and refuses writes with
  409 ``conversation_deleting``; the runtime refuses them too while it deletes (its own
  409, relayed). A conversation whose directory exists is READY, else ABSENT. A fork's
  new conversation has its origin recorded in the API's data directory before its
  directory is made (``fork_opened``, ``local_forks``), forgotten with its deletion.
- ``delete_conversation`` never starts a runtime: a session that is down has its
  conversation deleted in this process (the runtime's own ``Workspace`` deletion), under
  the session's lock so that no runtime starts on the directory meanwhile — and with it
  the scratch a runtime killed before its clean stop left (``runtime/scratch.py``), as
  ``delete_session`` removes that before the session's directory.
- Idle stop, as the operator's: a running runtime idle for the session idle timeout
  (``idle_timeout_seconds``; unset: the custom resource's default; 0 never) by the
  runtime's rule (``runtime/idleness.py``: its own activity, or the API's
  ``record_activity``; never with an operation in flight) is stopped, its files kept; its
  status reads ``stopped`` and the next use resumes it, as an idle-stopped pod's does.
  The runtime is asked for its stats only once the quiet time it last reported could
  have reached the timeout, and once more under the session's lock before the stop.
- ``aclose`` stops every runtime; each child also gets SIGTERM from the kernel if the API
  process dies (``PR_SET_PDEATHSIG``), so no runtime outlives its API.
- With ``egress`` (bubblewrap, network not ``allow``): each runtime and its code run in a
  network namespace of their own whose one way out is the egress proxy, the runtime
  listening on a Unix socket (``local_egress``). The session's egress policy
  (``egress_policy``/``set_egress_policy``) is kept in ``session.json`` and applies to
  the next connection; no policy, no network. Without ``egress`` setting a policy is
  refused (409 ``egress_unavailable``): nothing would enforce it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import secrets
import shutil
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx

from sandbox_workspace.contract.errors import ConversationDeleting
from sandbox_workspace.egress.policy import EgressPolicy
from sandbox_workspace.operator.models import FileUploadConfig, SandboxSessionSpec
from sandbox_workspace.operator.naming import dns_name
from sandbox_workspace.runtime import idleness
from sandbox_workspace.runtime.gate import DeletionGate
from sandbox_workspace.runtime.schemas import ConversationDeleted
from sandbox_workspace.runtime.scratch import ScratchLeft, remove_recorded
from sandbox_workspace.runtime.settings import RuntimeSettings
from sandbox_workspace.runtime.workspace import DeletionIncomplete, Workspace

from ..quotas import QuotaExceeded
from ..runtime_client import RuntimeClient
from .base import (
    ConversationExists,
    ConversationPhase,
    EgressUnavailable,
    ForkOrigin,
    NameTaken,
    RuntimeEndpoint,
    Session,
    SessionExists,
    SessionSpec,
    SessionStatus,
    StoreFence,
)
from .bwrap import SANDBOX_WORKSPACE, bwrap_argv
from .local_egress import LocalEgress, policy_from_json, policy_to_json
from .local_forks import ForkRecords

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
_STOP_GRACE_SECONDS = 5.0
_POLL_SECONDS = 0.05
_START_TIMEOUT_SECONDS = 30.0
# The operator's default when no idle timeout is set: one meaning on both backends.
DEFAULT_IDLE_TIMEOUT_SECONDS: int = SandboxSessionSpec.model_fields["idle_timeout_seconds"].default
_IDLE_CHECK_MAX_SECONDS = 30.0
# What a runtime inherits from us; everything else (our secrets included) stays behind.
_INHERITED_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "PYTHONPATH", "VIRTUAL_ENV")


def _die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class _Record:
    """What ``session.json`` holds."""

    session_id: str
    user_id: str
    agent_id: str
    business_domain_id: str
    created_at: str
    ttl_seconds: int | None
    file_upload: dict
    egress: list[dict] | None = None  # the egress policy's rules (local_egress)

    @classmethod
    def from_spec(cls, spec: SessionSpec) -> _Record:
        return cls(
            session_id=spec.session_id,
            user_id=spec.user_id,
            agent_id=spec.agent_id,
            business_domain_id=spec.business_domain_id,
            created_at=datetime.now(UTC).isoformat(),
            ttl_seconds=spec.ttl_seconds,
            file_upload=spec.file_upload.model_dump(),
        )

    def spec(self) -> SessionSpec:
        return SessionSpec(
            session_id=self.session_id,
            user_id=self.user_id,
            agent_id=self.agent_id,
            business_domain_id=self.business_domain_id,
            file_upload=FileUploadConfig.model_validate(self.file_upload),
            ttl_seconds=self.ttl_seconds,
        )


@dataclass
class _Process:
    proc: asyncio.subprocess.Process
    token: str
    port_file: Path
    endpoint: RuntimeEndpoint | None = None
    unix_socket: str = ""  # the runtime listens there, not on a port (egress namespaces)
    stopping: bool = False
    error: str = ""
    # The latest activity known without asking the runtime again (its start, at first).
    active_at: datetime = field(default_factory=lambda: datetime.now(UTC))


def check_conversation_quota(workspace: Path, conversation_id: str, cap: int) -> None:
    """Refuse a new conversation once ``workspace`` holds ``cap`` (a known one passes)."""
    if (workspace / conversation_id).is_dir() or not workspace.is_dir():
        return
    with os.scandir(workspace) as entries:
        held = sum(1 for e in entries if e.is_dir() and not e.name.startswith("."))
    if held >= cap:
        raise QuotaExceeded("conversations of this user", cap, "conversations_per_user")


def session_runtime_env(token: str, root: str | Path, upload: FileUploadConfig) -> dict[str, str]:
    """The runtime settings of one session's runtime: its token, root and upload limits."""
    return RuntimeSettings.env(
        token=token,
        root=str(root),
        max_file_size_bytes=upload.max_file_size_bytes,
        max_file_count=upload.max_file_count,
        allowed_file_types=upload.allowed_file_types,
    )


class LocalBackend:
    def __init__(
        self,
        data_dir: Path,
        http: httpx.AsyncClient,
        *,
        bwrap: str | None = None,
        runtime_command: list[str] | None = None,
        runtime_env: dict[str, str] | None = None,
        max_conversations: int | None = None,
        idle_timeout_seconds: float | None = None,
        egress: LocalEgress | None = None,
    ) -> None:
        """``bwrap``: path of bubblewrap to present workspaces at /workspace, or None;
        ``runtime_env``: further SANDBOX_RUNTIME_* settings of every runtime (confinement,
        network); ``max_conversations``: conversations one session may hold;
        ``idle_timeout_seconds``: stop a runtime idle this long (None: the custom
        resource's default; 0: never); ``egress``: a network namespace per session whose
        one way out is the egress proxy (needs ``bwrap``)."""
        if egress is not None and not bwrap:
            raise ValueError("egress namespaces need bubblewrap")
        self.egress = egress
        self.max_conversations = max_conversations
        self.idle_timeout = (
            DEFAULT_IDLE_TIMEOUT_SECONDS if idle_timeout_seconds is None else idle_timeout_seconds
        )
        self.data_dir = data_dir.resolve()
        self.sessions_dir = self.data_dir / "sessions"
        self.forks = ForkRecords(self.data_dir)
        self.http = http
        self.bwrap = bwrap
        self.runtime_command = runtime_command or [
            sys.executable,
            "-m",
            "sandbox_workspace",
            "runtime",
        ]
        self.runtime_env = dict(runtime_env or {})
        self._records: dict[str, _Record] = {}
        self._dirs: dict[str, Path] = {}  # session id → the directory its record is in
        self._procs: dict[str, _Process] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._waiters: set[asyncio.Task] = set()
        self._deleting = DeletionGate()  # (session, conversation) being deleted
        self._api_activity: dict[str, datetime] = {}  # session id → record_activity's time
        self._reaper: asyncio.Task | None = None
        self._running = asyncio.Event()  # some runtime process may run: the idle stop looks

    # -- lifecycle of the backend ------------------------------------------------------

    async def start(self) -> None:
        self.sessions_dir.mkdir(parents=True, exist_ok=True)
        if self.egress is not None:
            await self.egress.start()
        for path in self.sessions_dir.glob("*/session.json"):
            try:
                record = _Record(**json.loads(path.read_text()))
                policy = policy_from_json(record.egress)
            except (ValueError, TypeError) as e:
                log.warning("ignoring unreadable session record %s: %s", path, e)
                continue
            self._records[record.session_id] = record
            if self.egress is not None and policy is not None:
                self.egress.set_policy(record.session_id, policy)
            self._dirs[record.session_id] = path.parent
        if self.idle_timeout > 0:
            self._reaper = asyncio.create_task(self._stop_idle_runtimes())

    async def aclose(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        await asyncio.gather(*(self._stop(sid) for sid in list(self._procs)))
        for task in list(self._waiters):
            task.cancel()
        if self.egress is not None:
            await self.egress.aclose()

    # -- sessions ------------------------------------------------------------------------

    def _dir(self, session_id: str) -> Path:
        return self._dirs.get(session_id) or self.sessions_dir / dns_name(session_id)

    def _lock(self, session_id: str) -> asyncio.Lock:
        return self._locks.setdefault(session_id, asyncio.Lock())

    def workspace_dir(self, session_id: str) -> Path:
        return self._dir(session_id) / "workspace"

    async def get_session(self, session_id: str) -> Session | None:
        record = self._records.get(session_id)
        if record is None:
            return None
        status, message, endpoint = self._status(session_id)
        return Session(
            spec=record.spec(),
            status=status,
            created_at=datetime.fromisoformat(record.created_at),
            workspace_path=SANDBOX_WORKSPACE if self.bwrap else str(self.workspace_dir(session_id)),
            message=message,
            endpoint=endpoint,
        )

    def _status(self, session_id: str) -> tuple[SessionStatus, str, RuntimeEndpoint | None]:
        p = self._procs.get(session_id)
        if p is None:
            return SessionStatus.STOPPED, "no runtime process; the next use starts one", None
        if p.proc.returncode is not None:
            detail = p.error or f"runtime exited with code {p.proc.returncode}"
            return SessionStatus.ERROR, detail, None
        if p.error:
            return SessionStatus.ERROR, p.error, None
        if p.endpoint is None:
            return SessionStatus.PENDING, "runtime is starting", None
        return SessionStatus.RUNNING, "", p.endpoint

    async def create_session(self, spec: SessionSpec) -> Session:
        async with self._lock(spec.session_id):
            if spec.session_id in self._records:
                raise SessionExists(f"session '{spec.session_id}' already exists")
            record = _Record.from_spec(spec)
            directory = self._dir(spec.session_id)
            _refuse_taken(directory, spec.session_id)
            (directory / "workspace").mkdir(parents=True, exist_ok=True)
            _write_json(directory / "session.json", asdict(record))
            self._records[spec.session_id] = record
            self._dirs[spec.session_id] = directory
            await self._spawn(record)
        session = await self.get_session(spec.session_id)
        assert session is not None
        return session

    async def resume_session(self, session_id: str) -> Session:
        async with self._lock(session_id):
            record = self._records.get(session_id)
            if record is None:
                raise KeyError(session_id)
            status, _, _ = self._status(session_id)
            if status in (SessionStatus.STOPPED, SessionStatus.ERROR):
                await self._stop(session_id)
                await self._spawn(record)
        session = await self.get_session(session_id)
        assert session is not None
        return session

    async def delete_session(self, session_id: str) -> bool:
        async with self._lock(session_id):
            if session_id not in self._records:
                return False
            await self._stop(session_id)
            # What a runtime killed before its clean stop left in the temporary directory
            # (its record is in the workspace, about to go): the session stays until it is gone.
            try:
                await asyncio.to_thread(remove_recorded, self.workspace_dir(session_id))
            except (ScratchLeft, OSError) as e:
                raise DeletionIncomplete(
                    f"session '{session_id}': scratch space could not be deleted ({e}); retry"
                ) from e
            del self._records[session_id]
            self._api_activity.pop(session_id, None)
            if self.egress is not None:
                self.egress.set_policy(session_id, None)
                await self.egress.close(session_id)
            await asyncio.to_thread(shutil.rmtree, self._dir(session_id), True)
            await asyncio.to_thread(self.forks.forget_session, session_id)
            self._dirs.pop(session_id, None)
        return True

    async def egress_policy(self, session_id: str) -> EgressPolicy | None:
        """The session's egress policy (None: no network); KeyError for no session."""
        self._need_egress()
        record = self._records.get(session_id)
        if record is None:
            raise KeyError(session_id)
        return policy_from_json(record.egress)

    async def set_egress_policy(self, session_id: str, policy: EgressPolicy | None) -> None:
        """Kept in the session's record; the proxy applies it to the next connection."""
        egress = self._need_egress()
        async with self._lock(session_id):
            record = self._records.get(session_id)
            if record is None:
                raise KeyError(session_id)
            record.egress = policy_to_json(policy)
            _write_json(self._dir(session_id) / "session.json", asdict(record))
            egress.set_policy(session_id, policy)

    def _need_egress(self) -> LocalEgress:
        if self.egress is None:  # code's network is the host's (or none): say so, not null
            raise EgressUnavailable(
                "this API does not enforce egress policies: the local backend needs "
                "bubblewrap and SANDBOX_WORKSPACE_SESSION_NETWORK=deny for them"
            )
        return self.egress

    async def wait_changed(self, session_id: str, timeout: float) -> None:
        # Process state changes are not signalled; a short poll is cheap on one machine.
        await asyncio.sleep(min(timeout, _POLL_SECONDS))
        return None  # the caller looks it up

    async def record_activity(self, session_id: str) -> None:
        self._api_activity[session_id] = datetime.now(UTC)

    async def conversation_phase(self, session: Session, conversation_id: str) -> ConversationPhase:
        if self._deleting.is_deleting((session.session_id, conversation_id)):
            return ConversationPhase.DELETING
        directory = self.workspace_dir(session.session_id) / conversation_id
        exists = await asyncio.to_thread(directory.is_dir)
        return ConversationPhase.READY if exists else ConversationPhase.ABSENT

    async def conversation_opened(self, session: Session, conversation_id: str) -> None:
        # The runtime creates directories on first write; a deletion and the cap matter.
        if self._deleting.is_deleting((session.session_id, conversation_id)):
            raise ConversationDeleting(conversation_id)
        await asyncio.to_thread(self._open, session.session_id, conversation_id)

    def _open(self, session_id: str, conversation_id: str) -> None:
        workspace = self.workspace_dir(session_id)
        if (workspace / conversation_id).is_dir():
            return  # known: the hot path, one stat
        # New: made otherwise than by a fork, so no fork's record (one cut off before its
        # directory was made) may claim it later.
        self.forks.forget(session_id, conversation_id)
        if self.max_conversations is not None:
            check_conversation_quota(workspace, conversation_id, self.max_conversations)

    async def fork_opened(self, session: Session, conversation_id: str, origin: ForkOrigin) -> None:
        """The origin recorded before the directory exists (the runtime makes it next):
        killed between the two, the record is there and the conversation absent — the
        same fork again starts afresh, another use of the id forgets the record."""
        sid = session.session_id
        if self._deleting.is_deleting((sid, conversation_id)):
            raise ConversationDeleting(conversation_id)

        def open_fork() -> None:
            workspace = self.workspace_dir(sid)
            if (workspace / conversation_id).is_dir():
                if self.forks.read(sid, conversation_id) != origin:
                    raise ConversationExists(f"conversation '{conversation_id}' exists already")
                return
            if self.max_conversations is not None:
                check_conversation_quota(workspace, conversation_id, self.max_conversations)
            self.forks.record(sid, conversation_id, origin)

        await asyncio.to_thread(open_fork)

    async def fork_origin(self, session: Session, conversation_id: str) -> ForkOrigin | None:
        return await asyncio.to_thread(self.forks.read, session.session_id, conversation_id)

    conversation_created = conversation_opened  # nothing more to know here

    async def conversation_written(self, session: Session, conversation_id: str) -> None:
        # Deletion here is synchronous and the runtime refuses commits while it deletes:
        # a write that landed either came before (and is deleted) or starts afresh after.
        return None

    @contextlib.asynccontextmanager
    async def store_writing(
        self, session: Session, conversation_id: str
    ) -> AsyncIterator[StoreFence]:
        # One process: the store backend's lock per conversation, held by its writers and
        # by its deletion of the prefix, orders them; only a deletion under way refuses.
        if self._deleting.is_deleting((session.session_id, conversation_id)):
            raise ConversationDeleting(conversation_id)
        yield StoreFence()

    async def delete_conversation(self, session: Session, conversation_id: str) -> bool:
        """Through the running runtime; a session that is down stays down: its workspace
        is deleted here, under the session's lock (no start or resume meanwhile)."""
        sid = session.session_id
        with self._deleting.deleting((sid, conversation_id)):
            async with self._lock(sid):
                if sid not in self._records:
                    return True  # the session went, and its files with it
                status, endpoint = await self._settled(sid)
                if status == SessionStatus.RUNNING and endpoint is not None:
                    result = await RuntimeClient(self.http, endpoint).delete_conversation(
                        conversation_id
                    )
                else:
                    await self._stop(sid)  # a failed runtime may still be alive
                    result = await asyncio.to_thread(
                        _delete_offline, self.workspace_dir(sid), conversation_id
                    )
                if not result.exists:
                    await asyncio.to_thread(self.forks.forget, sid, conversation_id)
        return not result.exists

    async def _settled(self, session_id: str) -> tuple[SessionStatus, RuntimeEndpoint | None]:
        """The status once a runtime being started is ready or failed (bounded by its
        start-up timeout)."""
        deadline = time.monotonic() + _START_TIMEOUT_SECONDS
        while True:
            status, _, endpoint = self._status(session_id)
            if status != SessionStatus.PENDING or time.monotonic() >= deadline:
                return status, endpoint
            await asyncio.sleep(_POLL_SECONDS)

    # -- processes -----------------------------------------------------------------------

    async def _spawn(self, record: _Record) -> None:
        sid = record.session_id
        directory = self._dir(sid)
        # The one part of the session's directory its sandbox sees (bwrap.py says why).
        run_dir = directory / "run"
        run_dir.mkdir(mode=0o700, exist_ok=True)
        port_file = run_dir / "runtime.port"
        port_file.unlink(missing_ok=True)
        token = secrets.token_urlsafe(32)
        upload = FileUploadConfig.model_validate(record.file_upload)
        workspace = directory / "workspace"
        command = self.runtime_command
        listen = ["--host", "127.0.0.1", "--port", "0", "--port-file", str(port_file)]
        if self.egress is not None:
            await self.egress.open(sid)
            listen = self.egress.runtime_args()
        if self.bwrap:
            isolate = self.egress.bwrap_args(sid) if self.egress is not None else []
            command = [
                *bwrap_argv(
                    self.bwrap,
                    data_dir=self.data_dir,
                    run_dir=run_dir,
                    workspace=workspace,
                    extra=isolate,
                ),
                *command,
            ]
        env = {k: os.environ[k] for k in _INHERITED_ENV if k in os.environ}
        env.update(self.runtime_env)
        if self.egress is not None:
            env.update(self.egress.runtime_env(sid))
        env.update(
            session_runtime_env(token, SANDBOX_WORKSPACE if self.bwrap else workspace, upload)
        )
        log_fd = os.open(directory / "runtime.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            proc = await asyncio.create_subprocess_exec(
                *command,
                *listen,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log_fd,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        finally:
            os.close(log_fd)
        entry = _Process(proc=proc, token=token, port_file=port_file)
        if self.egress is not None:
            entry.unix_socket = str(self.egress.runtime_socket(sid))
        self._procs[record.session_id] = entry
        self._running.set()
        log.info("started runtime", extra={"session_id": record.session_id, "pid": proc.pid})
        task = asyncio.create_task(self._await_ready(record.session_id, entry))
        self._waiters.add(task)
        task.add_done_callback(self._waiters.discard)

    async def _await_ready(self, session_id: str, entry: _Process) -> None:
        deadline = time.monotonic() + _START_TIMEOUT_SECONDS
        while time.monotonic() < deadline and entry.proc.returncode is None:
            endpoint = _listening(entry)
            if endpoint is not None and await RuntimeClient(self.http, endpoint).health():
                entry.endpoint = endpoint
                log.info("runtime ready", extra={"session_id": session_id, "at": endpoint.url})
                await entry.proc.wait()
                if not entry.stopping:
                    entry.error = f"runtime exited unexpectedly (code {entry.proc.returncode})"
                    log.warning(entry.error, extra={"session_id": session_id})
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(entry.proc.wait(), 0.05)
        if entry.proc.returncode is None:
            entry.error = f"runtime did not become healthy within {_START_TIMEOUT_SECONDS:.0f}s"
        else:
            entry.error = (
                f"runtime exited during start-up (code {entry.proc.returncode}); see "
                f"{self._dir(session_id) / 'runtime.log'}"
            )
        log.error(entry.error, extra={"session_id": session_id})

    async def _stop(self, session_id: str) -> None:
        entry = self._procs.pop(session_id, None)
        if not self._procs:
            self._running.clear()
        try:
            await self._end(entry)
        finally:
            if entry is not None and self.egress is not None:
                await self.egress.close(session_id)

    async def _end(self, entry: _Process | None) -> None:
        if entry is None or entry.proc.returncode is not None:
            return
        entry.stopping = True
        _signal_group(entry.proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(entry.proc.wait(), _STOP_GRACE_SECONDS)
        except TimeoutError:
            _signal_group(entry.proc.pid, signal.SIGKILL)
            await entry.proc.wait()

    # -- idle stop -----------------------------------------------------------------------

    async def _stop_idle_runtimes(self) -> None:
        """Every few seconds (a quarter of the timeout, at most 30 s): stop the idle. A
        stop is that late at most; while no runtime runs the loop sleeps (no wakeup)."""
        interval = min(max(self.idle_timeout / 4, _POLL_SECONDS), _IDLE_CHECK_MAX_SECONDS)
        while True:
            await self._running.wait()
            await asyncio.sleep(interval)
            for session_id, entry in list(self._procs.items()):
                try:
                    await self._stop_if_idle(session_id, entry)
                except Exception:  # one session's failure never ends the others' checks
                    log.exception("idle check failed", extra={"session_id": session_id})

    async def _idle_seconds(self, session_id: str, entry: _Process) -> float | None:
        """Seconds idle once that reached the timeout (the runtime asked), else None."""
        if entry.endpoint is None or entry.stopping or entry.proc.returncode is not None:
            return None
        now = datetime.now(UTC)
        also = self._api_activity.get(session_id)
        known = max(entry.active_at, also) if also else entry.active_at
        if (now - known).total_seconds() < self.idle_timeout:
            return None  # not idle long enough even by what we knew: no need to ask
        try:
            stats = await RuntimeClient(self.http, entry.endpoint).stats()
        except Exception as e:  # an unanswering runtime is the status's business, not ours
            log.warning("idle check: stats unavailable: %s", e, extra={"session_id": session_id})
            return None
        entry.active_at = max(entry.active_at, stats.last_activity_at)
        return idleness.idle_for(stats, also, self.idle_timeout, datetime.now(UTC))

    async def _stop_if_idle(self, session_id: str, entry: _Process) -> None:
        if await self._idle_seconds(session_id, entry) is None:
            return
        async with self._lock(session_id):
            # Asked again under the lock: a request may have begun since the first look.
            if self._procs.get(session_id) is not entry:
                return
            idle = await self._idle_seconds(session_id, entry)
            if idle is None:
                return
            await self._stop(session_id)
        log.info(
            "stopped an idle runtime; its files are kept",
            extra={"session_id": session_id, "idle_seconds": round(idle, 1)},
        )


def _listening(entry: _Process) -> RuntimeEndpoint | None:
    """Where the runtime listens, once it does (its socket, or the port in its file)."""
    if entry.unix_socket:
        if not os.path.exists(entry.unix_socket):
            return None
        label = f"unix:{entry.unix_socket}"
        return RuntimeEndpoint(url=label, token=entry.token, unix_socket=entry.unix_socket)
    if not entry.port_file.exists():
        return None
    port = int(entry.port_file.read_text().strip())
    return RuntimeEndpoint(url=f"http://127.0.0.1:{port}", token=entry.token)


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


def _delete_offline(root: Path, conversation_id: str) -> ConversationDeleted:
    """What the runtime's deletion does (directory and state, verified), with no runtime;
    the scratch roots its runtimes left go whole (no runtime runs: all are dead ones')."""
    workspace = Workspace(root, str(root))
    try:
        workspace.remove_scratch_leftovers()
        return workspace.delete_conversation(conversation_id)
    finally:
        workspace.close()


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def _refuse_taken(directory: Path, session_id: str) -> None:
    """A directory whose record names another session is that session's: never ours."""
    try:
        owner = json.loads((directory / "session.json").read_text()).get("session_id")
    except FileNotFoundError:
        return
    except ValueError:
        owner = None  # unreadable: not provably ours either
    if owner != session_id:
        raise NameTaken(f"session '{session_id}': its directory holds another session's files")
