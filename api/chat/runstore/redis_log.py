"""A run's state on a Redis-protocol server: key names, the atomic scripts, reading.

Keys (``{p}`` is the configured prefix):
- ``{p}run:{id}``        hash: user_id, session_id, conversation_id, state (running |
                         finished), spec (JSON), checkpoint (JSON), cancel ({code, message}),
                         ``a:{tool_call_id}`` = "open" or the decision (JSON)
- ``{p}run:{id}:log``    stream: event N has the stream id ``N-0`` and fields k (kind),
                         f (its SSE frame, bytes as sent)
- ``{p}run:{id}:lease``  the owner's token; expires unless the owner renews it
- ``{p}open``            set of the ids of runs not finished
- ``{p}conv:{len(session)}:{session}:{conversation}``  set of a conversation's run ids
                         (expires after its newest run's deadline plus the retention
                         time); the session's length first, as ids may hold ``:``, so
                         no two (session, conversation) pairs share a key
- ``{p}ctl:{owner}``     pub/sub channel: decisions and cancels for that owner's runs
- ``{p}takeover``        pub/sub channel: "a run has no owner now, look" (hand-overs)

Every write of a run's owner goes through ``APPEND``, which first checks the lease is
still the writer's: a replica that lost its lease (paused, partitioned) can never add an
event again. Event N is stored with the explicit id ``N-0``, so a second writer of the
same event is refused by the server itself — no duplicate can reach the log.
Finished runs' keys expire after the retention time.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

from redis.asyncio import Redis

# All the runs of one flush in one call (one script run per flush, not per run: the
# client's cost per command dominated). KEYS: open, then meta, log, lease of each run.
# ARGV: token, retention s, lease ms, then per run: how many op arguments follow, the ops:
#   n <meta JSON>          a new run: take the lease, write metadata, mark open, add it to
#                          its conversation's index (``index``, kept ``index_ttl`` s)
#   e <frame>              append the event the SSE frame is (its id and kind are read
#                          from the frame's first lines: the client sends each once)
#   c <checkpoint JSON>    the loop's state after its last completed step
#   a <call>               an approval is open
#   t <call> <decision>    an approval timed out (unless decided meanwhile)
#   f <run id>             finished: no longer open, keys expire
# Returns per run: 0 stored, -1 not the lease holder (nothing written); an error reply if
# the server refused a write (out of memory, ...: what ran before stays, and the retry
# skips it). Idempotent for the lease holder: an event id not above the stream's last is
# already stored (a retry after a lost reply) and is skipped — the stream itself never
# takes an id twice.
APPEND = r"""
local results = {}
local a, r = 4, 0
while a <= #ARGV do
  local meta, log, lease = KEYS[2 + r * 3], KEYS[3 + r * 3], KEYS[4 + r * 3]
  r = r + 1
  local stop = a + tonumber(ARGV[a])
  local i = a + 1
  a = stop + 1
  results[r] = 0
  -- A new run takes its lease; a retried 'n' (its first reply lost) only while the run
  -- is still ours: another replica may have taken it over, or finished it, meanwhile.
  if ARGV[i] == 'n' and (redis.call('EXISTS', meta) == 0
      or redis.call('GET', lease) == ARGV[1]) then
    redis.call('SET', lease, ARGV[1], 'PX', ARGV[3])
  elseif redis.call('GET', lease) ~= ARGV[1] then
    results[r] = -1
    i = stop + 1
  end
  while i <= stop do
    local op = ARGV[i]
    if op == 'e' then
      local frame = ARGV[i + 1]
      local id, kind = string.match(frame, '^id: (%d+)\nevent: ([^\n]+)')
      local added = redis.pcall('XADD', log, id .. '-0', 'k', kind, 'f', frame)
      -- Already stored (a retry) is fine; any other refusal (OOM, NOREPLICAS) fails the
      -- whole call, so the writer keeps the batch and sends it again.
      if type(added) == 'table' and added.err
          and not string.find(added.err, 'equal or smaller', 1, true) then
        return added
      end
      i = i + 2
    elseif op == 'c' then
      redis.call('HSET', meta, 'checkpoint', ARGV[i + 1]); i = i + 2
    elseif op == 'a' then
      redis.call('HSETNX', meta, 'a:' .. ARGV[i + 1], 'open'); i = i + 2
    elseif op == 't' then
      if redis.call('HGET', meta, 'a:' .. ARGV[i + 1]) == 'open' then
        redis.call('HSET', meta, 'a:' .. ARGV[i + 1], ARGV[i + 2])
      end
      i = i + 3
    elseif op == 'n' then
      local fields = cjson.decode(ARGV[i + 1])
      local index, ttl = fields['index'], tonumber(fields['index_ttl'])
      fields['index'], fields['index_ttl'] = nil, nil
      for k, v in pairs(fields) do redis.call('HSET', meta, k, v) end
      redis.call('SADD', KEYS[1], fields['id'])
      redis.call('SADD', index, fields['id'])
      if redis.call('TTL', index) < ttl then redis.call('EXPIRE', index, ttl) end
      i = i + 2
    elseif op == 'f' then
      redis.call('HSET', meta, 'state', 'finished')
      redis.call('SREM', KEYS[1], ARGV[i + 1])
      redis.call('EXPIRE', meta, ARGV[2]); redis.call('EXPIRE', log, ARGV[2])
      redis.call('DEL', lease); i = i + 2
    else
      return redis.error_reply('unknown op ' .. op)
    end
  end
