"""The owner's writes to the Redis store, batched: what ``Run.sink`` receives.

Contract:
- ``Run.emit``, ``checkpoint``, ``open_approval``, a timed-out approval and ``finish``
  call the sink synchronously (the loop never waits for the network); each becomes an op
  queued per run, in call order.
- One task flushes: every run with queued ops gets one ``APPEND`` script call, all of
  them in one pipelined round trip — under load many events share one trip, so the cost
  per event shrinks as load grows. When a run's call succeeds, its followers are woken
  and may see events up to the last one stored (``Run.durable``): a follower on any
  replica sees the same log, and what a client saw survives the owner.
- ``APPEND`` refused (the lease is someone else's now): the run's ops are dropped and
  ``on_lost(run)`` stops it here. A server error: the batch is kept, in order, ahead of
  what came meanwhile, and retried with backoff — nothing is lost or reordered.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from redis.asyncio import Redis
from redis.exceptions import NoScriptError, RedisError

from .redis_log import APPEND, Keys

if TYPE_CHECKING:
    from ..runs import Run

log = logging.getLogger(__name__)
_RETRY_MAX = 2.0


class Writer:
    def __init__(
        self,
        redis: Redis,
        keys: Keys,
        token: str,
        lease_ms: int,
        retention_s: int,
        on_lost: Callable[[Run], None],
    ) -> None:
        self._redis, self._keys, self._on_lost = redis, keys, on_lost
        self._script = redis.register_script(APPEND)  # loaded by ``run``; its sha is fixed
        self._head = [token, str(retention_s), str(lease_ms)]
        self._ops: dict[str, list] = {}
        self._runs: dict[str, Run] = {}
        self._upto: dict[str, int] = {}
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self.in_flight: dict[str, str | None] = {}  # run id → tool call being executed
        self.decided: dict[str, dict[str, dict]] = {}  # run → call → decision, taken over
        self.step_ended = asyncio.Event()  # a tool call in flight ended (hand-over waits)
        self.lost_count = 0

    # -- the sink (called by Run, synchronously) -----------------------------------------
    def _put(self, run: Run, *op: Any) -> None:
        ops = self._ops.get(run.id)
        if ops is None:
            ops = self._ops[run.id] = []
            self._runs[run.id] = run
        ops.extend(op)
        self._idle.clear()
        self._wake.set()

    def new(self, run: Run, meta: dict) -> None:
        self._put(run, "n", json.dumps(meta))

    def event(self, run: Run, event_id: int, kind: str, frame: bytes) -> None:
        self._put(run, "e", event_id, kind, frame)
        self._upto[run.id] = event_id

    def checkpoint(self, run: Run, progress: Any) -> None:
        self.in_flight[run.id] = progress.in_flight
        if progress.in_flight is None:
            self.step_ended.set()
        self._put(run, "c", progress.snapshot())

    def approval_opened(self, run: Run, call_id: str) -> None:
        self._put(run, "a", call_id)
        known = self.decided.get(run.id, {}).get(call_id)
        if known is not None:  # decided while the run changed replicas
            run.decide(call_id, bool(known["approved"]), known.get("reason", ""))

    def approval_timed_out(self, run: Run, call_id: str) -> None:
        decision = {"approved": False, "reason": "timeout", "by_timeout": True}
        self._put(run, "t", call_id, json.dumps(decision))

    def finished(self, run: Run) -> None:
        self._put(run, "f", run.id)

    # -- flushing -------------------------------------------------------------------------
    async def drained(self) -> None:
        """Returns once everything queued so far is stored (or refused)."""
        await self._idle.wait()

    async def run(self) -> None:
        delay = 0.05
        await self._redis.script_load(APPEND)
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, runs, upto = self._ops, self._runs, self._upto
            self._ops, self._runs, self._upto = {}, {}, {}
            try:
                results = await self._flush(batch)
            except RedisError as e:  # keep the batch, in order, ahead of newer ops
                log.warning("run store write failed, retrying", extra={"error": str(e)})
                self._requeue(batch, runs, upto)
                await asyncio.sleep(delay)
                delay = min(_RETRY_MAX, delay * 2)
                self._wake.set()
                continue
            delay = 0.05
            if any(isinstance(r, NoScriptError) for r in results):
                # The server lost its scripts (restarted, flushed): load, write again. The
                # batch did nothing anywhere: a missing script fails before any write.
                await self._redis.script_load(APPEND)
                self._requeue(batch, runs, upto)
                self._wake.set()
                continue
            for run_id, result in zip(batch, results, strict=True):
                run = runs[run_id]
                if isinstance(result, Exception) or result == -1:
                    if isinstance(result, Exception):
                        log.error("run store refused a write", extra={"run_id": run_id})
                    self.lost_count += 1
                    self._on_lost(run)
                    continue
                if run_id in upto and (run.durable or 0) < upto[run_id]:
                    run.durable = upto[run_id]
                    run._notify()
            if not self._ops:
                self._idle.set()

    def _requeue(self, batch: dict, runs: dict, upto: dict) -> None:
        for run_id, ops in self._ops.items():
            batch.setdefault(run_id, []).extend(ops)
            runs[run_id] = self._runs[run_id]
        upto.update(self._upto)
        self._ops, self._runs, self._upto = batch, runs, upto

    async def _flush(self, batch: dict[str, list]) -> list:
        # EVALSHA straight away: a script object in a pipeline would first ask the server
        # whether the script exists — a second round trip per flush, on every event.
        sha = self._script.sha
        if len(batch) == 1:
            ((run_id, ops),) = batch.items()
            try:
                return [
                    await self._redis.evalsha(
                        sha, 4, *self._keys.run_keys(run_id), *self._head, *ops
                    )
                ]
            except NoScriptError as e:
                return [e]
        async with self._redis.pipeline(transaction=False) as pipe:
            for run_id, ops in batch.items():
                pipe.evalsha(sha, 4, *self._keys.run_keys(run_id), *self._head, *ops)
            return await pipe.execute(raise_on_error=False)
