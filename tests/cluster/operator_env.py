"""The in-process operator of the cluster tier's operator tests, and their helpers.

``start_operator`` (fixture factory) runs an operator in a thread against the test's
namespace, with short intervals; at teardown the test's sessions and workspaces are
deleted while it still runs (their finalizers need it), then it stops. ``operator`` is
one started with the defaults; ``store_stack`` one in store mode ``s3`` with the API as a
process beside it. The helpers create sessions and workspaces and reach a
session's runtime as the API does (endpoint + token).
"""

from __future__ import annotations

import asyncio
import base64
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubeenv import ControlPlane, KubeClient, NodeAgent, wait_until

from sandbox_workspace.operator.context import OperatorContext
from sandbox_workspace.operator.main import run_async
from sandbox_workspace.operator.naming import runtime_pod_name, runtime_secret_name
from sandbox_workspace.operator.settings import OperatorSettings

API = "/apis/sandboxworkspace.io/v1alpha1"
TIMEOUT = 30.0


def sbs_path(ns: str, name: str = "") -> str:
    return f"{API}/namespaces/{ns}/sandboxsessions" + (f"/{name}" if name else "")


def cws_path(ns: str, name: str = "") -> str:
    return f"{API}/namespaces/{ns}/conversationworkspaces" + (f"/{name}" if name else "")


@dataclass
class RunningOperator:
    settings: OperatorSettings
    ctx: OperatorContext
    thread: threading.Thread
    stop_flag: threading.Event = field(default_factory=threading.Event)
    errors: list[BaseException] = field(default_factory=list)

    def stop(self) -> None:
        self.stop_flag.set()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "the operator did not stop"


@pytest.fixture
def start_operator(
    kube_control_plane: ControlPlane, namespace: str, node_agent: NodeAgent
) -> Iterator[Callable[..., RunningOperator]]:
    running: list[RunningOperator] = []

    def start(**overrides: Any) -> RunningOperator:
        values: dict[str, Any] = dict(
            kubeconfig=kube_control_plane.kubeconfig,
            namespaces=[namespace],
            image="sandbox-workspace:test",
            check_interval_seconds=0.5,
            runtime_timeout_seconds=1.0,
            retry_max_delay_seconds=1.0,
            liveness_endpoint=None,
            metrics_port=None,
        )
        values.update(overrides)
        settings = OperatorSettings(**values)
        ctx = OperatorContext(settings)
        ready = threading.Event()
        op = RunningOperator(settings, ctx, threading.Thread(target=lambda: None))

        def main() -> None:
            try:
                asyncio.run(
                    run_async(settings, context=ctx, stop_flag=op.stop_flag, ready_flag=ready)
                )
            except BaseException as e:  # reported by the test, not lost in the thread
                op.errors.append(e)
                ready.set()

        op.thread = threading.Thread(target=main, name="operator", daemon=True)
        op.thread.start()
        assert ready.wait(TIMEOUT), "the operator did not become ready"
        assert not op.errors, op.errors
        running.append(op)
        return op

    yield start
    try:
        with kube_control_plane.client() as api:
            if running and running[-1].thread.is_alive():
                for path in (cws_path(namespace), sbs_path(namespace)):
                    for item in api.list(path):
                        api.delete(f"{path}/{item['metadata']['name']}")
                for path in (cws_path(namespace), sbs_path(namespace)):
                    wait_until(
                        lambda p=path: not api.list(p),
                        # What the tests give a session's deletion: pod, claim, then
                        # volume go one after the other, and the files' finalizer of a
                        # workspace whose session goes waits for that storage.
                        timeout=2 * TIMEOUT,
                        message=f"{path} to be empty at teardown",
                    )
    finally:
        for op in running:
            op.stop()
    for op in running:
        assert not op.errors, op.errors


@pytest.fixture
def operator(start_operator: Callable[..., RunningOperator]) -> RunningOperator:
    return start_operator()


def make_session(api: KubeClient, ns: str, name: str = "sb-session-alice", **spec: Any) -> dict:
    body = {
        "apiVersion": "sandboxworkspace.io/v1alpha1",
        "kind": "SandboxSession",
        "metadata": {"name": name},
        "spec": {"userId": name.removeprefix("sb-session-"), **spec},
    }
    return api.create(sbs_path(ns), body)


