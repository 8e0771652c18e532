"""The operator on the cluster tier: session create → Running, conversation delete → files
gone, and the operator at scale — each beside a same-run baseline.

A real control plane (etcd, kube-apiserver, kube-controller-manager) and the test node
agent come from ``tests/cluster/kubeenv``, used as a library; the operator runs as a
subprocess, ``sandbox-workspace operator`` configured by ``SANDBOX_OPERATOR_*`` as a
deployment would be. Only loopback addresses are contacted.

- create → Running: a SandboxSession is created and watched until ``status.phase`` is
  Running (the operator makes the Secret, PVC and pod; the agent runs the runtime; the
  operator sees the pod Ready). Baseline: a bare Pod with the same readiness probe,
  created and watched until Ready through the same agent — the floor an operator adds to.
- delete → files gone (goal p99 < 2 s): a Ready ConversationWorkspace whose directory
  holds files is deleted and its directory polled on disk until it is gone, then the CR
  (the finalizer released). Baseline: ``rm -rf`` of the same tree on the same disk.
- scale (``operator_scale.py``, on a control plane of its own): CPU at rest, RSS, a
  burst of new sessions and idle stops with N sessions (1,000; 30 with --quick;
  ``--sessions N`` runs only this part).

Extras in the JSON: the first session after the operator starts (a warm-up, not in the
samples) and the control plane's start time; the scale part writes its own
``bench/results/operator.json``. On failure the logs are kept and their place printed.

Skipped, with a line saying why, when the binaries are absent and cannot be built (no
Go), when SANDBOX_SKIP_CLUSTER is set, or in --quick mode when they are not built yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

from .harness import Figure
from .operator_scale import ApiUnderTest, scale

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests" / "cluster"), str(REPO / "tests" / "support")]  # kubeenv

from build_scripts import find_go  # noqa: E402
from kubeenv import ControlPlane, KubeClient, NodeAgent, wait_until  # noqa: E402
from kubeenv.controlplane import (  # noqa: E402
    BIN_DIR,
    base_env,
    binaries_present,
    build_binaries,
    free_port,
    rss_bytes,
    spawn,
    stop_process,
)
from kubeenv.nodeagent import RUNTIME_LABEL  # noqa: E402
from kubeenv.stack import Stack  # noqa: E402

from sandbox_workspace.contract.crd import LABEL_SESSION  # noqa: E402

API = "/apis/sandboxworkspace.io/v1alpha1"
MB = 1024 * 1024


def _skip_reason(quick: bool) -> str | None:
    if os.environ.get("SANDBOX_SKIP_CLUSTER", "") not in ("", "0"):
        return "SANDBOX_SKIP_CLUSTER is set"
    if binaries_present():
        return None
    if find_go() is None:
        return f"no Go toolchain to build etcd/kube-apiserver and no binaries in {BIN_DIR}"
    if quick:
        return (
            f"no control-plane binaries in {BIN_DIR} yet (a cold build takes minutes); "
            "run `bash scripts/build-kube.sh` or the cluster tests, or the full benchmark"
        )
    build_binaries(stream=sys.stderr)
    return None


class Operator:
    """``sandbox-workspace operator`` as a subprocess watching one namespace."""

    def __init__(self, kubeconfig: Path, namespace: str, log: Path):
        script = Path(sys.executable).parent / "sandbox-workspace"
        argv = [str(script)] if script.exists() else [sys.executable, "-m", "sandbox_workspace"]
        self.health = f"http://127.0.0.1:{free_port()}/healthz"
        env = {
            **base_env(),
            # An experiment's settings reach the operator: SANDBOX_OPERATOR_* of the bench's
            # own environment (say SANDBOX_OPERATOR_API_CONCURRENCY=32), under the bench's own.
            **{k: v for k, v in os.environ.items() if k.startswith("SANDBOX_OPERATOR_")},
            "SANDBOX_OPERATOR_KUBECONFIG": str(kubeconfig),
            "SANDBOX_OPERATOR_NAMESPACES": namespace,
            "SANDBOX_OPERATOR_IMAGE": "sandbox-workspace:bench",
            "SANDBOX_OPERATOR_STANDALONE": "true",
            "SANDBOX_OPERATOR_LIVENESS_ENDPOINT": self.health,
            "SANDBOX_OPERATOR_METRICS_PORT": "",
            "SANDBOX_OPERATOR_LOG_FORMAT": "text",
        }
        # cwd: not the repository, whose operator/ would shadow the stdlib's `operator`.
        self.proc = spawn([*argv, "operator"], log, env=env, cwd=log.parent)
        self.log = log
        try:
            wait_until(self._alive, timeout=60, interval=0.05, message="the operator's liveness")
        except BaseException:
            self.stop()
            raise

    def _alive(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"the operator exited: {self.log.read_text()[-2000:]}")
        with contextlib.suppress(httpx.TransportError):
            return httpx.get(self.health, timeout=1, trust_env=False).status_code == 200
        return False

    def rss_mb(self) -> float:
        return rss_bytes(self.proc.pid) / MB

    def stop(self) -> None:
        stop_process(self.proc, grace=10)


def _namespace(api: KubeClient, name: str) -> str:
    api.create(
        "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    )
    wait_until(
        lambda: api.get_or_none(f"/api/v1/namespaces/{name}/serviceaccounts/default"),
        timeout=120,  # the service-account controller lags under load
        message=f"service account default in {name}",
    )
    return name


def _watch_until(
    api: KubeClient, collection: str, obj: dict, done: Callable[[dict], bool], timeout: float = 60
) -> float:
    """perf_counter time at which the watch shows ``obj`` (just created) satisfying ``done``."""
    name, rv = obj["metadata"]["name"], obj["metadata"]["resourceVersion"]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = max(1, int(deadline - time.monotonic()))
        for event in api.watch(
            collection, rv, timeout_seconds=left, fieldSelector=f"metadata.name={name}"
        ):
            if event.get("type") == "ERROR":  # history compacted: read the object itself
                rv = None
                break
            current = event.get("object", {})
            rv = current.get("metadata", {}).get("resourceVersion", rv)
            if event.get("type") in ("ADDED", "MODIFIED") and done(current):
                return time.perf_counter()
    raise TimeoutError(f"{collection}/{name} did not get there in {timeout}s")


def _session_running(obj: dict) -> bool:
    return (obj.get("status") or {}).get("phase") == "Running"


def _pod_ready(obj: dict) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _session(user: str) -> dict:
    return {
        "apiVersion": "sandboxworkspace.io/v1alpha1",
        "kind": "SandboxSession",
        "metadata": {"name": f"sb-session-{user}"},
        "spec": {"userId": user},
    }


def _bare_pod(name: str) -> dict:
    """What the agent needs to run a runtime, with the sandbox pod's readiness probe."""
    key, value = RUNTIME_LABEL.split("=")
    container = {
        "name": "runtime",
        "image": "sandbox-workspace:bench",
        "ports": [{"name": "http", "containerPort": 8080}],
        "env": [
            {"name": "SANDBOX_RUNTIME_TOKEN", "value": secrets.token_urlsafe(32)},
            {"name": "HOME", "value": "/tmp"},
        ],
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 2},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {key: value}},
        "spec": {"restartPolicy": "Never", "containers": [container]},
    }


