"""E2B sandboxes' timers and ``Idempotency-Key`` answers in Redis: shared by API replicas
(run store ``redis``), the contract of ``lifetimes`` unchanged.

Keys (under the run store's prefix + ``e2b:``):
- ``ends``: a sorted set, member ``[tenant, user, sandbox id]`` (JSON), score its end
  (wall clock). ``set`` is one ZADD (``GT`` when only extending); ``remaining`` a
  ZSCORE. Every replica that served an E2B request reaps while the set holds anything:
  an expired sandbox is *claimed* by one script that moves its end ``CLAIM_SECONDS``
  ahead only if it is still expired — so one replica kills it, and if that replica dies
  mid-kill another tries again once the claim passed. A kill that succeeded (or found
  the sandbox gone) removes the member.
- ``idem:{sha256(tenant, user, key)}``: ``{"digest", "answer"}`` for ``REMEMBER_SECONDS``,
  at most ``MAX_REMEMBERED`` per user (``idem:by-user:…``, the oldest dropped first).
  The first create takes the key with ``SET NX`` (``{"digest"}`` alone, for
  ``PENDING_SECONDS``) before making the sandbox; a retry on any replica meanwhile waits
  for the answer (or answers 422 for another body). A create that fails releases the key.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from sandbox_workspace.contract.errors import Conflict

from ..identity import Caller
from .lifetimes import (
    MAX_REMEMBERED,
    REAP_EVERY,
    REMEMBER_SECONDS,
    Kill,
    Owner,
    end_of,
    mismatch,
    owner,
    reap_one,
    scope_of,
)

CLAIM_SECONDS = 60  # a claimed kill is tried again by any replica after this
PENDING_SECONDS = 120  # a create taking longer than this lets a retry make another
_REAP_BATCH = 100

# KEYS[1] ends; ARGV: member, now, new score. Claims the member when still expired.
CLAIM = """
local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
if s and tonumber(s) <= tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
  return 1
end
return 0
"""


def member(key: Owner) -> str:
    return json.dumps(list(key), separators=(",", ":"))


class SharedTimers:
    shared = True

    def __init__(self, redis, prefix: str) -> None:
        self.redis = redis
        self.key = prefix + "ends"
        self._claim = redis.register_script(CLAIM)
        self._reaper: asyncio.Task | None = None

    async def set(
        self, caller: Caller, sandbox_id: str, timeout: int, extend_only: bool = False
    ) -> None:
        m = member(owner(caller, sandbox_id))
        await self.redis.zadd(self.key, {m: end_of(timeout)}, gt=extend_only)

    async def remaining(self, caller: Caller, sandbox_id: str) -> float | None:
        score = await self.redis.zscore(self.key, member(owner(caller, sandbox_id)))
        return None if score is None else max(float(score) - time.time(), 0.0)

    async def forget(self, caller: Caller, sandbox_id: str) -> None:
        await self.redis.zrem(self.key, member(owner(caller, sandbox_id)))

    def start(self, spawn, kill: Kill) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = spawn(self.reap(kill))

    async def reap(self, kill: Kill) -> None:
        while await self.redis.zcard(self.key):
            now = time.time()
            due = await self.redis.zrangebyscore(self.key, "-inf", now, start=0, num=_REAP_BATCH)
            for raw in due:
                m = raw.decode() if isinstance(raw, bytes) else raw
                if not await self._claim(keys=[self.key], args=[m, now, now + CLAIM_SECONDS]):
                    continue  # another replica took it
                key = tuple(json.loads(m))
                await reap_one(key, kill, lambda m=m: self.redis.zrem(self.key, m))
            await asyncio.sleep(REAP_EVERY)


class CreateInProgress(Conflict):
    code = "idempotent_create_in_progress"


class SharedAnswers:
    def __init__(self, redis, prefix: str) -> None:
        self.redis = redis
        self.prefix = prefix + "idem:"

    async def once(
        self, caller: Caller, key: str, body: dict, make: Callable[[], Awaitable[Any]]
    ) -> Any:
        scope, digest = scope_of(caller, key, body)
        name = self.prefix + hashlib.sha256(json.dumps(scope).encode()).hexdigest()
        deadline = time.monotonic() + PENDING_SECONDS
        while True:
            pending = json.dumps({"digest": digest})
            if await self.redis.set(name, pending, nx=True, ex=PENDING_SECONDS):
                try:
                    answer = await make()
                except BaseException:
                    await asyncio.shield(self.redis.delete(name))
                    raise
                done = json.dumps({"digest": digest, "answer": answer})
                await self.redis.set(name, done, ex=REMEMBER_SECONDS)
                await self._bound(scope, name)
                return answer
            raw = await self.redis.get(name)
            if raw is None:
                continue  # released meanwhile (the first create failed): take it
            known = json.loads(raw)
            if known.get("digest") != digest:
                raise mismatch(key)
            if "answer" in known:
                return known["answer"]
            if time.monotonic() > deadline:
                raise CreateInProgress(
                    f"a create with Idempotency-Key '{key}' is still in progress; retry"
                )
            await asyncio.sleep(0.05)

    async def _bound(self, scope: tuple[str, str, str], name: str) -> None:
        """At most ``MAX_REMEMBERED`` answers per user (the oldest dropped first), as one
        process keeps at most that many: a user minting keys cannot grow Redis without
        bound within the 24 h."""
        user = hashlib.sha256(json.dumps(scope[:2]).encode()).hexdigest()
        index = self.prefix + "by-user:" + user
        await self.redis.zadd(index, {name: time.time()})
        await self.redis.expire(index, REMEMBER_SECONDS)
        extra = await self.redis.zcard(index) - MAX_REMEMBERED
        if extra > 0:
            oldest = [n for n, _ in await self.redis.zpopmin(index, extra)]
            await self.redis.delete(*oldest)
