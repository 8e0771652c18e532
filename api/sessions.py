"""Session rules on top of any backend: ownership and ensure-running (seed 000 §3.2).

Contract:
- A caller owns exactly one session, ``Caller.session_id``: ``sb-session-{user_id}`` in
  the default tenant, one per (tenant, user) in another (where ``sb-session-{user_id}``
  names it too, as clients build it); any other id answers 404 exactly as a missing
  session does, so ids of other users and tenants cannot be probed.
- ``ensure_running`` is the seed's EnsureSandboxSession: get → create when missing (a 409
  from a concurrent creator is fine) → resume when stopped or failed → wait, bounded by
  the ready timeout, until ``running``. It never returns a session that is not running;
  the 503 ``session_not_ready`` of one still starting says what it waits for (the
  backend's message, as GET of the session shows it).
- A session being deleted (``terminating``) gets no traffic: 503 ``session_terminating``
  with ``Retry-After``; once it is gone the next call creates a fresh one.
- After a resume request the status is the one from before it (an old ``Error``): it is
  judged only once the backend says the resume was acted on (``resume_pending`` false),
  so recovering a failed session works on the first try.
- ``create`` is ``POST /sessions``: a new session is created; an existing one answers
  ``SessionExists`` (409) as always, but when it is stopped or failed its resume is
  started first (seed 000 §8.1 "automatically recover"), so the seed's own client — GET,
  not running, POST, on 409 poll GET and fail at once on ``stopped``/``error`` — sees
  ``pending`` and then ``running`` after an idle stop, with its files kept.
- ``recent_running`` is ``ensure_running`` for the caller's own session, answered without
  a read from the last Running answer to that same caller (tenant, user) when it is under
  ``RECENT_SECONDS`` old: E2B's SDK makes two calls for its first command (create, then
  the command's Start) and one per file or command after. Only the E2B data plane uses
  it: a stale answer there harms no more than a request in flight during a change would
  (its store writes are fenced on their own, ``Backend.store_writing``). ``forget``
  drops a caller's answer (its session's deletion through this API, a runtime the E2B
  data plane could not reach, and any look through ``get``/``find`` that sees it not
  running); an ``ensure_running`` already under way then stores none either (a
  generation per caller that ``forget`` bumps), so no answer older than the forget is
  reused. Per API replica: another replica's answer lives out its ``RECENT_SECONDS``.
"""

from __future__ import annotations

import time

from sandbox_workspace import tracing
from sandbox_workspace.contract.errors import NotFoundError, Unavailable
from sandbox_workspace.operator.models import FileUploadConfig
from sandbox_workspace.operator.naming import session_id_for

from .backends.base import (
    Backend,
    Session,
    SessionExists,
    SessionSpec,
    SessionStatus,
    SessionTerminating,
)
from .identity import Caller

RECENT_SECONDS = 2.0
MESSAGE_CHARS = 300  # of the backend's message in a session_not_ready answer
_RECENT_MAX = 10_000  # remembered answers (one per caller); past it, start over