def _populate(directory: Path) -> int:
    """A conversation's worth of files: uploads, outputs, a nested folder (30 × 16 KiB)."""
    count = 0
    for sub in ("uploads/temparea", "outputs", "outputs/plots"):
        (directory / sub).mkdir(parents=True, exist_ok=True)
        for i in range(10):
            (directory / sub / f"file-{i}.bin").write_bytes(os.urandom(16 * 1024))
            count += 1
    return count


def _gone_after(path: Path, start: float, timeout: float = 30) -> float:
    """Milliseconds from ``start`` until ``path`` no longer exists (polled every 5 ms)."""
    deadline = time.monotonic() + timeout
    while path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} still exists {timeout}s after deletion")
        time.sleep(0.005)
    return (time.perf_counter() - start) * 1000


def _create_to_running(
    api: KubeClient, ns: str, pods_ns: str, n: int, prefix: str
) -> tuple[list, list]:
    sessions, pods = [], []
    for i in range(n):  # alternated, so load drifts hit both sides alike
        start = time.perf_counter()
        obj = api.create(f"{API}/namespaces/{ns}/sandboxsessions", _session(f"{prefix}-{i}"))
        seen = _watch_until(api, f"{API}/namespaces/{ns}/sandboxsessions", obj, _session_running)
        sessions.append((seen - start) * 1000)
        start = time.perf_counter()
        obj = api.create(f"/api/v1/namespaces/{pods_ns}/pods", _bare_pod(f"{prefix}-{i}"))
        seen = _watch_until(api, f"/api/v1/namespaces/{pods_ns}/pods", obj, _pod_ready)
        pods.append((seen - start) * 1000)
    return sessions, pods


