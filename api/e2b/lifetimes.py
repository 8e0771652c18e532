"""Per-process state of E2B sandboxes: their timeouts and ``Idempotency-Key`` answers.

Contract:
- ``Lifetimes`` holds each live sandbox's end (monotonic seconds) and who owns it.
  ``reap`` (a background task started with the first sandbox) kills every sandbox whose
  end passed — E2B's default ``on_timeout: kill``: a fresh sandbox is deleted with the
  guarantee ``kill()`` gives, an attached one only detached. ``set_timeout`` sets the end
  to now + timeout; connect extends it (never shortens). Bounded by the live sandboxes:
  an entry leaves at kill or timeout.
- ``Idempotency`` remembers create answers by (tenant, user, key) with the body's digest:
  the same key and body answer the first sandbox again, another body is 422. At most
  ``MAX_REMEMBERED`` answers for ``REMEMBER_SECONDS`` (oldest dropped first).
- Both live in this API process: after a restart a sandbox has no timer (the session's
  idle stop still applies, its files stay until killed) and keys are forgotten; with
  several replicas each enforces the timeouts of the sandboxes it created.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sandbox_workspace.contract.errors import ApiError, BadRequest

from ..identity import Caller
from ..keyed_locks import KeyedLocks

MAX_TIMEOUT = 86_400  # E2B's own cap (24 h)
MAX_REMEMBERED = 1000
REMEMBER_SECONDS = 24 * 3600
REAP_EVERY = 0.5
log = logging.getLogger(__name__)


@dataclass
class Lifetime:
    caller: Caller
    end: float


class Lifetimes:
    def __init__(self) -> None:
        self._live: dict[str, Lifetime] = {}
        self._reaper: asyncio.Task | None = None

    def set(self, sandbox_id: str, caller: Caller, timeout: int, extend_only: bool = False):
        end = time.monotonic() + min(max(timeout, 0), MAX_TIMEOUT)
        known = self._live.get(sandbox_id)
        if known is not None and extend_only:
            end = max(end, known.end)
        self._live[sandbox_id] = Lifetime(caller, end)

    def remaining(self, sandbox_id: str) -> float | None:
        known = self._live.get(sandbox_id)
        return None if known is None else max(known.end - time.monotonic(), 0.0)

    def forget(self, sandbox_id: str) -> None:
        self._live.pop(sandbox_id, None)

    def expired(self) -> list[tuple[str, Caller]]:
        now = time.monotonic()
        return [(sid, lt.caller) for sid, lt in self._live.items() if lt.end <= now]

    def start(self, spawn, kill: Callable[[str, Caller], Awaitable[None]]) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = spawn(self.reap(kill))

    async def reap(self, kill: Callable[[str, Caller], Awaitable[None]]) -> None:
        while self._live:
            for sid, caller in self.expired():
                try:
                    await kill(sid, caller)
                except Exception:  # one failed kill must not stop the others' timers
                    log.exception("E2B timeout kill of %s failed", sid)
                finally:
                    self.forget(sid)
            await asyncio.sleep(REAP_EVERY)


class IdempotencyMismatch(ApiError):
    status = 422
    code = "idempotency_key_reused"


class Idempotency:
    def __init__(self) -> None:
        self._answers: OrderedDict[tuple, tuple[float, str, Any]] = OrderedDict()
        self._locks = KeyedLocks()

    async def once(
        self, caller: Caller, key: str | None, body: dict, make: Callable[[], Awaitable[Any]]
    ) -> Any:
        if key is None:
            return await make()
        if not 0 < len(key) <= 255:
            raise BadRequest("Idempotency-Key must be 1-255 characters", code="invalid_key")
        scope = (caller.tenant, caller.user_id, key)
        digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        async with self._locks.hold(scope):  # a retry racing the first waits for its answer
            now = time.monotonic()
            while self._answers and next(iter(self._answers.values()))[0] < now:
                self._answers.popitem(last=False)
            known = self._answers.get(scope)
            if known is not None:
                if known[1] != digest:
                    raise IdempotencyMismatch(
                        f"Idempotency-Key '{key}' was used with another request body: "
                        "send a new key for a different sandbox"
                    )
                return known[2]
            answer = await make()
            self._answers[scope] = (now + REMEMBER_SECONDS, digest, answer)
            while len(self._answers) > MAX_REMEMBERED:
                self._answers.popitem(last=False)
            return answer


def lifetimes(services) -> Lifetimes:
    """This app's timers (kept on its Services, so two apps in one process keep theirs)."""
    if not hasattr(services, "e2b_lifetimes"):
        services.e2b_lifetimes = Lifetimes()
        services.e2b_idempotency = Idempotency()
    return services.e2b_lifetimes


def idempotency(services) -> Idempotency:
    lifetimes(services)
    return services.e2b_idempotency