class SessionService:
    def __init__(
        self,
        backend: Backend,
        *,
        default_upload: FileUploadConfig,
        ready_timeout: float,
        default_ttl: int | None = None,
    ) -> None:
        self.backend = backend
        self.default_upload = default_upload
        self.ready_timeout = ready_timeout
        self.default_ttl = default_ttl
        # (tenant, user) → (monotonic time, their Running session): ``recent_running``.
        self._recent: dict[tuple[str, str], tuple[float, Session]] = {}
        # (tenant, user) → how many times ``forget`` dropped their answer; ``_epoch``
        # counts the times the whole map was cleared (its bound). An ``ensure_running``
        # stores its answer only when both are as they were when it started.
        self._forgets: dict[tuple[str, str], int] = {}
        self._epoch = 0

    @staticmethod
    def own_session_id(caller: Caller, session_id: str) -> str:
        own = caller.session_id
        if session_id not in (own, session_id_for(caller.user_id)):
            raise NotFoundError(f"session '{session_id}' not found")
        return own

    async def get(self, caller: Caller, session_id: str) -> Session:
        session = await self._look(caller, session_id)
        if session is None:
            raise NotFoundError(f"session '{session_id}' not found")
        return session

    async def find(self, caller: Caller, session_id: str) -> Session | None:
        """The caller's session as it is (None when there is none), started by nothing;
        one being deleted is refused as everywhere."""
        session = await self._look(caller, session_id)
        _refuse_terminating(session)
        return session

    async def _look(self, caller: Caller, session_id: str) -> Session | None:
        own = self.own_session_id(caller, session_id)
        session = await self.backend.get_session(own)
        if session is None or session.status != SessionStatus.RUNNING:
            # Seen stopped, failed or gone: its Running answer is not reused any more
            # (an idle stop or a crash inside ``RECENT_SECONDS`` of the last answer). The
            # caller's own key alone: a client polling a stopped session scans nothing.
            self.forget(caller)
        return session

    def default_spec(self, caller: Caller) -> SessionSpec:
        return SessionSpec(
            session_id=caller.session_id,
            user_id=caller.user_id,
            file_upload=self.default_upload,
            ttl_seconds=self.default_ttl,
        )

    async def create(self, spec: SessionSpec) -> Session:
        try:
            return await self.backend.create_session(spec)
        except SessionExists:
            session = await self.backend.get_session(spec.session_id)
            if session is not None and not session.terminating:
                await self._resume_if_down(session)
            raise

    async def _resume_if_down(self, session: Session) -> Session | None:
        """Start the resume of a stopped or failed session (none already asked for); the
        session after it, or None when it was deleted meanwhile."""
        if session.resume_pending or session.status not in (
            SessionStatus.STOPPED,
            SessionStatus.ERROR,
        ):
            return session
        try:
            return await self.backend.resume_session(session.session_id)
        except (KeyError, NotFoundError):
            # Deleted between the look-up and the resume (a concurrent DELETE stops it
            # first): the caller's next look sees it gone.
            return None

    async def ensure_running(
        self, caller: Caller, session_id: str, spec: SessionSpec | None = None
    ) -> Session:
        # The seed's EnsureSandboxSession span, with its attributes (seed 000 §8.3).
        attributes = {"session_id": session_id, "user_id": caller.user_id}
        if spec is not None:
            attributes |= {"agent_id": spec.agent_id, "business_domain_id": spec.business_domain_id}
        key = (caller.tenant, caller.user_id)
        generation = (self._epoch, self._forgets.get(key, 0))
        with tracing.span("session.ensure", attributes):
            session = await self._ensure_running(caller, session_id, spec)
        if (
            session.session_id == caller.session_id  # the caller's own (always, today)
            and generation == (self._epoch, self._forgets.get(key, 0))  # no forget since
        ):
            if len(self._recent) >= _RECENT_MAX:
                self._recent.clear()
            self._recent[key] = (time.monotonic(), session)
        return session

    async def recent_running(self, caller: Caller) -> Session:
        """The caller's own session, running (see the module contract)."""
        hit = self._recent.get((caller.tenant, caller.user_id))
        if hit is not None and time.monotonic() - hit[0] < RECENT_SECONDS:
            return hit[1]
        return await self.ensure_running(caller, caller.session_id)

    def forget(self, caller: Caller) -> None:
        """No answer about the caller's session is reused from now on, nor stored by an
        ``ensure_running`` under way (the caller's own key alone: nothing is scanned)."""
        key = (caller.tenant, caller.user_id)
        self._recent.pop(key, None)
        if len(self._forgets) >= _RECENT_MAX:
            # Past the bound, start over; every ``ensure_running`` under way then stores
            # nothing (its epoch changed), so no forget is lost with the counts.
            self._forgets.clear()
            self._epoch += 1
        self._forgets[key] = self._forgets.get(key, 0) + 1

    async def _ensure_running(
        self, caller: Caller, session_id: str, spec: SessionSpec | None
    ) -> Session:
        sid = self.own_session_id(caller, session_id)
        session = await self.backend.get_session(sid)
        _refuse_terminating(session)
        if session is None:
            try:
                session = await self.backend.create_session(spec or self.default_spec(caller))
            except SessionExists:
                session = await self.backend.get_session(sid)
                _refuse_terminating(session)
        if session is not None:
            # None: deleted meanwhile; wait_running answers 404 "deleted while starting".
            session = await self._resume_if_down(session)
        if session is not None and session.status == SessionStatus.RUNNING and session.endpoint:
            return session  # the common case: no second look-up
        return await self.wait_running(sid, session)

    async def wait_running(self, session_id: str, known: Session | None = None) -> Session:
        """The session once running. ``known``: the session as just read or created (not
        read again); each change the backend reports with the session it left
        (``Backend.wait_changed``) is judged as is — a look-up only when it reports none."""
        deadline = time.monotonic() + self.ready_timeout
        while True:
            session = known or await self.backend.get_session(session_id)
            known = None
            if session is None:
                raise NotFoundError(f"session '{session_id}' was deleted while starting")
            _refuse_terminating(session)
            if session.status == SessionStatus.RUNNING and session.endpoint is not None:
                return session
            if session.status == SessionStatus.ERROR and not session.resume_pending:
                raise Unavailable(
                    f"session '{session_id}' failed to start: {session.message}",
                    code="session_failed",
                )
            if time.monotonic() >= deadline:
                # What it waits for (the backend's word, as GET of the session shows it:
                # the pod unscheduled, its volume not mounted yet…), so a caller that
                # gives up — a client, a test in CI — says why without a second look.
                why = f": {session.message[:MESSAGE_CHARS]}" if session.message else ""
                raise Unavailable(
                    f"session '{session_id}' is not running after {self.ready_timeout:.0f}s "
                    f"(status {session.status}{why}); retry shortly",
                    code="session_not_ready",
                )
            known = await self.backend.wait_changed(
                session_id, max(0.0, deadline - time.monotonic())
            )


def _refuse_terminating(session: Session | None) -> None:
    if session is not None and session.terminating:
        raise SessionTerminating(
            f"session '{session.session_id}' is being deleted; retry once it is gone "
            "(a fresh session is then started)"
        )