def _delete_to_gone(
    api: KubeClient, ns: str, scratch: Path, n: int
) -> tuple[list, list, list, int]:
    collection = f"{API}/namespaces/{ns}/conversationworkspaces"
    for i in range(n):
        spec = {
            "conversationId": f"conv-{i}",
            "sessionRef": "sb-session-bench-0",
            "userId": "bench-0",
        }
        api.create(
            collection,
            {
                "apiVersion": "sandboxworkspace.io/v1alpha1",
                "kind": "ConversationWorkspace",
                "metadata": {"name": f"cws-conv-{i}"},
                "spec": spec,
            },
        )

    def all_ready() -> list[dict] | None:
        items = api.list(collection)
        ok = [w for w in items if (w.get("status") or {}).get("phase") == "Ready"]
        return ok if len(ok) == n else None

    ready = wait_until(all_ready, timeout=120, message=f"{n} conversation workspaces Ready")
    dirs = {w["metadata"]["name"]: Path(w["status"]["path"]) for w in ready}
    files = 0
    for directory in dirs.values():
        files = _populate(directory)
    baseline = []
    for i in range(n):
        tree = scratch / f"rm-{i}"
        _populate(tree)
        start = time.perf_counter()
        shutil.rmtree(tree)
        baseline.append((time.perf_counter() - start) * 1000)
    files_gone, cr_gone = [], []
    for name, directory in dirs.items():
        start = time.perf_counter()
        api.delete(f"{collection}/{name}")
        files_gone.append(_gone_after(directory, start))
        wait_until(
            lambda n=name: api.get_or_none(f"{collection}/{n}") is None,
            timeout=30,
            interval=0.005,
            message=f"{name} to be gone",
        )
        cr_gone.append((time.perf_counter() - start) * 1000)
    return files_gone, cr_gone, baseline, files


@contextlib.contextmanager
def _cluster(workdir: Path) -> Iterator[tuple[ControlPlane, KubeClient]]:
    plane = ControlPlane(workdir / "kube")
    plane.start()
    try:
        plane.apply_crds(REPO / "crds")
        with plane.client() as api:
            # Established is not served: the first lists answer 429 "storage is
            # (re)initializing" for a moment, which would delay the operator's watches.
            for plural in ("sandboxsessions", "conversationworkspaces"):
                wait_until(
                    lambda p=plural: api.get(f"{API}/{p}") is not None,
                    timeout=30,
                    message=f"{plural} to be served",
                )
            yield plane, api
    finally:
        plane.stop()


