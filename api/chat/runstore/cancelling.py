"""Retry loops over Redis that still end when cancelled.

Contract: ``end_if_cancelling(error)``, called in a retry loop's ``except`` clause,
raises ``CancelledError`` (chained to ``error``) when the current task is being
cancelled, and returns otherwise. redis-py may answer a cancellation that lands inside a
command with a connection error; a loop that retried on it would never end, and
``aclose`` waits for it.
"""

from __future__ import annotations

import asyncio


def end_if_cancelling(error: BaseException) -> None:
    """Raise ``CancelledError`` if the current task is being cancelled, else return."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError from error
