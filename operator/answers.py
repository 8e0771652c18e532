"""The operator's own check that a starting sandbox pod's runtime answers.

Why: the kubelet probes readiness every ``periodSeconds`` (2 s), so a runtime that is up
just after a probe waits most of a period before its pod turns Ready — on a quick node
the largest single part of a session's start. While a session's pod is running but not
yet Ready, the operator polls ``GET /healthz`` on the pod's IP itself (every
``POLL_SECONDS``; the chart's NetworkPolicy admits the operator on the runtime's port,
which it uses for ``/v1/stats`` anyway) and reconciles the session at the first answer,
which then reports Running: Running still means "the runtime answers".

Contract:
- ``watch`` starts at most one poll per pod (by uid); it stops at the first 200, after
  ``GIVE_UP_SECONDS`` (the kubelet's probe still makes the pod Ready) or on ``forget``.
- ``observe`` is ``status.observe_pod`` with that evidence: a running pod with an IP
  whose runtime answered counts as ready for ``TRUST_SECONDS`` after the answer. From
  then on, and as soon as the kubelet reports the pod Ready, only the kubelet's readiness
  counts — a runtime that later stops answering its probe is not ready.
- ``forget`` drops a pod's record and poll (its deletion); ``aclose`` stops all polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import httpx

from sandbox_workspace.contract.conditions import Reason

from .settings import RUNTIME_PORT
from .status import PodState, observe_pod

POLL_SECONDS = 0.05
GIVE_UP_SECONDS = 120.0
TRUST_SECONDS = 10.0
# The Ready message while the operator's check stands in for the kubelet's probe.
ANSWERS = "the runtime answers the operator's check (the kubelet's probe follows)"

log = logging.getLogger("sandbox_workspace.operator.answers")


def _uid(pod: dict[str, Any] | None) -> str | None:
    return ((pod or {}).get("metadata") or {}).get("uid")


class RuntimeAnswers:
    """Pods (by uid) whose runtime answered the operator's own /healthz poll."""

    def __init__(
        self,
        poll: float = POLL_SECONDS,
        give_up: float = GIVE_UP_SECONDS,
        trust: float = TRUST_SECONDS,
    ) -> None:
        self.poll, self.give_up, self.trust = poll, give_up, trust
        self._answered: dict[str, float] = {}  # uid → monotonic time of the first answer
        self._polls: dict[str, asyncio.Task] = {}
        # Polled once per pod: after the first answer (or giving up), and once the kubelet
        # said Ready, a pod is never polled again — a later failing probe stays failing.
        self._settled: set[str] = set()

    def answered(self, uid: str | None) -> bool:
        at = self._answered.get(uid or "")
        return at is not None and time.monotonic() - at < self.trust

    def observe(self, pod: dict[str, Any] | None) -> PodState:
        state = observe_pod(pod)
        uid = _uid(pod)
        if state.kind != "starting":
            if uid and state.kind == "ready":  # the kubelet's verdict: from now on, its own
                self._answered.pop(uid, None)
                self._settled.add(uid)
            return state
        if state.ip and self.answered(uid):
            return replace(state, kind="ready", reason=Reason.RUNTIME_READY, message=ANSWERS)
        return state

    def watch(
        self,
        http: httpx.AsyncClient,
        pod: dict[str, Any],
        state: PodState,
        on_answer: Callable[[float], Awaitable[None]],
    ) -> None:
        """Poll the runtime of ``pod`` (observed as ``state``) if it is starting;
        ``on_answer(seconds polled)`` runs at its first answer."""
        uid = _uid(pod)
        if state.kind != "starting" or not state.ip or not uid:
            return
        if uid in self._settled or uid in self._polls:
            return
        url = f"http://{state.ip}:{RUNTIME_PORT}/healthz"
        self._polls[uid] = asyncio.create_task(
            self._poll(http, uid, url, state.name, on_answer), name=f"healthz {state.name}"
        )

    async def _poll(
        self,
        http: httpx.AsyncClient,
        uid: str,
        url: str,
        pod_name: str | None,
        on_answer: Callable[[float], Awaitable[None]],
    ) -> None:
        started = time.monotonic()
        try:
            while time.monotonic() - started < self.give_up:
                with contextlib.suppress(httpx.HTTPError):
                    response = await http.get(url, timeout=min(1.0, self.give_up))
                    if response.status_code == 200:
                        self._answered[uid] = time.monotonic()
                        break
                await asyncio.sleep(self.poll)
            else:
                log.info("runtime did not answer the operator", extra={"pod": pod_name})
                return
        finally:
            # Not when forgotten (the pod is gone): ``forget`` took the task out already.
            if self._polls.pop(uid, None) is not None:
                self._settled.add(uid)
        waited = time.monotonic() - started
        log.info("runtime answers", extra={"pod": pod_name, "polled_seconds": round(waited, 3)})
        try:
            await on_answer(waited)
        except Exception:  # the kubelet's Ready event reconciles the session anyway
            log.exception("reconcile after the runtime's first answer failed")

    def forget(self, uid: str | None) -> None:
        if not uid:
            return
        self._answered.pop(uid, None)
        self._settled.discard(uid)
        task = self._polls.pop(uid, None)
        if task is not None:
            task.cancel()

    async def aclose(self) -> None:
        tasks = list(self._polls.values())
        self._polls.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
