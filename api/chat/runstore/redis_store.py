"""The Redis-protocol run store (Valkey, or Redis >= 7): runs shared by API replicas.

Contract:
- A run started here is written through ``Writer`` (events, checkpoints, approvals) and
  owned by this replica's lease, renewed every third of its time to live. A replica
  whose last successful renewal round began two thirds of a lease ago or more starts no
  tool call (``before_tool`` waits: the *fence*) — a partitioned replica's tools never
  run beside the taking-over replica's — and is not ready (``reachable``, ``/readyz``)
  once a whole lease passed without one. Followers on
  any replica read the same stream (``follow_log``: blocking XREAD, from any
  ``Last-Event-ID``).
- ``decide`` / ``cancel`` on any replica are recorded in the run's metadata by one script
  (so a second decision is 409 wherever it is sent) and published to the owner's control
  channel; the owner applies them to its ``Run``. What was decided while nobody owned the
  run is read back by the replica that takes it over.
- Every replica scans for open runs without a lease (every half time to live, and at once
  when a replica announces a hand-over) and takes them over (``takeover.carry_on``).
- ``aclose`` hands over: waits (bounded) for tool calls in flight to end, stops the loops
  without ending their streams, stores everything queued, releases the leases and
  announces it; the other replicas carry the runs on from their last step.
- What the protocol routes read of a view (``RemoteRun``) comes from the store: its log
  (``frames``), the approvals its metadata has open, its last event id; a client-side
  chat's run is ``{p}chat:{len(user)}:{user}:{chat}`` (JSON, expires after ``ttl``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily
from redis.asyncio import Redis

from sandbox_workspace.contract.errors import Conflict, NotFoundError

from ..chat_index import ChatRun
from . import Resume, RunStore, control
from .cancelling import end_if_cancelling
from .lease import Leases
from .redis_log import CANCEL, DECIDE, Keys, follow_log, read_log, text
from .writer import Writer

if TYPE_CHECKING:
    from ..run import Run

log = logging.getLogger(__name__)


@dataclass
class RemoteRun:
    """A run another replica owns, seen through the store (what ``find`` returns)."""

    id: str
    user_id: str
    session_id: str
    conversation_id: str
    finished: bool
    awaiting_approval: bool
    store: RedisRunStore
    created_at: float = 0.0  # wall clock

    def follow(self, after: int = 0, idle: float | None = None):
        return follow_log(self.store.redis, self.store.keys, self.id, after, idle)

    @property
    def started_at(self) -> float:  # as ``Run.started_at`` (listings)
        return self.created_at


class RedisRunStore(RunStore):
    replicated = True

    def __init__(
        self,
        redis: Redis,
        *,
        prefix: str = "sbw:",
        lease_seconds: float = 10.0,
        retention_seconds: float = 900.0,
        handover_seconds: float = 20.0,
    ) -> None:
        self.redis = redis
        self.keys = Keys(prefix)
        self.token = f"{uuid.uuid4().hex}"  # this replica, for as long as it lives
        self.lease_seconds = lease_seconds
        # When the last renewal round that succeeded began (monotonic): the lease fence.
        self._contact = time.monotonic()
        self._renewed = asyncio.Event()  # set by each renewal round that succeeds
        self.retention = retention_seconds
        self.handover_seconds = handover_seconds
        self.leases = Leases(redis, self.keys, self.token, int(lease_seconds * 1000))
        self.writer = Writer(
            redis,
            self.keys,
            self.token,
            int(lease_seconds * 1000),
            max(1, int(retention_seconds)),
            self._lost,
        )
        self._decide = redis.register_script(DECIDE)
        self._cancel = redis.register_script(CANCEL)
        self.local: dict[str, Run] = {}  # open runs this replica owns
        self.decided = self.writer.decided  # run → call → decision (taken over)
        self._early: dict[str, list[dict]] = {}  # control messages for runs being taken
        self._taking: set[str] = set()  # runs whose lease is ours, not yet in ``local``
        self._tasks: list[asyncio.Task] = []
        self._scan_now = asyncio.Event()
        self._resume: Resume | None = None
        self._closing = False
        self.counts: Counter[str] = Counter()  # takeover outcomes, hand-overs, leases lost

    @classmethod
    def from_settings(cls, settings) -> RedisRunStore:
        url = settings.chat_redis_url.get_secret_value()
        # Enough connections for one blocking read per follower of another replica's run.
        redis = Redis.from_url(
            url,
            max_connections=4096,
            health_check_interval=30,
            socket_connect_timeout=5,
            socket_timeout=30,  # a dead server shows within this; reads block 2 s at most
        )
        return cls(
            redis,
            prefix=settings.chat_redis_prefix,
            lease_seconds=settings.chat_run_lease_seconds,
            retention_seconds=settings.chat_run_retention_seconds,
            handover_seconds=settings.chat_run_handover_seconds,
        )

    # -- lifecycle --------------------------------------------------------------------------
    async def start(self, resume: Resume) -> None:
        self._resume = resume
        try:
            await self.redis.ping()
        except Exception as e:
            raise RuntimeError(
                f"chat run store: cannot reach Redis ({e}); check "
                "SANDBOX_WORKSPACE_CHAT_REDIS_URL or set SANDBOX_WORKSPACE_CHAT_RUN_STORE=memory"
            ) from e
        pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
        await pubsub.subscribe(self.keys.control(self.token), self.keys.takeover)
        for work in (
            self.writer.run(),
            control.listen(self, pubsub),
            self._heartbeat(),
            self._scan(),
        ):
            self._tasks.append(asyncio.create_task(work))

    async def aclose(self, runs: list[Run]) -> None:
        self._closing = True
        open_runs = [r for r in self.local.values() if not r.finished]
        deadline = time.monotonic() + self.handover_seconds
        # A tool call in flight cannot be repeated safely: let it end (bounded).
        while True:
            self.writer.step_ended.clear()
            if not any(self.writer.in_flight.get(r.id) for r in open_runs if not r.finished):
                break
            left = deadline - time.monotonic()
            if left <= 0:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.writer.step_ended.wait(), left)
        for run in open_runs:
            if not run.finished:
                self._move(run)
        await asyncio.gather(*(r.task for r in open_runs if r.task), return_exceptions=True)
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.handover_seconds):
                await self.writer.drained()
            await self.leases.release([r.id for r in open_runs])
            if open_runs:
                await self.redis.publish(self.keys.takeover, self.token)
            log.info("handed chat runs over", extra={"runs": len(open_runs)})
            self.counts["handed_over"] += len(open_runs)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.redis.aclose()

    # -- the interface ----------------------------------------------------------------------
    def register(self, run: Run, spec: dict | None) -> None:
        run.sink, run.durable = self.writer, len(run.frames)
        self.local[run.id] = run
        meta = {
            "id": run.id,
            "user_id": run.user_id,
            "session_id": run.session_id,
            "conversation_id": run.conversation_id,
            "state": "running",
            "created_at": repr(run.started_at),  # the same on every replica
            "spec": json.dumps(spec or {}),
            "index": self.keys.conversation(run.session_id, run.conversation_id),
            "index_ttl": int((spec or {}).get("deadline_seconds", 3600) + self.retention),
        }
        self.writer.new(run, meta)

    async def lookup(self, run_id: str) -> RemoteRun | None:
        meta = await self.redis.hgetall(self.keys.meta(run_id))
        return self._view(run_id, meta) if meta else None

    async def conversation_runs(self, session_id: str, conversation_id: str) -> list[RemoteRun]:
        index = self.keys.conversation(session_id, conversation_id)
        run_ids = sorted(r.decode() for r in await self.redis.smembers(index))
        async with self.redis.pipeline(transaction=False) as pipe:
            for run_id in run_ids:
                pipe.hgetall(self.keys.meta(run_id))
            metas = await pipe.execute()
        gone = [r for r, m in zip(run_ids, metas, strict=True) if not m]
        if gone:  # finished and expired
            await self.redis.srem(index, *gone)
        views = [self._view(r, m) for r, m in zip(run_ids, metas, strict=True) if m]
        return sorted(views, key=lambda v: v.created_at)

    def _view(self, run_id: str, meta: dict) -> RemoteRun:
        return RemoteRun(
            id=run_id,
            user_id=text(meta, "user_id"),
            session_id=text(meta, "session_id"),
            conversation_id=text(meta, "conversation_id"),
            finished=text(meta, "state") != "running",
            awaiting_approval=text(meta, "state") == "running" and b"open" in meta.values(),
            store=self,
            created_at=float(text(meta, "created_at", "0")),
        )

    async def decide(self, run: Any, call_id: str, approved: bool, reason: str) -> None:
        decision = {"approved": approved, "reason": reason}
        message = json.dumps({"run": run.id, "op": "decide", "call": call_id, **decision})
        outcome = await self._decide(
            keys=[self.keys.meta(run.id), self.keys.lease(run.id)],
            args=[call_id, json.dumps(decision), self.keys.control_prefix, message],
        )
        if outcome == 0:
            raise NotFoundError(
                f"run '{run.id}' has no tool call '{call_id}' awaiting approval",
                code="unknown_tool_call",
            )
        if outcome == 1:
            raise Conflict(f"tool call '{call_id}' was already decided", code="already_decided")

    async def cancel(
        self, run: Any, code: str = "cancelled", message: str = "the run was cancelled"
    ) -> bool:
        if run.finished:
            return False
        reason = {"code": code, "message": message}
        note = json.dumps({"run": run.id, "op": "cancel", **reason})
        return bool(
            await self._cancel(
                keys=[self.keys.meta(run.id), self.keys.lease(run.id)],
                args=[self.keys.control_prefix, note, json.dumps(reason)],
            )
        )

    # -- what the protocol routes read (views from the store) ----------------------------
    async def frames(self, run: Any) -> list[bytes]:
        if not isinstance(run, RemoteRun):
            return await super().frames(run)
        return await read_log(self.redis, self.keys, run.id)

    async def open_approvals(self, run: Any) -> set[str]:
        if not isinstance(run, RemoteRun):
            return await super().open_approvals(run)
        meta = await self.redis.hgetall(self.keys.meta(run.id))
        if text(meta, "state") != "running":
            return set()
        return {k[2:].decode() for k, v in meta.items() if k.startswith(b"a:") and v == b"open"}

    async def last_event_ids(self, runs: list[Any]) -> list[int]:
        there = [r for r in runs if isinstance(r, RemoteRun)]
        async with self.redis.pipeline(transaction=False) as pipe:
            for run in there:
                pipe.xrevrange(self.keys.log(run.id), count=1)
            # Event N is stored as stream id N-0.
            stored = {
                run.id: int(last[0][0].split(b"-")[0]) if last else 0
                for run, last in zip(there, await pipe.execute() if there else [], strict=True)
            }
        here = [r for r in runs if not isinstance(r, RemoteRun)]
        stored.update(zip([r.id for r in here], await super().last_event_ids(here), strict=True))
        return [stored[r.id] for r in runs]

    def _chat_key(self, session_id: str, chat_id: str) -> str:
        # The session's length first: no two (session, chat) pairs share a key.
        return f"{self.keys.prefix}chat:{len(session_id)}:{session_id}:{chat_id}"

    async def chat_run(self, session_id: str, chat_id: str) -> ChatRun | None:
        raw = await self.redis.get(self._chat_key(session_id, chat_id))
        return None if raw is None else ChatRun(**json.loads(raw))

    async def set_chat_run(self, session_id: str, chat_id: str, entry: ChatRun, ttl: float) -> None:
        value = json.dumps({"run_id": entry.run_id, "message_id": entry.message_id})
        key = self._chat_key(session_id, chat_id)
        await self.redis.set(key, value, px=max(1, int(ttl * 1000)))

    # -- background work --------------------------------------------------------------------
    # -- the lease fence ----------------------------------------------------------------
    @property
    def reachable(self) -> bool:
        """Redis answered a renewal round that began less than a lease ago."""
        return time.monotonic() < self._contact + self.lease_seconds

    @property
    def fenced(self) -> bool:
        """Whether this replica's leases may be about to expire: the last renewal round
        that succeeded began more than a lease minus a heartbeat period ago. Leases are
        renewed with a time to live of ``lease_seconds`` from that round's start at the
        latest, so until then no other replica can have taken a run over."""
        return time.monotonic() >= self._contact + self.lease_seconds * 2 / 3

    async def before_tool(self, run_id: str) -> None:
        """Pause the run while fenced, or while its lease is not known stored (its first
        write's reply may have been lost with the connection): a tool started now could
        also be run by the replica that takes the run over. It continues once a renewal
        covering it succeeds, or is cancelled here when its lease is found gone
        (``_lost``)."""
        if self._unsure(run_id):
            self.counts["fenced"] += 1
        while self._unsure(run_id) and not self._closing:
            self._renewed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._renewed.wait(), self.lease_seconds / 3)

    def _unsure(self, run_id: str) -> bool:
        return self.fenced or (run_id in self.local and run_id not in self.writer.stored)

    async def _heartbeat(self) -> None:
        while not self._closing:
            await asyncio.sleep(self.lease_seconds / 3)
            started = time.monotonic()
            for run_id in [i for i, r in self.local.items() if r.finished]:
                self.local.pop(run_id, None)
                self.writer.stored.discard(run_id)
                self.writer.in_flight.pop(run_id, None)
                self.decided.pop(run_id, None)
            for run_id in [i for i in self._early if i not in self._taking]:
                del self._early[run_id]  # for runs this replica gave away meanwhile
            try:
                # Only runs whose lease is stored: a run just started may still be queued.
                held = [r for r in self.local if r in self.writer.stored]
                if held:
                    lost = await self.leases.renew(held)
                else:
                    lost = []
                    await self.redis.ping()  # reachable, for readiness and the fence
                self._contact = max(self._contact, started)
                self._renewed.set()
                for run_id in lost:
                    if run_id in self.local:
                        self._lost(self.local[run_id])
                await control.reconcile(self)
            except Exception as e:
                end_if_cancelling(e)
                log.warning("lease renewal failed", exc_info=True)

    async def _scan(self) -> None:
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.lease_seconds / 2):
                    await self._scan_now.wait()
            self._scan_now.clear()
            try:
                for run_id in await self.leases.orphans(set(self.local)):
                    if self._closing:
                        return
                    if await self.leases.acquire(run_id):
                        from .takeover import carry_on

                        self._taking.add(run_id)
                        try:
                            await carry_on(self, run_id)
                        finally:
                            self._taking.discard(run_id)
            except Exception:
                log.warning("run takeover scan failed", exc_info=True)

    # -- moving runs away -------------------------------------------------------------------
    def _move(self, run: Run) -> None:
        """Stop the loop here without ending the stream: another replica carries it on;
        local followers continue from the store."""
        run.relay = lambda after, idle: follow_log(self.redis, self.keys, run.id, after, idle)
        # Over here (the registry drops it after the retention time); not in the store.
        run.finished_at = run.finished_at or time.monotonic()
        run._notify()
        self.local.pop(run.id, None)
        if run.task is not None and not run.task.done():
            run.task.cancel()

    def _lost(self, run: Run) -> None:
        if run.relay is None and not run.finished:  # finished: its lease went with it
            log.warning("lost the lease of a chat run", extra={"run_id": run.id})
            self.counts["lease_lost"] += 1
            self._move(run)

    def metric_families(self):
        """For /metrics: how runs moved between replicas (this replica's view)."""
        family = CounterMetricFamily(
            "sandbox_chat_run_moves",
            "Chat runs taken over (by outcome), handed over, or lost (lease) by this replica",
            labels=["event"],
        )
        for event in ("resumed", "interrupted", "cancelled", "finished", "handed_over"):
            family.add_metric([event], self.counts[event])
        family.add_metric(["lease_lost"], self.counts["lease_lost"])
        family.add_metric(["fenced"], self.counts["fenced"])  # tool calls that waited
        yield family
        yield from self.writer.metric_families()
