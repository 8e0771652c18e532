"""What keeps a burst of claims from the warm pool cheap for the operator: a pooled pod's
watch event waits for this process's claim of it (instead of reconciling the session and
delivering its token a second time), a session's deadline waits for the claims to settle,
and kopf's per-event success lines are not logged."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import kopf
from fake_kube import FakeKube
from prometheus_client import CollectorRegistry

from sandbox_workspace.logs import JsonFormatter
from sandbox_workspace.operator.context import OperatorContext
from sandbox_workspace.operator.handlers.checks import on_deadline
from sandbox_workspace.operator.handlers.sessions import on_runtime_pod_event
from sandbox_workspace.operator.handlers.startup import _quiet_event_handlers
from sandbox_workspace.operator.pool import PoolMetrics, PoolState
from sandbox_workspace.operator.pool.refill import REFILL_SETTLE
from sandbox_workspace.operator.settings import OperatorSettings

NS = "sessions"


class ReadCounting(FakeKube):
    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    async def get(self, path: str) -> dict[str, Any] | None:
        self.reads.append(path)
        return await super().get(path)


def context() -> tuple[OperatorContext, ReadCounting]:
    kube = ReadCounting()
    ctx = OperatorContext(OperatorSettings(_env_file=None), kube=kube)  # type: ignore[arg-type]
    ctx.pool = PoolState((NS,), 3, PoolMetrics(CollectorRegistry()))
    return ctx, kube


async def test_a_claimed_pods_event_waits_for_the_claim_and_then_needs_nothing() -> None:
    ctx, kube = context()
    assert ctx.pool is not None
    pod = {"metadata": {"name": "sbx-pool-1", "uid": "pod-1", "resourceVersion": "7"}}
    event = {"type": "MODIFIED", "object": pod}
    labels = {"sandboxworkspace.io/session": "sb-session-a"}
    ctx.pool.begin_claim("pod-1")  # the swap is sent; its answer (version 7) not back yet
    handled = asyncio.create_task(
        on_runtime_pod_event(event=event, namespace=NS, labels=labels, memo=kopf.Memo(ctx=ctx))
    )
    await asyncio.wait({handled}, timeout=0.2)
    assert not handled.done()  # waits for the claim

    ctx.pods_seen["pod-1"] = "7"  # the swap's answer: this very version
    ctx.pool.end_claim("pod-1")
    await asyncio.wait_for(handled, 5)
    assert kube.reads == []  # no second reconcile of the session


async def test_a_deadline_waits_while_claims_flow() -> None:
    ctx, kube = context()
    assert ctx.pool is not None
    ctx.pool.wake_after_claim()  # a claim just now
    began = time.monotonic()
    await asyncio.wait_for(on_deadline(ctx, (NS, "sb-session-a")), 10)
    assert time.monotonic() - began >= REFILL_SETTLE
    assert kube.reads  # then it looked (the session is gone: nothing more)


def record(msg: str, level: int = logging.INFO, **extra: Any) -> logging.LogRecord:
    return logging.makeLogRecord({"name": "kopf.objects", "msg": msg, "levelno": level, **extra})


def test_event_handlers_success_lines_are_not_logged() -> None:
    assert not _quiet_event_handlers(record("Handler 'on_pod' succeeded.", k8s_skip=True))
    # A change handler's line (posted as k8s events, not skipped), and any failure: kept.
    assert _quiet_event_handlers(record("Handler 'reconcile' succeeded.", k8s_skip=False))
    assert _quiet_event_handlers(record("Handler 'x' failed.", logging.ERROR, k8s_skip=True))


def test_kopfs_settings_object_is_no_field_of_a_log_line() -> None:
    line = json.loads(JsonFormatter().format(record("hi", settings=kopf.OperatorSettings())))
    assert "settings" not in line and line["msg"] == "hi"
