"""Reading Server-Sent Events in tests: ``Stream(response)`` yields (id, kind, data)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx


class Stream:
    """Reads one SSE response event by event: (id, kind, data); keeps comments seen."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.lines = response.iter_lines()
        self.comments = 0
        self.events: list[tuple[int, str, dict]] = []

    def __iter__(self) -> Iterator[tuple[int, str, dict]]:
        event_id, kind = None, None
        for line in self.lines:
            if line.startswith(":"):
                self.comments += 1
            elif line.startswith("id: "):
                event_id = int(line[4:])
            elif line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                event = (event_id, kind, json.loads(line[6:]))
                self.events.append(event)
                yield event

    def until(self, kind: str) -> dict:
        for _, k, data in self:
            if k == kind:
                return data
        raise AssertionError(f"stream ended without {kind}: {[k for _, k, _ in self.events]}")

    def rest(self) -> list[tuple[int, str, dict]]:
        list(self)
        return self.events


def kinds(events) -> list[str]:
    return [k for _, k, _ in events]
