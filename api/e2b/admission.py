"""What one E2B caller may hold open in this API process: per user, per tenant, and for
the whole process (the last guard), so neither one user nor one tenant takes it all.

Contract:
- ``caps(services)``: this app's ``streams`` and ``watchers`` (``Caps``). ``take(caller)``
  takes one slot of the caller's user, of its tenant and of the process, in that order,
  and returns their release (idempotent); at any cap it takes none and raises
  ``TooManyAtOnce`` (429, naming the cap and its setting; on a Connect stream that is
  ``resource_exhausted``, which E2B's SDKs raise as their rate-limit error).
- Streams are E2B's process streams (``Start``, ``Connect``) and the code interpreter's
  ``/execute``: each holds one of the replica's runtime connections for its whole life
  (``runtime_connections``, one pool for every runtime), so together with this API's
  ``/execute`` calls (one bound: ``UserLimits.runtime_streams``) they take at most half
  of them — file calls, ``List``, signals and creates of every user always find one.
- ``HeldStream``: the streaming answer that holds a slot. It releases it when the
  answer ends, however it ends, and closes its source then (the runtime connection goes
  back at once); a client that takes no byte for ``SEND_SECONDS`` (it stopped reading:
  its window is full) is given up, so it cannot keep a slot, or a connection, for good.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from starlette.responses import StreamingResponse
from starlette.types import Message, Send

from ..quotas import Caps, Concurrency

MAX_WATCHERS = 256  # per API process, all tenants: the last guard
SEND_SECONDS = 60.0  # four of envd's keepalive intervals: a reading client takes one


@dataclass
class _Caps:
    streams: Caps
    watchers: Caps


def caps(services) -> _Caps:
    """Made once per app and kept on its Services (two apps in one process keep theirs)."""
    made = getattr(services, "e2b_caps", None)
    if made is None:
        quotas = services.settings.quotas
        made = services.e2b_caps = _Caps(
            streams=Caps(
                "E2B streams",
                (quotas.e2b_streams_per_user, "e2b_streams_per_user"),
                (quotas.e2b_streams_per_tenant, "e2b_streams_per_tenant"),
                # One bound with /execute's: together they hold at most half the pool.
                services.user_limits.runtime_streams,
            ),
            watchers=Caps(
                "E2B directory watchers",
                (quotas.e2b_watchers_per_user, "e2b_watchers_per_user"),
                (quotas.e2b_watchers_per_tenant, "e2b_watchers_per_tenant"),
                Concurrency(
                    "E2B directory watchers", MAX_WATCHERS, "a fixed bound", "on this API replica"
                ),
            ),
        )
    return made


class HeldStream(StreamingResponse):
    def __init__(self, content, release: Callable[[], None], media_type: str) -> None:
        super().__init__(content, media_type=media_type)
        self.release = release

    async def stream_response(self, send: Send) -> None:
        async def bounded(message: Message) -> None:
            # Past the deadline: TimeoutError, an OSError, which Starlette takes for a
            # client that went away: the connection is closed.
            async with asyncio.timeout(SEND_SECONDS):
                await send(message)

        try:
            await super().stream_response(bounded)
        finally:
            self.release()
            await self.body_iterator.aclose()