def make_workspace(
    api: KubeClient,
    ns: str,
    cid: str,
    session: str = "sb-session-alice",
    as_the_api: bool = False,
    held_by: str | None = None,
) -> dict:
    """``as_the_api``: with the files' finalizer from the start, as the API makes it.
    ``held_by``: a test's own finalizer too, so a deletion stays visible until released."""
    names = (["sandboxworkspace.io/files"] if as_the_api else []) + ([held_by] if held_by else [])
    finalizers = {"finalizers": names} if names else {}
    body = {
        "apiVersion": "sandboxworkspace.io/v1alpha1",
        "kind": "ConversationWorkspace",
        "metadata": {"name": f"cws-{cid}", **finalizers},
        "spec": {"conversationId": cid, "sessionRef": session, "userId": "alice"},
    }
    return api.create(cws_path(ns), body)


def wait_phase(api: KubeClient, path: str, phase: str, timeout: float = TIMEOUT) -> dict:
    return api.wait_for(
        path,
        lambda o: o.get("status", {}).get("phase") == phase,
        timeout=timeout,
        message=f"{path} to be {phase}",
    )


def stop_when_idle(api: KubeClient, path: str, seconds: int = 2, then: int | None = 3600) -> dict:
    """The session at ``path`` stopped for idleness; answers it Stopped.

    A test's session keeps the default idle timeout (1800 s) while the test works with
    it: made with a timeout of a second or two, it could stop between the phase Running
    being read and the test's first request to it, or go Running → Stopped between two
    polls of a loaded machine. Only here is the timeout cut to ``seconds``; once
    Stopped it is set to ``then`` (None: left), so a resumed session stays Running."""
    api.patch(path, {"spec": {"idleTimeoutSeconds": seconds}})
    stopped = wait_phase(api, path, "Stopped")
    if then is not None:
        api.patch(path, {"spec": {"idleTimeoutSeconds": then}})
    return stopped


def wait_event(api: KubeClient, ns: str, reason: str) -> None:
    """Until an Event with ``reason`` is in ``ns``: kopf posts Events from a queue of its
    own, so one is waited for, never read once."""
    wait_until(
        lambda: any(e["reason"] == reason for e in api.list(f"/api/v1/namespaces/{ns}/events")),
        timeout=TIMEOUT,
        message=f"an Event {reason}",
    )


@dataclass
class Runtime:
    """Direct access to a session's runtime, as the API has it (endpoint + token)."""

    url: str
    token: str

    def request(
        self, method: str, path: str, token: str | None = None, **kw: Any
    ) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token or self.token}"}
        return httpx.request(
            method, self.url + path, headers=headers, timeout=10, trust_env=False, **kw
        )

    def upload(self, cid: str, name: str, data: bytes) -> dict:
        r = self.request(
            "POST", "/v1/uploads", files={"file": (name, data)}, data={"conversation_id": cid}
        )
        assert r.status_code == 201, r.text
        return r.json()


def runtime_of(api: KubeClient, ns: str, session: dict) -> Runtime:
    name = session["metadata"]["name"]
    secret = api.get(f"/api/v1/namespaces/{ns}/secrets/{runtime_secret_name(name)}")
    token = base64.b64decode(secret["data"]["token"]).decode()
    return Runtime(session["status"]["endpoint"], token)


def running_session(api: KubeClient, ns: str, **spec: Any) -> tuple[dict, Runtime]:
    make_session(api, ns, **spec)
    session = wait_phase(api, sbs_path(ns, "sb-session-alice"), "Running")
    return session, runtime_of(api, ns, session)


def conversation_dir(agent: NodeAgent, ns: str, cid: str) -> Path:
    root = agent.data_dir_of(ns, runtime_pod_name("sb-session-alice"))
    assert root is not None
    return root / cid


def stats_count_as_activity(runtime: Runtime) -> bool:
    """Whether the runtime counts ``GET /v1/stats`` as activity (then nothing is idle)."""
    first = runtime.request("GET", "/v1/stats").json()["last_activity_at"]
    return runtime.request("GET", "/v1/stats").json()["last_activity_at"] != first


@pytest.fixture
def store_stack(kube_control_plane, namespace, start_operator, node_agent, seaweedfs, s3_bucket,
                tmp_path):  # fmt: skip
    """The operator (in-process) and the API (a process) in store mode s3 against the
    test's bucket; answers the API's URL."""
    from kubeenv.stack import Stack

    start_operator(store="s3", s3=seaweedfs.settings(s3_bucket))
    stack = Stack(
        kube_control_plane.kubeconfig, namespace, tmp_path, api_env=seaweedfs.env(s3_bucket)
    )
    try:
        yield stack.start_api()
    finally:
        stack.stop_api()
