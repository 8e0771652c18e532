"""The SandboxPool's counts (operator/pool/refill.report) against a fake Kubernetes
client: made when missing, written when a count moved, left alone otherwise."""

from __future__ import annotations

from fake_kube import FakeKube
from prometheus_client import CollectorRegistry

from sandbox_workspace.kube import custom_path
from sandbox_workspace.operator.context import OperatorContext
from sandbox_workspace.operator.pool import PoolMetrics, PoolState
from sandbox_workspace.operator.pool.refill import report
from sandbox_workspace.operator.pool.resource import POOL_NAME, POOL_PLURAL
from sandbox_workspace.operator.settings import OperatorSettings

NS = "sessions"
PATH = custom_path(NS, POOL_PLURAL, POOL_NAME)


def context() -> tuple[OperatorContext, FakeKube]:
    kube = FakeKube()
    ctx = OperatorContext(OperatorSettings(_env_file=None), kube=kube)  # type: ignore[arg-type]
    ctx.pool = PoolState((NS,), 3, PoolMetrics(CollectorRegistry()))
    return ctx, kube


def pod(name: str) -> dict:
    return {"metadata": {"name": name}}


async def test_the_pool_resource_is_made_and_follows_the_counts() -> None:
    ctx, kube = context()
    assert ctx.pool is not None
    ctx.pool.note_free(NS, pod("a"), ready=True)
    ctx.pool.note_free(NS, pod("b"), ready=True)
    ctx.pool.note_free(NS, pod("c"), ready=False)  # starting: not ready yet

    first = await report(ctx, NS, None)
    body = await kube.get(PATH)
    assert body is not None and body["kind"] == "SandboxPool" and body["spec"] == {}
    assert body["status"] == {"size": 3, "ready": 2, "claimed": 0}

    writes = len(kube.calls)
    assert await report(ctx, NS, first) == first
    assert len(kube.calls) == writes  # nothing moved: no write

    ctx.pool.note_claimed(NS, "a", live=True)
    second = await report(ctx, NS, first)
    assert (await kube.get(PATH))["status"] == {"size": 3, "ready": 1, "claimed": 1}

    await kube.delete(PATH)  # someone deleted it: a resync makes it again
    await report(ctx, NS, None)
    assert (await kube.get(PATH))["status"] == second.model_dump()
