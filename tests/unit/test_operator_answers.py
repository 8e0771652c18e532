"""The operator's own /healthz poll of a starting pod (operator/answers.py), through the
session reconciler against a fake Kubernetes client and a mock runtime transport: a pod
the kubelet reports running but not yet Ready turns the session Running as soon as its
runtime answers, never before; once the kubelet has its say, only its readiness counts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import httpx
import kopf
import pytest
from fake_kube import FakeKube
from kopf._core.engines import posting

from sandbox_workspace.kube import core_path, custom_path
from sandbox_workspace.operator.answers import ANSWERS, RuntimeAnswers
from sandbox_workspace.operator.context import OperatorContext
from sandbox_workspace.operator.handlers.sessions import reconcile_session
from sandbox_workspace.operator.settings import OperatorSettings

NS, NAME = "ns", "sb-session-alice"
SESSION_PATH = custom_path(NS, "sandboxsessions", NAME)
POD = core_path(NS, "pods", NAME)
IP = "10.0.0.7"


@pytest.fixture(autouse=True)
async def events() -> None:
    posting.settings_var.set(kopf.OperatorSettings())
    posting.event_queue_loop_var.set(asyncio.get_running_loop())
    posting.event_queue_var.set(asyncio.Queue())


class Runtime:
    """A pod's runtime as the mock transport shows it: refusing until ``up``."""

    def __init__(self) -> None:
        self.up = False
        self.hits: list[str] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.hits.append(str(request.url))
        if not self.up:
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(200, json={"status": "ok"})


@pytest.fixture
async def world() -> AsyncIterator[tuple[OperatorContext, FakeKube, Runtime]]:
    kube, runtime = FakeKube(), Runtime()
    http = httpx.AsyncClient(transport=httpx.MockTransport(runtime.handle))
    settings = OperatorSettings(_env_file=None)
    ctx = OperatorContext(settings, kube=kube, http=http)  # type: ignore[arg-type]
    ctx.answers = RuntimeAnswers(poll=0.01, give_up=30, trust=30)
    yield ctx, kube, runtime
    await ctx.answers.aclose()
    await http.aclose()


def kubelet_status(kube: FakeKube, *, ready: bool) -> None:
    """What the kubelet reports once the container runs (Ready only after its probe)."""
    kube.objects[POD]["status"] = {
        "phase": "Running",
        "podIP": IP,
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        "containerStatuses": [{"state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}],
    }


async def started_session(ctx: OperatorContext, kube: FakeKube) -> None:
    kube.put(
        SESSION_PATH,
        {
            "apiVersion": "sandboxworkspace.io/v1alpha1",
            "kind": "SandboxSession",
            "metadata": {"generation": 1},
            "spec": {"userId": "alice"},
        },
    )
    await reconcile_session(ctx, NS, NAME)  # creates Secret, claim and pod
    kubelet_status(kube, ready=False)
    await reconcile_session(ctx, NS, NAME)  # the pod event: running, not Ready


def phase(kube: FakeKube) -> str:
    return kube.objects[SESSION_PATH]["status"]["phase"]


async def until(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_session_is_running_as_soon_as_its_runtime_answers(world) -> None:
    ctx, kube, runtime = world
    await started_session(ctx, kube)
    await until(lambda: len(runtime.hits) >= 3)  # polled, refused: still starting
    assert phase(kube) == "Pending"
    assert runtime.hits[0] == f"http://{IP}:8080/healthz"

    runtime.up = True
    await until(lambda: phase(kube) == "Running")  # no kubelet Ready needed
    status = kube.objects[SESSION_PATH]["status"]
    assert status["endpoint"] == f"http://{IP}:8080"
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"], ready["message"]) == ("True", "RuntimeReady", ANSWERS)
    polled = len(runtime.hits)
    await asyncio.sleep(0.1)
    assert len(runtime.hits) == polled  # one answer is enough: the poll stopped
    registry = ctx.metrics.registry
    assert registry.get_sample_value("sandbox_operator_runtime_answer_seconds_count") == 1


async def test_a_runtime_that_never_answers_keeps_the_session_pending(world) -> None:
    ctx, kube, runtime = world
    await started_session(ctx, kube)
    await until(lambda: len(runtime.hits) >= 5)
    await reconcile_session(ctx, NS, NAME)
    assert phase(kube) == "Pending"
    uid = kube.objects[POD]["metadata"]["uid"]
    ctx.answers.forget(uid)  # the pod's deletion stops the poll
    polled = len(runtime.hits)
    await asyncio.sleep(0.1)
    assert len(runtime.hits) == polled


async def test_after_the_kubelets_ready_only_its_readiness_counts(world) -> None:
    ctx, kube, runtime = world
    runtime.up = True
    await started_session(ctx, kube)
    await until(lambda: phase(kube) == "Running")
    kubelet_status(kube, ready=True)
    await reconcile_session(ctx, NS, NAME)
    # The runtime hangs: the kubelet's probe fails; our earlier answer must not mask it,
    # and the pod is not polled again.
    kubelet_status(kube, ready=False)
    polled = len(runtime.hits)
    await reconcile_session(ctx, NS, NAME)
    assert phase(kube) == "Pending"
    await asyncio.sleep(0.1)
    assert len(runtime.hits) == polled


async def test_an_answer_is_trusted_only_until_the_kubelet_should_have_caught_up(world) -> None:
    ctx, kube, runtime = world
    ctx.answers.trust = 0.2
    runtime.up = True
    await started_session(ctx, kube)
    await until(lambda: phase(kube) == "Running")
    await asyncio.sleep(0.25)  # the trust window elapsing is the condition under test
    await reconcile_session(ctx, NS, NAME)  # the kubelet never said Ready
    assert phase(kube) == "Pending"
