"""Decisions and cancels reaching the replica that owns a run.

Contract: ``listen`` receives what ``decide``/``cancel`` published to this replica's
control channel and applies it to the owned ``Run`` (``apply``) — or keeps it for a run
this replica is taking over right now. Pub/sub may drop messages across a reconnect, so
``reconcile`` (every heartbeat) re-reads the metadata of owned runs: a recorded cancel,
and the decisions of approvals still awaited, are applied again (idempotent).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import TYPE_CHECKING

from sandbox_workspace.contract.errors import ApiError

from .cancelling import end_if_cancelling
from .redis_log import decisions

if TYPE_CHECKING:
    from ..run import Run
    from .redis_state import RedisStoreState

log = logging.getLogger(__name__)


def apply(store: RedisStoreState, run: Run, message: dict) -> None:
    """A decision or cancel for a run this replica owns."""
    if message["op"] == "cancel":
        if run.task is not None and not run.task.cancelling():
            run.cancel(message.get("code", "cancelled"), message.get("message", "cancelled"))
        return
    # Kept too for an approval the loop has not reopened yet (a run just taken over).
    store.decided.setdefault(run.id, {})[message["call"]] = message
    with contextlib.suppress(ApiError):  # not open yet, or timed out: stays so
        run.decide(message["call"], message["approved"], message.get("reason", ""))


async def listen(store: RedisStoreState, pubsub) -> None:
    while True:  # a dropped connection: redis-py reconnects and subscribes again
        try:
            async for item in pubsub.listen():
                _received(store, item)
        except Exception as e:
            end_if_cancelling(e)
            log.warning("run store control channel failed; reconnecting", exc_info=True)
            await asyncio.sleep(1.0)


def _received(store: RedisStoreState, item: dict) -> None:
    if item["channel"].decode() == store.keys.takeover:
        store._scan_now.set()
        return
    message = json.loads(item["data"])
    run = store.local.get(message["run"])
    if run is None:  # being taken over right now: applied once it is
        store._early.setdefault(message["run"], []).append(message)
    else:
        apply(store, run, message)


# KEYS: the metadata of this replica's open runs. ARGV[i]: "1" if run i awaits an
# approval. Returns, only for runs with something to apply: {i, cancel reason JSON or "",
# {a:<call>, decision, ...} (the decided approvals, runs awaiting one only)}. One call
# with one short reply, not a command and a reply per run: the pipeline of 400 commands
# it replaces held the API's event loop ~7 ms every heartbeat (200 open runs).
RECONCILE = """
local out = {}
for i, key in ipairs(KEYS) do
  local cancel = redis.call('HGET', key, 'cancel')
  if cancel then
    table.insert(out, {i, cancel, {}})
  elseif ARGV[i] == '1' then
    local all, decided = redis.call('HGETALL', key), {}
    for j = 1, #all, 2 do
      if string.sub(all[j], 1, 2) == 'a:' and all[j + 1] ~= 'open' then
        table.insert(decided, all[j]); table.insert(decided, all[j + 1])
      end
    end
    if #decided > 0 then table.insert(out, {i, '', decided}) end
  end
end
return out
"""


async def reconcile(store: RedisStoreState) -> None:
    """What pub/sub may have dropped (a reconnect) is in the metadata: cancels, and
    decisions of approvals still awaited here."""
    runs = [r for r in store.local.values() if not r.finished]
    if not runs:
        return
    found = await store.redis.register_script(RECONCILE)(
        keys=[store.keys.meta(run.id) for run in runs],
        args=["1" if run.awaiting_approval else "0" for run in runs],
    )
    for index, cancel, decided in found:
        run = runs[index - 1]
        if cancel:
            apply(store, run, {"run": run.id, "op": "cancel", **json.loads(cancel)})
            continue
        meta = dict(zip(decided[::2], decided[1::2], strict=True))
        open_calls = run.open_calls()
        for call, decision in decisions(meta).items():
            if call in open_calls:
                apply(store, run, {"run": run.id, "op": "decide", "call": call, **decision})