end
return results
"""

# KEYS: meta, lease. ARGV: call, decision JSON, channel prefix, message.
# 0 = unknown call, 1 = already decided, 2 = recorded (and sent to the owner, if any).
DECIDE = """
local state = redis.call('HGET', KEYS[1], 'a:' .. ARGV[1])
if not state then return 0 end
if state ~= 'open' then return 1 end
redis.call('HSET', KEYS[1], 'a:' .. ARGV[1], ARGV[2])
local owner = redis.call('GET', KEYS[2])
if owner then redis.call('PUBLISH', ARGV[3] .. owner, ARGV[4]) end
return 2
"""

# KEYS: meta, lease. ARGV: channel prefix, message, reason JSON ({code, message}).
# 0 = finished already, 1 = recorded.
CANCEL = """
if redis.call('HGET', KEYS[1], 'state') ~= 'running' then return 0 end
redis.call('HSET', KEYS[1], 'cancel', ARGV[3])
local owner = redis.call('GET', KEYS[2])
if owner then redis.call('PUBLISH', ARGV[1] .. owner, ARGV[2]) end
return 1
"""


_MAX_BLOCK = 2.0  # seconds one XREAD may block


class Keys:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.open = f"{prefix}open"
        self.takeover = f"{prefix}takeover"
        self.control_prefix = f"{prefix}ctl:"

    def meta(self, run_id: str) -> str:
        return f"{self.prefix}run:{run_id}"

    def log(self, run_id: str) -> str:
        return f"{self.prefix}run:{run_id}:log"

    def lease(self, run_id: str) -> str:
        return f"{self.prefix}run:{run_id}:lease"

    def conversation(self, session_id: str, conversation_id: str) -> str:
        # Length-prefixed: ("a", "b:c") and ("a:b", "c") must not share a key.
        return f"{self.prefix}conv:{len(session_id)}:{session_id}:{conversation_id}"

    def control(self, owner: str) -> str:
        return f"{self.control_prefix}{owner}"

    def run_keys(self, run_id: str) -> tuple[str, str, str]:
        return self.meta(run_id), self.log(run_id), self.lease(run_id)


def text(meta: dict, key: str, default: str = "") -> str:
    value = meta.get(key.encode())
    return default if value is None else value.decode()


def cancel_reason(meta: dict) -> dict | None:
    """The recorded cancel of a run ({code, message}), or None."""
    raw = meta.get(b"cancel")
    return None if raw is None else json.loads(raw)


def decisions(meta: dict) -> dict[str, dict]:
    """The decided approvals recorded in a run's metadata, by tool call id."""
    out = {}
    for key, value in meta.items():
        if key.startswith(b"a:") and value != b"open":
            out[key[2:].decode()] = json.loads(value)
    return out


async def read_log(redis: Redis, keys: Keys, run_id: str) -> list[bytes]:
    """Every stored frame of a run, in order (event N at index N - 1)."""
    frames: list[bytes] = []
    start = "-"
    while True:
        entries = await redis.xrange(keys.log(run_id), min=start, count=1000)
        frames.extend(fields[b"f"] for _, fields in entries)
        if len(entries) < 1000:
            return frames
        start = "(" + entries[-1][0].decode()


async def follow_log(
    redis: Redis, keys: Keys, run_id: str, after: int, idle: float | None
) -> AsyncIterator[list[bytes]]:
    """Frames after event ``after`` as they are stored (blocking reads), until ``done``;
    an empty batch after each ``idle`` seconds without one (keep-alive cue). A run that
    is over (or gone) is read without blocking: what is left, then the end."""
    position = f"{max(0, after)}-0"
    # Each blocking read stays well under the client's socket timeout (a read that
    # outlasts it fails); keep-alive cues still come every ``idle`` seconds.
    block = int(min(idle or _MAX_BLOCK, _MAX_BLOCK) * 1000)
    over = await redis.hget(keys.meta(run_id), "state") != b"running"
    quiet_since = time.monotonic()
    while True:
        wait = None if over else block
        reply = await redis.xread({keys.log(run_id): position}, count=1000, block=wait)
        if not reply:
            if over:
                return
            over = await redis.hget(keys.meta(run_id), "state") != b"running"
            if idle is not None and not over and time.monotonic() - quiet_since >= idle:
                quiet_since = time.monotonic()
                yield []
            continue
        quiet_since = time.monotonic()
        entries = reply[0][1]
        position = entries[-1][0]
        yield [fields[b"f"] for _, fields in entries]
        if entries[-1][1][b"k"] == b"done":
            return
