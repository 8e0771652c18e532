"""The state of E2B sandboxes beyond their files: their timeouts (which also say which
attached sandboxes are live) and ``Idempotency-Key`` answers.

Contract:
- A timer is kept per *owner and sandbox* — (tenant, user, sandbox id): attached sandbox
  ids are the conversation id encoded, so two users attaching their own ``chat-7`` have
  the same id and must never reach each other's timer.
- ``set`` sets the end to now + timeout (at most ``MAX_TIMEOUT``); ``extend_only`` (connect)
  never shortens it. ``remaining`` is the seconds left, None when the sandbox has no timer
  (killed, timed out, or never known here). ``reap`` (a background task started with the
  first timer, running while any is left) kills every sandbox whose end passed — E2B's
  default ``on_timeout: kill``: a fresh sandbox is deleted with the guarantee ``kill()``
  gives, an attached one only detached.
- ``Idempotency`` remembers create answers by (tenant, user, key) with the body's digest:
  the same key and body answer the first sandbox again, another body is 422.
- Where the state lives (``state``): with the chat's run store. ``memory`` (one API process): the
  classes here — after a restart a sandbox has no timer and keys are forgotten; at most
  ``MAX_REMEMBERED`` answers for ``REMEMBER_SECONDS``. ``redis`` (several replicas): the
  same contract kept in Redis (``shared``), so a kill, a timeout or an idempotent retry
  landing on another replica (or after a restart) behaves as on the first. ``shared``
  says which: with shared timers, every live sandbox has one (``conversation.Sandbox``
  answers 404 without), since they outlive API processes.
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
from typing import Any, Protocol

from sandbox_workspace.contract.errors import ApiError, BadRequest, NotFoundError

from ..identity import Caller
from ..keyed_locks import KeyedLocks

MAX_TIMEOUT = 86_400  # E2B's own cap (24 h)
MAX_REMEMBERED = 1000
REMEMBER_SECONDS = 24 * 3600
REAP_EVERY = 0.5
log = logging.getLogger(__name__)

Kill = Callable[[str, Caller], Awaitable[Any]]
Owner = tuple[str, str, str]  # tenant, user, sandbox id


def owner(caller: Caller, sandbox_id: str) -> Owner:
    return (caller.tenant, caller.user_id, sandbox_id)


def caller_of(key: Owner) -> Caller:
    tenant, user, _ = key
    return Caller(user, "e2b-timer", tenant)


def end_of(timeout: int) -> float:
    """Wall-clock end (seconds since the epoch: replicas share it) of a timeout from now."""
    return time.time() + min(max(timeout, 0), MAX_TIMEOUT)


class Timers(Protocol):
    shared: bool

    async def set(
        self, caller: Caller, sandbox_id: str, timeout: int, extend_only: bool = False
    ) -> None: ...
    async def remaining(self, caller: Caller, sandbox_id: str) -> float | None: ...
    async def forget(self, caller: Caller, sandbox_id: str) -> None: ...
    def start(self, spawn, kill: Kill) -> None: ...


class Answers(Protocol):
    async def once(
        self, caller: Caller, key: str, body: dict, make: Callable[[], Awaitable[Any]]
    ) -> Any: ...


async def reap_one(key: Owner, kill: Kill, forget: Callable[[], Awaitable[None]]) -> bool:
    """Kill one expired sandbox; forget its timer unless the kill failed for a reason
    worth another try (answer whether it was forgotten)."""
    try:
        await kill(key[2], caller_of(key))
    except NotFoundError:  # gone already (killed meanwhile, or its session deleted)
        pass
    except Exception:  # one failed kill must not stop the others' timers
        log.exception("E2B timeout kill of %s failed", key[2])
        return False
    await forget()
    return True


@dataclass
class Lifetime:
    end: float


class Lifetimes:
    """Timers of this API process (run store ``memory``)."""

    shared = False

    def __init__(self) -> None:
        self._live: dict[Owner, Lifetime] = {}
        self._reaper: asyncio.Task | None = None

    async def set(
        self, caller: Caller, sandbox_id: str, timeout: int, extend_only: bool = False
    ) -> None:
        end = end_of(timeout)
        known = self._live.get(owner(caller, sandbox_id))
        if known is not None and extend_only:
            end = max(end, known.end)
        self._live[owner(caller, sandbox_id)] = Lifetime(end)

    async def remaining(self, caller: Caller, sandbox_id: str) -> float | None:
        known = self._live.get(owner(caller, sandbox_id))
        return None if known is None else max(known.end - time.time(), 0.0)

    async def forget(self, caller: Caller, sandbox_id: str) -> None:
        self._live.pop(owner(caller, sandbox_id), None)

    def start(self, spawn, kill: Kill) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = spawn(self.reap(kill))

    async def reap(self, kill: Kill) -> None:
        while self._live:
            now = time.time()
            for key in [k for k, lt in self._live.items() if lt.end <= now]:
                await reap_one(key, kill, lambda k=key: self._drop(k))
                self._live.pop(key, None)  # a failed kill is not tried again here
            await asyncio.sleep(REAP_EVERY)

    async def _drop(self, key: Owner) -> None:
        self._live.pop(key, None)


class IdempotencyMismatch(ApiError):
    status = 422
    code = "idempotency_key_reused"


def scope_of(caller: Caller, key: str, body: dict) -> tuple[tuple[str, str, str], str]:
    """The answer's scope (tenant, user, key), checked, and the body's digest."""
    if not 0 < len(key) <= 255:
        raise BadRequest("Idempotency-Key must be 1-255 characters", code="invalid_key")
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    return (caller.tenant, caller.user_id, key), digest


def mismatch(key: str) -> IdempotencyMismatch:
    return IdempotencyMismatch(
        f"Idempotency-Key '{key}' was used with another request body: "
        "send a new key for a different sandbox"
    )


class Idempotency:
    """Create answers of this API process (run store ``memory``)."""

    def __init__(self) -> None:
        self._answers: OrderedDict[tuple, tuple[float, str, Any]] = OrderedDict()
        self._locks = KeyedLocks()

    async def once(
        self, caller: Caller, key: str, body: dict, make: Callable[[], Awaitable[Any]]
    ) -> Any:
        scope, digest = scope_of(caller, key, body)
        async with self._locks.hold(scope):  # a retry racing the first waits for its answer
            now = time.monotonic()
            while self._answers and next(iter(self._answers.values()))[0] < now:
                self._answers.popitem(last=False)
            known = self._answers.get(scope)
            if known is not None:
                if known[1] != digest:
                    raise mismatch(key)
                return known[2]
            answer = await make()
            self._answers[scope] = (now + REMEMBER_SECONDS, digest, answer)
            while len(self._answers) > MAX_REMEMBERED:
                self._answers.popitem(last=False)
            return answer
