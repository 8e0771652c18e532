"""``POST /sessions`` of an existing session (``SessionService.create``, seed 000 §8.1):
409 always; a stopped or failed one has its resume started first, once — a resume asked
for already, a running or a terminating session is left alone — and a resume not yet
acted on reads ``pending`` (the kubernetes backend keeps the old phase until then)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from sandbox_workspace.api.backends.base import Session, SessionExists, SessionSpec, SessionStatus
from sandbox_workspace.api.schemas import SessionResponse
from sandbox_workspace.api.sessions import SessionService
from sandbox_workspace.operator.models import FileUploadConfig

SID = "sb-session-alice"


def _session(status: SessionStatus, **kw) -> Session:
    spec = SessionSpec(session_id=SID, user_id="alice")
    return Session(spec, status, datetime.now(UTC), "/workspace", **kw)


class Existing:
    """A backend holding one session; create is a 409, resume marks it pending."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.resumes = 0

    async def create_session(self, spec: SessionSpec) -> Session:
        raise SessionExists(f"session '{spec.session_id}' already exists")

    async def get_session(self, session_id: str) -> Session | None:
        return self.session

    async def resume_session(self, session_id: str) -> Session:
        self.resumes += 1
        self.session = dataclasses.replace(self.session, resume_pending=True)
        return self.session


@pytest.mark.parametrize(
    ("session", "resumes"),
    [
        (_session(SessionStatus.STOPPED), 1),
        (_session(SessionStatus.ERROR), 1),
        (_session(SessionStatus.STOPPED, resume_pending=True), 0),
        (_session(SessionStatus.RUNNING), 0),
        (_session(SessionStatus.PENDING), 0),
        (_session(SessionStatus.STOPPED, terminating=True), 0),
    ],
    ids=["stopped", "error", "resume-asked", "running", "pending", "terminating"],
)
async def test_create_of_an_existing_session_is_409_and_resumes_only_a_down_one(session, resumes):
    backend = Existing(session)
    service = SessionService(backend, default_upload=FileUploadConfig(), ready_timeout=5)
    with pytest.raises(SessionExists):
        await service.create(SessionSpec(session_id=SID, user_id="alice"))
    assert backend.resumes == resumes


@pytest.mark.parametrize(
    ("status", "pending", "reported"),
    [
        (SessionStatus.STOPPED, True, "pending"),
        (SessionStatus.ERROR, True, "pending"),
        (SessionStatus.STOPPED, False, "stopped"),
        (SessionStatus.ERROR, False, "error"),
        (SessionStatus.RUNNING, False, "running"),
    ],
)
def test_a_resume_not_yet_acted_on_reads_pending(status, pending, reported):
    assert SessionResponse.of(_session(status, resume_pending=pending)).status == reported
