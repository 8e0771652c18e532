"""Runs of this process and where they live: ``RunRegistry`` (one ``Run`` is ``run.py``).

Contract:
- ``RunRegistry`` owns runs per process: only the session (tenant and user) that started
  a run can see it — any other, also the same user id in another tenant, answers 404;
  finished runs are dropped after ``retention`` seconds.
  ``cancel_conversation`` cancels every open run of a conversation being deleted: each
  stream ends with ``error`` (code ``conversation_deleted``) and ``done``.
- Where runs live beyond this process is the registry's ``RunStore`` (``runstore/``): the
  in-process store keeps everything in the ``Run`` as is; a replicated store (Redis) gets
  every event, checkpoint and approval through ``Run.sink`` and makes an event visible to
  followers only once it is stored (``durable``), so every replica shows the same log.
  ``find``/``decide``/``cancel`` reach runs held by other replicas through the store.
- An id not of the shape runs are given (``run_`` and 32 hex digits) names no run: 404
  at once, never a store key (``run_x:lease`` addressed another key type: a 500).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time

from sandbox_workspace.contract.errors import NotFoundError

from .run import Run
from .runstore import RunStore
from .runstore.memory import MemoryRunStore

log = logging.getLogger(__name__)

_PRUNE_EVERY = 1.0
RUN_ID = re.compile(r"run_[0-9a-f]{32}")  # chat/run.py's ids


class RunRegistry:
    def __init__(self, retention_seconds: float, store: RunStore | None = None) -> None:
        self.retention = retention_seconds
        self.store = store or MemoryRunStore()
        self._background: set[asyncio.Task] = set()
        self._runs: dict[str, Run] = {}
        self._pruned_at = 0.0

    def add(self, run: Run, spec: dict | None = None) -> Run:
        """Hold a run started here; ``spec`` (JSON data) lets another replica resume it."""
        self._prune()
        self._runs[run.id] = run
        self.store.register(run, spec)
        return run

    async def find(self, run_id: str, session_id: str) -> Run:
        """``get``, or else a run another replica holds (through the store); 404 if none.
        ``session_id``: the caller's (``Caller.session_id``: tenant and user)."""
        if not RUN_ID.fullmatch(run_id):
            raise NotFoundError(f"run '{run_id}' not found")
        try:
            run = self.get(run_id, session_id)
            if run.relay is None:
                return run
        except NotFoundError:
            run = None
        remote = await self.store.lookup(run_id)  # held elsewhere, or moved on from here
        if remote is None or remote.session_id != session_id:
            if run is not None:
                return run
            raise NotFoundError(f"run '{run_id}' not found")
        return remote

    async def conversation_runs(self, session_id: str, conversation_id: str) -> list[Run]:
        """A conversation's runs on every replica: this process's, then the store's others."""
        here = [
            r
            for r in self.all()
            if r.session_id == session_id
            and r.conversation_id == conversation_id
            and r.relay is None  # a run that moved on is listed as the store has it
        ]
        ids = {r.id for r in here}
        there = await self.store.conversation_runs(session_id, conversation_id)
        return here + [r for r in there if r.id not in ids]

    async def decide(self, run: Run, call_id: str, approved: bool, reason: str = "") -> None:
        await self.store.decide(run, call_id, approved, reason)

    async def cancel(
        self, run: Run, code: str = "cancelled", message: str = "the run was cancelled"
    ) -> bool:
        return await self.store.cancel(run, code, message)

    def get(self, run_id: str, session_id: str) -> Run:
        run = self._runs.get(run_id)
        if run is not None and self._expired(run, time.monotonic()):
            del self._runs[run_id]
            run = None
        if run is None or run.session_id != session_id:
            raise NotFoundError(f"run '{run_id}' not found")
        return run

    def _expired(self, run: Run, now: float) -> bool:
        return run.finished_at is not None and now - run.finished_at > self.retention

    def all(self) -> list[Run]:
        return list(self._runs.values())

    def cancel_conversation(self, session_id: str, conversation_id: str) -> int:
        """Cancel every open run of the conversation (it is being deleted); how many."""
        message = f"conversation '{conversation_id}' was deleted; the run was stopped"
        if self.store.replicated:  # and those other replicas run, through the store
            task = asyncio.get_running_loop().create_task(
                self._cancel_elsewhere(session_id, conversation_id, message)
            )
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        return sum(
            run.cancel("conversation_deleted", message)
            for run in list(self._runs.values())
            if run.session_id == session_id and run.conversation_id == conversation_id
        )

    async def _cancel_elsewhere(self, session_id: str, conversation_id: str, message: str) -> None:
        try:
            for run in await self.store.conversation_runs(session_id, conversation_id):
                if not run.finished:  # this replica's own: cancelled already, no-op
                    await self.store.cancel(run, "conversation_deleted", message)
        except Exception:  # the deletion goes on; a run left over ends by its deadline
            log.warning("could not cancel a deleted conversation's runs", exc_info=True)

    def _prune(self) -> None:
        # A walk over every kept run, so at most once a second, not once per new run.
        now = time.monotonic()
        if now - self._pruned_at < _PRUNE_EVERY:
            return
        self._pruned_at = now
        for run_id in [i for i, r in self._runs.items() if self._expired(r, now)]:
            del self._runs[run_id]

    async def aclose(self) -> None:
        """Stop this process's runs — or, with a replicated store, hand them over."""
        await self.store.aclose(self.all())
