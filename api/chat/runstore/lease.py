"""Ownership of runs by leases: one owner per open run, proven by a key that expires.

Contract:
- The owner (the replica running the run's ReAct loop) holds ``{p}run:{id}:lease`` =
  its token, with a time to live; ``renew`` extends all of a replica's leases in one call
  and names those it no longer holds (another replica took them: stop writing, the
  store's APPEND refuses anyway).
- ``acquire`` takes an open run whose lease is gone (owner dead, or handed over); at most
  one replica wins. A run that finished meanwhile is dropped from the open set instead.
- ``release`` gives leases up at a graceful shutdown, so the others take over at once
  rather than after the time to live.
- ``orphans`` lists the open runs nobody holds.
"""

from __future__ import annotations

from redis.asyncio import Redis

from .redis_log import Keys

# KEYS: leases. ARGV: token, ms. Returns the 1-based indexes of the leases lost.
RENEW = """
local lost = {}
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then
    redis.call('PEXPIRE', key, ARGV[2])
  else
    table.insert(lost, i)
  end
end
return lost
"""

# KEYS: leases. ARGV: token.
RELEASE = """
for _, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then redis.call('DEL', key) end
end
return 0
"""

# KEYS: meta, lease, open. ARGV: token, ms, run id. 1 = acquired.
ACQUIRE = """
if redis.call('HGET', KEYS[1], 'state') ~= 'running' then
  redis.call('SREM', KEYS[3], ARGV[3])
  return 0
end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return 0
"""


# KEYS: open. ARGV: the lease key's prefix and suffix. The open runs without a lease, in
# one call (a pipeline of one EXISTS per open run held the API's loop ~4 ms a scan).
ORPHANS = """
local out = {}
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if redis.call('EXISTS', ARGV[1] .. id .. ARGV[2]) == 0 then table.insert(out, id) end
end
return out
"""


class Leases:
    def __init__(self, redis: Redis, keys: Keys, token: str, ttl_ms: int) -> None:
        self.keys, self.token, self.ttl_ms = keys, token, ttl_ms
        self._renew = redis.register_script(RENEW)
        self._release = redis.register_script(RELEASE)
        self._acquire = redis.register_script(ACQUIRE)
        self._orphans = redis.register_script(ORPHANS)
        self._redis = redis

    async def renew(self, run_ids: list[str]) -> list[str]:
        """Extend these leases; returns the ids of those this replica no longer holds."""
        if not run_ids:
            return []
        lost = await self._renew(
            keys=[self.keys.lease(r) for r in run_ids], args=[self.token, self.ttl_ms]
        )
        return [run_ids[i - 1] for i in lost]

    async def release(self, run_ids: list[str]) -> None:
        if run_ids:
            await self._release(keys=[self.keys.lease(r) for r in run_ids], args=[self.token])

    async def acquire(self, run_id: str) -> bool:
        keys = [self.keys.meta(run_id), self.keys.lease(run_id), self.keys.open]
        return bool(await self._acquire(keys=keys, args=[self.token, self.ttl_ms, run_id]))

    async def orphans(self, skip: set[str]) -> list[str]:
        """Open runs (not in ``skip``) whose lease is gone."""
        prefix, _, suffix = self.keys.lease("\0").partition("\0")
        found = await self._orphans(keys=[self.keys.open], args=[prefix, suffix])
        return [r.decode() for r in found if r.decode() not in skip]
