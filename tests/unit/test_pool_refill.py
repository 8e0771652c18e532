"""The refiller's rounds (operator/pool/refill.refill) against a fake Kubernetes client:
they count the pool from the watch-fed state and list its pods only when asked — the
first round, after a failed or outdated pod, or the periodic resync."""

from __future__ import annotations

import itertools
from typing import Any

import kopf
from fake_kube import FakeKube
from prometheus_client import CollectorRegistry

from sandbox_workspace.kube import core_path
from sandbox_workspace.operator.context import OperatorContext
from sandbox_workspace.operator.pool import PoolMetrics, PoolState
from sandbox_workspace.operator.pool.refill import on_pool_pod_event, refill
from sandbox_workspace.operator.settings import OperatorSettings

NS = "sessions"
PODS = core_path(NS, "pods")


class PoolKube(FakeKube):
    """FakeKube with generated names (pool pods have ``generateName``) and its listings
    counted."""

    def __init__(self) -> None:
        super().__init__()
        self.lists = 0
        self._names = itertools.count(1)

    async def list(self, path: str, label_selector: str | None = None) -> list[dict[str, Any]]:
        self.lists += 1
        return await super().list(path, label_selector)

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        meta = body["metadata"]
        if "generateName" in meta:
            name = f"{meta['generateName']}{next(self._names)}"
            body = {**body, "metadata": {**meta, "name": name}}
        return await super().create(path, body)


def context(size: int = 3, batch: int = 2) -> tuple[OperatorContext, PoolKube]:
    kube = PoolKube()
    settings = OperatorSettings(_env_file=None, pool_size=size, pool_refill_batch=batch)
    ctx = OperatorContext(settings, kube=kube)  # type: ignore[arg-type]
    ctx.pool = PoolState((NS,), size, PoolMetrics(CollectorRegistry()))
    return ctx, kube


def pool_pods(kube: PoolKube) -> list[str]:
    return sorted(p.rsplit("/", 1)[1] for p in kube.objects if p.startswith(f"{PODS}/"))


async def becomes(ctx: OperatorContext, kube: PoolKube, name: str, phase: str) -> None:
    """The pod's watch event once the kubelet reports it ready (or failed)."""
    pod = kube.objects[f"{PODS}/{name}"]
    pod["status"] = {
        "phase": phase,
        "podIP": "10.244.0.9",
        "conditions": [{"type": "Ready", "status": "True" if phase == "Running" else "False"}],
    }
    event = {"type": "MODIFIED", "object": pod}
    await on_pool_pod_event(event=event, namespace=NS, memo=kopf.Memo(ctx=ctx))


async def test_rounds_count_from_the_watch_and_list_only_when_asked() -> None:
    ctx, kube = context(size=3, batch=2)
    assert ctx.pool is not None and ctx.pool.relist  # a new operator's first round lists

    assert await refill(ctx, NS, relist=True) is True  # 3 missing, 2 may start at once
    ctx.pool.relist = False  # as the refill task does once a round began
    assert (kube.lists, len(pool_pods(kube))) == (1, 2)
    assert await refill(ctx, NS, relist=False) is False  # 2 starting: wait for them
    assert (kube.lists, len(pool_pods(kube))) == (1, 2)

    first, second = pool_pods(kube)
    await becomes(ctx, kube, first, "Running")
    assert ctx.pool.wake.is_set() and not ctx.pool.relist
    assert await refill(ctx, NS, relist=False) is False  # one started: the third goes
    await becomes(ctx, kube, second, "Running")
    assert await refill(ctx, NS, relist=False) is False  # full once it is ready
    assert (kube.lists, len(pool_pods(kube))) == (1, 3)  # no listing since the first

    third = pool_pods(kube)[2]
    await becomes(ctx, kube, third, "Running")
    assert ctx.pool.counts(NS) == (3, 0) and not ctx.pool.starting[NS]
    assert await refill(ctx, NS, relist=False) is False
    assert (kube.lists, len(pool_pods(kube))) == (1, 3)  # a full pool: nothing at all


async def test_a_failed_pod_asks_for_a_listing_which_deletes_it() -> None:
    ctx, kube = context(size=1, batch=1)
    assert ctx.pool is not None
    await refill(ctx, NS, relist=True)
    (name,) = pool_pods(kube)
    ctx.pool.relist = False
    await becomes(ctx, kube, name, "Failed")
    assert ctx.pool.relist and ctx.pool.wake.is_set() and not ctx.pool.starting[NS]
    await refill(ctx, NS, relist=True)
    assert kube.lists == 2
    assert ("delete", f"{PODS}/{name}") in kube.calls
