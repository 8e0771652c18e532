"""Carrying on a run whose owner is gone (this replica has just acquired its lease).

Contract — from the run's stored state, exactly one of:
- already ended (its last event is ``done``): mark it finished, nothing else;
- cancelled while nobody owned it: ``error`` with the cancel's code (``cancelled``,
  ``conversation_deleted``), then ``done``;
- a tool call was in flight (``tool_start`` stored, no ``tool_end``): it may or may not
  have run, and running it again is not safe — ``error`` ``run_interrupted``, ``done``;
- otherwise: a ``status`` event ``resumed``, and the ReAct loop continues from the last
  completed step (its checkpoint: the messages so far, the tool calls still to do, an
  approval still awaited), or from the start when the run had no checkpoint yet.
Event ids continue after the last stored one; what followers saw is never re-sent.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from ..run import Run
from .redis_log import cancel_reason, decisions, read_log, text

if TYPE_CHECKING:
    from .redis_state import RedisStoreState

log = logging.getLogger(__name__)


async def carry_on(store: RedisStoreState, run_id: str) -> None:
    meta = await store.redis.hgetall(store.keys.meta(run_id))
    frames = await read_log(store.redis, store.keys, run_id)
    run = Run(
        user_id=text(meta, "user_id"),
        session_id=text(meta, "session_id"),
        conversation_id=text(meta, "conversation_id"),
        id=run_id,
    )
    run.frames = frames
    run.sink, run.durable = store.writer, len(frames)
    store.local[run_id] = run
    store.writer.stored.add(run_id)  # its lease is ours already
    known = decisions(meta)
    for message in store._early.pop(run_id, []):
        if message["op"] == "decide":
            known[message["call"]] = message
        else:
            reason = {"code": message.get("code"), "message": message.get("message")}
            meta[b"cancel"] = json.dumps(reason).encode()
    store.decided[run_id] = known
    raw = meta.get(b"checkpoint")
    checkpoint = json.loads(raw) if raw else None
    if frames and b"\nevent: done\n" in frames[-1]:
        outcome = "finished"
        run.finish()
    elif (reason := cancel_reason(meta)) is not None:
        outcome = "cancelled"
        _end(run, reason["code"], reason["message"])
    elif checkpoint is not None and checkpoint.get("in_flight"):
        outcome = "interrupted"
        _end(
            run,
            "run_interrupted",
            "the API replica running this run stopped during a tool call; the call may or "
            "may not have completed, so the run was not resumed — ask again to continue",
        )
    else:
        outcome = "resumed"
        run.emit(
            "status",
            {
                "stage": "resumed",
                "message": "another API replica carries the run on from its last step",
                "iteration": (checkpoint or {}).get("iteration", 1),
            },
        )
        assert store._resume is not None
        spec = json.loads(meta.get(b"spec") or b"{}")
        run.task = store._resume(run, spec, checkpoint)
    store.counts[outcome] += 1
    log.info(
        "took over a chat run",
        extra={"run_id": run_id, "outcome": outcome, "events": len(frames)},
    )


def _end(run, code: str, message: str) -> None:
    run.emit("error", {"code": code, "message": message})
    run.emit("done", {"run_id": run.id})
    run.finish()
