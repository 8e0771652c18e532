"""A chat client that never gives up on a run: it follows one run's SSE stream across API
replicas that come and go, re-attaching with ``Last-Event-ID`` (test and bench support).

``start_and_follow(urls, user, body)`` posts the chat request to one replica, reads
its stream, and whenever the connection ends before ``done`` (the replica was stopped,
killed, or cut the stream) re-attaches on whichever replica answers — the way a browser
behind a Service does. ``Followed`` keeps every event id received, so callers check that
nothing was lost (gaps), nothing duplicated, and that the stream ended with ``done``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx


@dataclass
class Followed:
    run_id: str = ""
    ids: list[int] = field(default_factory=list)
    events: list[tuple[int, str, dict]] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # monotonic, when each event came
    reconnects: int = 0

    @property
    def done(self) -> bool:
        return bool(self.events) and self.events[-1][1] == "done"

    @property
    def lost(self) -> int:
        """Event ids never received (the ids are 1, 2, 3, … without gaps by contract)."""
        return (max(self.ids) - len(set(self.ids))) if self.ids else 0

    @property
    def duplicated(self) -> int:
        return len(self.ids) - len(set(self.ids))

    def longest_gap(self) -> float:
        """The longest wait between two events once the model streams, in seconds (a
        client's worst stall; the session's start before it is not counted)."""
        kinds = self.kinds()
        start = kinds.index("text") if "text" in kinds else len(kinds)
        times = self.times[start:]
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)

    def kinds(self) -> list[str]:
        return [k for _, k, _ in self.events]


async def _read(response: httpx.Response, followed: Followed) -> None:
    event_id, kind = None, None
    async for line in response.aiter_lines():
        if line.startswith("id: "):
            event_id = int(line[4:])
        elif line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: ") and event_id is not None:
            followed.ids.append(event_id)
            followed.times.append(time.monotonic())
            followed.events.append((event_id, kind or "", json.loads(line[6:])))
            if kind == "done":
                return


async def start_and_follow(
    urls: Callable[[], list[str]],
    user: str,
    body: dict | None = None,
    *,
    run_id: str = "",
    timeout: float = 120.0,
    followed: Followed | None = None,
    first: int = 0,
    tenant: str | None = None,
) -> Followed:
    """Start a run with ``body`` (or follow ``run_id``) until ``done`` or ``timeout``;
    pass ``followed`` to watch its progress from outside while it runs. Replicas are
    tried in turn, starting with ``urls()[first % n]``."""
    followed = followed or Followed()
    followed.run_id = followed.run_id or run_id
    headers = {"X-User-Id": user, **({"X-Tenant-Id": tenant} if tenant else {})}
    deadline = time.monotonic() + timeout
    turn = itertools.count(first)  # which replica to try first (spreads the runs)
    async with httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(30, read=60)) as client:
        while not followed.done and time.monotonic() < deadline:
            live = urls()
            if not live:
                await asyncio.sleep(0.05)
                continue
            base = live[next(turn) % len(live)]
            try:
                if not followed.run_id:
                    request = client.stream("POST", f"{base}/api/v1/chat", json=body)
                else:
                    request = client.stream(
                        "GET",
                        f"{base}/api/v1/runs/{followed.run_id}/events",
                        headers={"Last-Event-ID": str(max(followed.ids, default=0))},
                    )
                async with request as response:
                    if response.status_code != 200:
                        await response.aread()
                        if response.status_code >= 500 or response.status_code == 404:
                            await asyncio.sleep(0.05)  # stopping, or not stored yet
                            continue
                        raise AssertionError(f"{response.status_code}: {response.text}")
                    followed.run_id = followed.run_id or response.headers["x-run-id"]
                    await _read(response, followed)
            except (httpx.TransportError, httpx.StreamError):
                pass  # the replica went away mid-stream: re-attach elsewhere
            if not followed.done:
                followed.reconnects += 1
                await asyncio.sleep(0.05)
    return followed
