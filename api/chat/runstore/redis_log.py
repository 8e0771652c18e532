"""A run's state on a Redis-protocol server: key names, the atomic scripts, reading.

Keys (``{p}`` is the configured prefix):
- ``{p}run:{id}``        hash: user_id, session_id, conversation_id, state (running |
                         finished), spec (JSON), checkpoint (JSON), cancel ("1"),
                         ``a:{tool_call_id}`` = "open" or the decision (JSON)
- ``{p}run:{id}:log``    stream: event N has the stream id ``N-0`` and fields k (kind),
                         f (its SSE frame, bytes as sent)
- ``{p}run:{id}:lease``  the owner's token; expires unless the owner renews it
- ``{p}open``            set of the ids of runs not finished
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
from collections.abc import AsyncIterator

from redis.asyncio import Redis

# KEYS: meta, log, lease, open. ARGV: token, retention s, lease ms, then ops:
#   n <meta JSON>                  a new run: take the lease, write metadata, mark open
#   e <id> <kind> <frame>          append event <id>
#   c <checkpoint JSON>            the loop's state after its last completed step
#   a <call>                       an approval is open
#   t <call> <decision JSON>       an approval timed out (unless decided meanwhile)
#   f <run id>                     finished: no longer open, keys expire
APPEND = """
if ARGV[4] == 'n' then
  redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[3])
elseif redis.call('GET', KEYS[3]) ~= ARGV[1] then
  return -1
end
local i = 4
while i <= #ARGV do
  local op = ARGV[i]
  if op == 'e' then
    redis.call('XADD', KEYS[2], ARGV[i+1] .. '-0', 'k', ARGV[i+2], 'f', ARGV[i+3])
    i = i + 4
  elseif op == 'c' then
    redis.call('HSET', KEYS[1], 'checkpoint', ARGV[i+1]); i = i + 2
  elseif op == 'a' then
    redis.call('HSETNX', KEYS[1], 'a:' .. ARGV[i+1], 'open'); i = i + 2
  elseif op == 't' then
    if redis.call('HGET', KEYS[1], 'a:' .. ARGV[i+1]) == 'open' then
      redis.call('HSET', KEYS[1], 'a:' .. ARGV[i+1], ARGV[i+2])
    end
    i = i + 3
  elseif op == 'n' then
    local meta = cjson.decode(ARGV[i+1])
    for k, v in pairs(meta) do redis.call('HSET', KEYS[1], k, v) end
    redis.call('SADD', KEYS[4], meta['id']); i = i + 2
  elseif op == 'f' then
    redis.call('HSET', KEYS[1], 'state', 'finished')
    redis.call('SREM', KEYS[4], ARGV[i+1])
    redis.call('EXPIRE', KEYS[1], ARGV[2]); redis.call('EXPIRE', KEYS[2], ARGV[2])
    redis.call('DEL', KEYS[3]); i = i + 2
  else
    return redis.error_reply('unknown op ' .. op)
  end
end
return 0
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

# KEYS: meta, lease. ARGV: channel prefix, message. 0 = finished already, 1 = recorded.
CANCEL = """
if redis.call('HGET', KEYS[1], 'state') ~= 'running' then return 0 end
redis.call('HSET', KEYS[1], 'cancel', '1')
local owner = redis.call('GET', KEYS[2])
if owner then redis.call('PUBLISH', ARGV[1] .. owner, ARGV[2]) end
return 1
"""


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

    def control(self, owner: str) -> str:
        return f"{self.control_prefix}{owner}"

    def run_keys(self, run_id: str) -> list[str]:
        return [self.meta(run_id), self.log(run_id), self.lease(run_id), self.open]


def text(meta: dict, key: str, default: str = "") -> str:
    value = meta.get(key.encode())
    return default if value is None else value.decode()


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
    an empty batch after each ``idle`` seconds without one (keep-alive cue)."""
    position = f"{max(0, after)}-0"
    block = int((idle or 5.0) * 1000)
    while True:
        reply = await redis.xread({keys.log(run_id): position}, count=1000, block=block)
        if not reply:
            if not await redis.exists(keys.meta(run_id)):
                return  # expired while nobody wrote: nothing will come
            if idle is not None:
                yield []
            continue
        entries = reply[0][1]
        position = entries[-1][0]
        yield [fields[b"f"] for _, fields in entries]
        if entries[-1][1][b"k"] == b"done":
            return
