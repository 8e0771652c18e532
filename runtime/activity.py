"""Activity tracking for idle detection.

Contract: ``last_activity_at`` moves forward on every authenticated request and at the
end of every tracked operation; ``active`` counts operations in flight. An idle reaper
treats the runtime as busy while ``active > 0`` whatever the timestamps say, so a long
upload or computation is never mistaken for idleness.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import UTC, datetime


class Activity:
    def __init__(self) -> None:
        self.started_at = datetime.now(UTC)
        self.last_activity_at = self.started_at
        self.active = 0

    def touch(self) -> None:
        self.last_activity_at = datetime.now(UTC)

    @contextlib.contextmanager
    def track(self) -> Iterator[None]:
        self.active += 1
        self.touch()
        try:
            yield
        finally:
            self.active -= 1
            self.touch()
