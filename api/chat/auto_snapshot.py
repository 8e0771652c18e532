"""A snapshot of the conversation before each chat turn (issue 38), so that "retry from
turn N" is a restore of turn N's snapshot.

Contract: with ``SANDBOX_WORKSPACE_CHAT_AUTO_SNAPSHOT=true``, a run that starts (not one
taken over from another replica: its turn began there) takes a snapshot named
``auto: before turn {run_id}`` once its session runs and its conversation is open, then
deletes the oldest automatic snapshots beyond ``SANDBOX_WORKSPACE_CHAT_AUTO_SNAPSHOT_KEEP``
(snapshots a user took are never pruned). It never fails the turn: a snapshot refused
(over the stored-bytes quota, the store unavailable) is logged and the turn goes on.
"""

from __future__ import annotations

import logging

from sandbox_workspace.contract.errors import ApiError

from ..backends.base import Session

log = logging.getLogger(__name__)
PREFIX = "auto: before turn "


async def before_turn(services, session: Session, cid: str, run_id: str) -> None:
    settings = services.settings
    if not settings.chat_auto_snapshot:
        return
    files = services.files
    try:
        quota = settings.quotas.snapshot_bytes_per_user
        await files.snapshot(session, cid, PREFIX + run_id, quota)
        autos = [s for s in await files.snapshots(session, cid) if s.name.startswith(PREFIX)]
        for old in autos[: max(0, len(autos) - settings.chat_auto_snapshot_keep)]:
            await files.delete_snapshot(session, cid, old.snapshot_id)
    except ApiError as e:
        log.warning("no snapshot before this turn: %s", e.message)
