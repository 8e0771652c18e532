"""A session deleted while a request ensures it answers 404, never 500.

Found by the contract test: a DELETE stops the session's runtime first, so a concurrent
file request sees it ``stopped``, asks the backend to resume it, and the record is gone.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from sandbox_workspace.api.backends.base import Session, SessionSpec, SessionStatus
from sandbox_workspace.api.identity import Caller
from sandbox_workspace.api.sessions import SessionService
from sandbox_workspace.contract.errors import NotFoundError
from sandbox_workspace.operator.models import FileUploadConfig


class DeletedDuringResume:
    """get → stopped; resume → the record is gone (as the local backend raises); get → none."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.deleted = False

    async def get_session(self, session_id: str) -> Session | None:
        if self.deleted:
            return None
        spec = SessionSpec(session_id=session_id, user_id="alice")
        return Session(spec, SessionStatus.STOPPED, datetime.now(UTC), "/workspace")

    async def resume_session(self, session_id: str) -> Session:
        self.deleted = True
        raise self.error


@pytest.mark.parametrize("error", [KeyError("sb-session-alice"), NotFoundError("gone")])
async def test_deleted_while_resuming_is_404(error):
    service = SessionService(
        DeletedDuringResume(error), default_upload=FileUploadConfig(), ready_timeout=5
    )
    with pytest.raises(NotFoundError, match="deleted while starting"):
        await service.ensure_running(Caller("alice", "dev"), "sb-session-alice")
