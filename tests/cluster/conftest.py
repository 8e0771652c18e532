"""Fixtures of the `cluster` test tier: a real control plane on 127.0.0.1.

- ``kube_control_plane`` (session): etcd + kube-apiserver + kube-controller-manager,
  built on first use by scripts/build-kube.sh; ``.server``, ``.token`` (admin; alias
  ``.admin_token``),
  ``.kubeconfig``, ``.ca_file``. Applies ``crds/*.yaml`` when that directory exists,
  then waits until the garbage collector watches their kinds (``wait_gc_monitors``).
- ``kube_api`` (session): a thin REST client (``kubeenv.KubeClient``) as admin.
- ``namespace`` (function): a fresh namespace per test, deleted afterwards;
  ``make_namespace`` creates more.
- ``node_agent`` (session): the test node agent running labelled pods as loopback
  processes with the real runtime.
- ``start_operator`` / ``operator`` (function): an in-process operator on the test's
  namespace (tests/cluster/operator_env.py).

Tests marked ``cluster`` are SKIPPED (with the reason) when no Go toolchain exists to
build the binaries, or when SANDBOX_SKIP_CLUSTER=1.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from build_scripts import find_go  # tests/support
from kubeenv import ControlPlane, KubeClient, NodeAgent, wait_until
from kubeenv.controlplane import (
    REPO_ROOT,
    GoMissing,
    binaries_present,
    build_binaries,
)
from kubeenv.nodeagent import PodRun, default_runtime_command
from operator_env import (  # noqa: F401 (fixtures of the operator tests)
    operator,
    start_operator,
    store_stack,
)

_state: dict[str, object] = {}


def _skip_reason() -> str | None:
    if os.environ.get("SANDBOX_SKIP_CLUSTER", "") not in ("", "0"):
        return "SANDBOX_SKIP_CLUSTER is set: cluster tier disabled"
    return _state.get("skip")  # type: ignore[return-value]


def _build(config: pytest.Config) -> None:
    """Build (or reuse) the binaries, with the build's progress on the terminal: seconds
    after the run's background prebuild, which the first cluster test waits for outside
    its timeout."""
    if "built" in _state or "skip" in _state or "error" in _state:
        return
    capman = config.pluginmanager.getplugin("capturemanager")
    cm = capman.global_and_fixture_disabled() if capman else contextlib.nullcontext()
    try:
        with cm:
            if not binaries_present():
                if find_go() is None:
                    raise GoMissing(
                        "no `go` on PATH or /usr/local/go/bin/go (set GO=) and no cached "
                        "binaries in .cache/kube/bin"
                    )
                sys.stderr.write(
                    "\n[cluster tier] building etcd, kube-apiserver and "
                    "kube-controller-manager (first run only; cached in .cache/kube)\n"
                )
            build_binaries(stream=sys.stderr if not binaries_present() else None)
        _state["built"] = True
    except GoMissing as exc:
        _state["skip"] = f"cluster tier needs Go to build its binaries: {exc}"
    except Exception as exc:
        _state["error"] = f"building the control plane failed: {exc}"


def pytest_collection_finish(session: pytest.Session) -> None:
    items = [i for i in session.items if i.get_closest_marker("cluster")]
    if not items or session.config.option.collectonly:
        return
    if _skip_reason() is None and not binaries_present() and find_go() is None:
        _state["skip"] = (
            "cluster tier needs Go to build its binaries: no `go` on PATH or "
            "/usr/local/go/bin/go (set GO=) and no cached binaries in .cache/kube/bin"
        )
    # The build itself: the run's background prebuild (tests/support/prebuild.py) while
    # the light tiers run, then the first fixture (seconds: the binaries are cached).
    reason = _skip_reason()
    if reason:
        for item in items:
            item.add_marker(pytest.mark.skip(reason=reason))


GC_PROBE_NAMESPACE = "gc-probe"


def wait_gc_monitors(api: KubeClient, timeout: float = 90.0) -> None:
    """Return once the garbage collector watches the CRDs' kinds.

    kube-controller-manager's garbage collector discovers new kinds only on its periodic
    resync (every 30 s). Before then it cannot see a session being deleted nor the
    workspaces it owns; when it catches up, an ``Orphan`` deletion only orphans the
    dependents already in its graph, and it then deletes the rest as children of an owner
    that no longer exists (seen: a session deleted with ``propagationPolicy: Orphan``
    30 s after the CRDs were applied lost cws-c2, and so c2's files). So: objects of each
    kind owned by a ConfigMap; the ConfigMap deleted; their going proves the collector
    watches the kind (it acts only on objects its informers have seen).
    """
    base = f"/apis/sandboxworkspace.io/v1alpha1/namespaces/{GC_PROBE_NAMESPACE}"
    api.create("/api/v1/namespaces", {"metadata": {"name": GC_PROBE_NAMESPACE}})
    owner = api.create(
        f"/api/v1/namespaces/{GC_PROBE_NAMESPACE}/configmaps", {"metadata": {"name": "owner"}}
    )
    ref = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "owner",
        "uid": owner["metadata"]["uid"],
    }
    probes = {
        "sandboxsessions": ("SandboxSession", {"userId": "gc-probe"}),
        "conversationworkspaces": (
            "ConversationWorkspace",
            {"conversationId": "gc-probe", "sessionRef": "gc-probe"},
        ),
    }
    for plural, (kind, spec) in probes.items():
        body = {
            "apiVersion": "sandboxworkspace.io/v1alpha1",
            "kind": kind,
            "metadata": {"name": "gc-probe", "ownerReferences": [ref]},
            "spec": spec,
        }
        api.create(f"{base}/{plural}", body)
    api.delete(f"/api/v1/namespaces/{GC_PROBE_NAMESPACE}/configmaps/owner")
    for plural in probes:
        api.wait_gone(f"{base}/{plural}/gc-probe", timeout=timeout)
    api.delete(f"/api/v1/namespaces/{GC_PROBE_NAMESPACE}")


@pytest.fixture(scope="session")
def kube_control_plane(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    _build(request.config)
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    if "error" in _state:
        pytest.fail(str(_state["error"]), pytrace=False)
    plane = ControlPlane(tmp_path_factory.mktemp("kube"))
    plane.start()
    _state["plane"] = plane
    try:
        crds = REPO_ROOT / "crds"
        if crds.is_dir() and any(crds.glob("*.yaml")):
            plane.apply_crds(crds)
            with plane.client() as api:
                wait_gc_monitors(api)
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def kube_api(kube_control_plane: ControlPlane) -> Iterator[KubeClient]:
    with kube_control_plane.client() as client:
        yield client


def _ns_name(request: pytest.FixtureRequest) -> str:
    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    return f"t-{base}-{secrets.token_hex(3)}"


@pytest.fixture
def make_namespace(
    request: pytest.FixtureRequest, kube_api: KubeClient
) -> Iterator[Callable[..., str]]:
    created: list[str] = []

    def make(name: str | None = None, labels: dict[str, str] | None = None) -> str:
        name = name or _ns_name(request)
        kube_api.create(
            "/api/v1/namespaces",
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": name, "labels": labels or {}},
            },
        )
        created.append(name)
        # Pods are refused until the service-account controller made "default".
        wait_until(
            lambda: kube_api.get_or_none(f"/api/v1/namespaces/{name}/serviceaccounts/default"),
            timeout=120,  # the service-account controller lags under load
            message=f"service account default in namespace {name}",
        )
        return name

    yield make
    for name in created:
        kube_api.delete(f"/api/v1/namespaces/{name}")


@pytest.fixture
def namespace(make_namespace: Callable[..., str]) -> str:
    return make_namespace()


def _runtime_command() -> Callable[[PodRun], list[str]]:
    if os.environ.get("SANDBOX_TEST_RUNTIME") == "standin":
        script = Path(__file__).resolve().parent / "kubeenv" / "standin_runtime.py"

        def standin(ctx: PodRun) -> list[str]:
            return [
                sys.executable,
                str(script),
                "--host",
                ctx.ip,
                "--port",
                str(ctx.port),
                "--root",
                str(ctx.root),
            ]

        return standin
    return default_runtime_command


@pytest.fixture(scope="session")
def node_agent(
    kube_control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[NodeAgent]:
    agent = NodeAgent(
        kube_control_plane.client,
        tmp_path_factory.mktemp("node"),
        runtime_command=_runtime_command(),
    )
    agent.start()
    _state["agent"] = agent
    try:
        yield agent
    finally:
        agent.stop()
        _state.pop("agent", None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """On a failed cluster test, say where the component and pod logs are."""
    report = yield
    if report.failed and item.get_closest_marker("cluster") and "plane" in _state:
        plane = _state["plane"]
        lines = [f"control-plane logs: {plane.workdir}/*.log"]  # type: ignore[attr-defined]
        agent = _state.get("agent")
        if agent is not None:
            lines.append(f"node agent pod logs: {agent.data_dir}/logs")  # type: ignore[attr-defined]
            lines += [f"node agent error: {e}" for e in agent.errors[-10:]]  # type: ignore[attr-defined]
        report.sections.append(("cluster tier", "\n".join(lines)))
    return report
