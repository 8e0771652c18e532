"""What the Redis store's helpers (``control``, ``takeover``) reach of the store: its
connection, keys, writer and the bookkeeping of runs owned or being taken over.

A Protocol rather than the class itself, so the helpers need not import
``redis_store`` (which imports them): the store satisfies it structurally.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..run import Run
    from . import Resume
    from .redis_log import Keys
    from .writer import Writer


class RedisStoreState(Protocol):
    redis: Any
    keys: Keys
    writer: Writer
    local: dict[str, Run]  # open runs this replica owns
    decided: dict[str, dict[str, dict]]  # run → call → decision (taken over)
    counts: Counter[str]  # takeover outcomes, hand-overs, leases lost
    _early: dict[str, list[dict]]  # control messages for runs being taken over
    _scan_now: asyncio.Event
    _resume: Resume | None