def _scale(workdir: Path, sessions: int, quick: bool) -> list[Figure]:
    """The scale figures (``operator_scale.py``) on a control plane of their own."""

    def start(ns: str) -> Operator:
        op = Operator(plane.kubeconfig, ns, workdir / "operator-scale.log")
        running.append(op)
        return op

    def start_api(ns: str, session: str) -> ApiUnderTest:
        """The API on ``ns``; a node agent that runs only ``session``'s pod (the others
        stay Pending, as in the rest of the scale figures)."""
        selector = f"{RUNTIME_LABEL},{LABEL_SESSION}={session}"
        agent = NodeAgent(
            plane.client, workdir / "api-node", label_selector=selector, provision_volumes=False
        )
        agents.append(agent.start())
        (workdir / "api").mkdir(exist_ok=True)
        # Its session without a claim: no volume to provision (the agent provisions none).
        api_env = {"SANDBOX_WORKSPACE_SESSION_STORAGE__PERSISTENT": "false"}
        stacks.append(Stack(plane.kubeconfig, ns, workdir / "api", api_env=api_env))
        url = stacks[-1].start_api()
        assert stacks[-1].api is not None
        return ApiUnderTest(url, stacks[-1].api.pid)

    running: list[Operator] = []
    agents: list[NodeAgent] = []
    stacks: list[Stack] = []
    with _cluster(workdir / "scale") as (plane, _):
        try:
            figures, _ = asyncio.run(
                scale(
                    plane,
                    start,
                    lambda op: rss_bytes(op.proc.pid),
                    sessions,
                    quick,
                    start_api,
                    rss_bytes,
                )
            )
        finally:
            for stack in stacks:
                stack.stop_api()
            for op in running:
                op.stop()
            for agent in agents:
                agent.stop()
    return figures


def run(quick: bool, sessions: int | None = None) -> list[Figure]:
    reason = _skip_reason(quick)
    if reason:
        print(f"operator: skipped — {reason}", flush=True)
        return []
    workdir = Path(tempfile.mkdtemp(prefix="sbw-bench-operator-"))
    if sessions:  # `python -m bench operator --sessions N`: the scale figures only
        try:
            figures = _scale(workdir, sessions, quick)
        except BaseException:
            print(f"operator: failed; logs kept in {workdir}", flush=True)
            raise
        shutil.rmtree(workdir, ignore_errors=True)
        return figures
    starts, deletes, scale_sessions = (5, 10, 30) if quick else (30, 100, 1000)
    try:
        with _cluster(workdir) as (plane, api):
            ns, pods_ns = _namespace(api, "bench"), _namespace(api, "bench-pods")
            agent = NodeAgent(plane.client, workdir / "node").start()
            try:
                op = Operator(plane.kubeconfig, ns, workdir / "operator.log")
                try:
                    first = _create_to_running(api, ns, pods_ns, 1, "warm")
                    created, bare = _create_to_running(api, ns, pods_ns, starts, "bench")
                    gone, released, rm, files = _delete_to_gone(api, ns, workdir, deletes)
                finally:
                    op.stop()
            finally:
                agent.stop()
            boot = plane.timings["total"]
        scaled = _scale(workdir, scale_sessions, quick)
    except BaseException:
        print(f"operator: failed; logs kept in {workdir}", flush=True)
        raise
    shutil.rmtree(workdir, ignore_errors=True)
    return [
        Figure.of(
            "session create → Running (test node agent)",
            "ms",
            created,
            "bare Pod create → Ready, same agent",
            bare,
            first_session_ms=round(first[0][0]),
            first_bare_pod_ms=round(first[1][0]),
            control_plane_start_s=round(boot, 1),
        ),
        Figure.of(
            "conversation delete → files gone on disk",
            "ms",
            gone,
            f"rm -rf of the same {files} files",
            rm,
            goal="p99 < 2 s",
        ),
        Figure.of(
            "conversation delete → CR gone (finalizer released)",
            "ms",
            released,
            f"rm -rf of the same {files} files",
            rm,
        ),
        *scaled,
    ]
