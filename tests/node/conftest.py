"""The `node` test tier: a real node (kubelet + containerd + runc) and the product
installed on it with helm, all inside namespaces the run makes for itself.

In the calling session (outside): tests marked ``node`` are SKIPPED with the reason
where the machine cannot host them (not root, no ``unshare``, no containerd/runc/CNI
plugins/podman, no Go for the binaries, or SANDBOX_SKIP_NODE=1). Otherwise the binaries
(scripts/build-kube.sh, scripts/build-tools.sh) and images (scripts/node/images.sh) are
built in the background while the light tiers run (tests/support/prebuild.py), checked
again (seconds) when the first node test starts, and that test runs all selected node tests in one
inner pytest session inside the namespaces (``nodeenv.netns``), whose reports are
replayed here.

Inside (SANDBOX_NODE_NETNS=1), the fixtures:
- ``node_cluster`` (session): control plane + kube-scheduler + containerd + kubelet,
  the node Ready (``nodeenv.node.NodeCluster``).
- ``kube`` (session): a ``kubeenv.KubeClient`` as admin.
- ``release`` (session, ``nodeenv.release``): the chart installed as docs/operations.md says,
  with ``node_llm`` (the scripted model on the node's address) as its chat model.
- ``session``: a fresh user's session through the API pod (tests/node/sessions.py).
- ``second_node`` (module, only when asked for): a second kubelet + containerd, cordoned
  until a test moves scheduling there (``nodeenv.second_node``).
- ``s3_stack`` (session, only when asked for): store mode ``s3`` — operator and API as
  processes of the namespace on a sessions namespace of their own, the suite's
  ``seaweedfs`` on the namespace's loopback (``nodeenv.store_stack``).

A failed test's report says where the components' logs are and, once per module, what
the cluster looked like (``nodeenv.diagnose``: sessions, pods, events, the operator's and
the API's last log lines) — the one record that outlives the run's pods and directory.
"""

from __future__ import annotations

import contextlib
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))

from kubeenv import KubeClient
from nodeenv import netns, network
from nodeenv.diagnose import cluster_state
from nodeenv.network import NODE_IP
from nodeenv.node import NodeCluster
from nodeenv.prepare import PrepareFailed, prepare, skip_reason
from nodeenv.release import Release
from nodeenv.second_node import SecondNode
from nodeenv.standup import install_release
from nodeenv.store_stack import StoreStack, store_stack
from scripted_llm import ScriptedLLM
from sessions import UserSession

# The whole inner session (cold image import and chart install included) must fit.
INNER_TIMEOUT = 1500.0
_state: dict[str, object] = {}


def pytest_configure(config: pytest.Config) -> None:
    reports = os.environ.get(netns.REPORTS_ENV)
    if network.inside() and reports:
        config.pluginmanager.register(netns.ReportWriter(config, Path(reports)), "node-reports")


def pytest_collection_finish(session: pytest.Session) -> None:
    items = [i for i in session.items if i.get_closest_marker("node")]
    if not items or session.config.option.collectonly or network.inside():
        return
    reason = skip_reason()
    if reason:
        for item in items:
            item.add_marker(pytest.mark.skip(reason=reason))
        return
    for item in items:
        # The first of them runs the whole inner session.
        item.add_marker(pytest.mark.timeout(INNER_TIMEOUT + 60))
    _state["items"] = {i.nodeid for i in items}
    _state["nodeids"] = [i.nodeid for i in items]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    if network.inside() or item.nodeid not in _state.get("items", ()):  # type: ignore[operator]
        return None
    inner = _state.get("inner")
    if inner is None:
        # The builds: seconds by now — the run's background prebuild (tests/support/
        # prebuild.py) made them while the light tiers ran, and was waited for outside
        # this test's timer; here the scripts only check their caches.
        capman = item.config.pluginmanager.getplugin("capturemanager")
        cm = capman.global_and_fixture_disabled() if capman else contextlib.nullcontext()
        with cm:
            try:
                # The egress module's enforcer builds beside the tier; only it waits.
                nodeids: list[str] = _state["nodeids"]  # type: ignore[assignment]
                egress = any("test_egress_enforced.py" in n for n in nodeids)
                _state["env"] = prepare(sys.stderr, enforcer=egress)
            except PrepareFailed as exc:
                _state["error"] = str(exc)
        workdir = Path(item.config._tmp_path_factory.mktemp("node-tier"))  # type: ignore[attr-defined]
        inner = netns.InnerSession(
            item.config,
            _state["nodeids"],  # type: ignore[arg-type]
            workdir,
            INNER_TIMEOUT,
            _state.get("env", {}),  # type: ignore[arg-type]
        )
        if "error" in _state:
            inner.failure = str(_state["error"])
        else:
            reporter = item.config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None:
                reporter.write_line(
                    f"[node tier] {len(inner.nodeids)} tests in a private namespace; "
                    f"log: {inner.log}"
                )
            inner.run()
        _state["inner"] = inner
    inner.replay(item)  # type: ignore[union-attr]
    return True


@pytest.fixture(scope="session")
def node_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeCluster]:
    if not network.inside():
        pytest.fail("node fixtures run only inside the tier's namespace (nodeenv.netns)")
    cluster = NodeCluster(tmp_path_factory.mktemp("node"))
    _state["cluster"] = cluster
    cluster.start(stream=sys.stderr)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def kube(node_cluster: NodeCluster) -> Iterator[KubeClient]:
    with node_cluster.client() as client:
        yield client


@pytest.fixture(scope="session")
def node_llm() -> Iterator[ScriptedLLM]:
    """The scripted model, on the node's address: the API pod reaches it there."""
    server = ScriptedLLM().start(host=NODE_IP)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def release_result(
    node_cluster: NodeCluster, kube: KubeClient, node_llm: ScriptedLLM, tmp_path_factory
) -> tuple[Release, object]:
    """The chart installed by docs/operations.md's install block (once per session)."""
    # The install `make cluster` makes too (nodeenv.standup), with the test's model.
    return install_release(
        node_cluster,
        tmp_path_factory.mktemp("release"),
        {
            "chat.baseUrl": node_llm.url,
            "chat.model": "scripted",
            # Idle checks every second instead of 30 s: the idle-stop test waits on it.
            "operator.settings.CHECK_INTERVAL_SECONDS": "1",
        },
    )


@pytest.fixture(scope="session")
def release(release_result, kube: KubeClient) -> Release:
    release, result = release_result
    if result.returncode != 0:
        pytest.fail(
            f"helm install as docs/operations.md says failed:\n{result.stdout}\n{result.stderr}"
        )
    return release.connect(kube)


@pytest.fixture(scope="module")
def second_node(node_cluster: NodeCluster) -> Iterator[SecondNode]:
    node = SecondNode(node_cluster).start(stream=sys.stderr)
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture(scope="session")
def s3_stack(node_cluster: NodeCluster, kube: KubeClient, seaweedfs, tmp_path_factory):
    """Operator and API in store mode s3 against a real SeaweedFS (see nodeenv.store_stack)."""
    with store_stack(node_cluster, kube, seaweedfs, tmp_path_factory.mktemp("s3-stack")) as s:
        yield s


@pytest.fixture
def s3_session(s3_stack: StoreStack, kube: KubeClient) -> Iterator[UserSession]:
    """A fresh user's session of the s3-mode stack (created through its API), deleted after."""
    s = UserSession(s3_stack, kube, f"s3-{uuid.uuid4().hex[:8]}", s3_stack.namespace)
    r = s.api.post("/sessions", json={})
    assert r.status_code in (200, 201, 202), r.text
    yield s
    s.delete()


@pytest.fixture
def session(release: Release, kube: KubeClient) -> Iterator[UserSession]:
    """A fresh user's session (created through the API), deleted afterwards."""
    s = UserSession(release, kube, f"u-{uuid.uuid4().hex[:8]}")
    r = s.api.post("/sessions", json={})
    assert r.status_code in (200, 201, 202), r.text
    yield s
    s.delete()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """On a failed node test, say where the component logs are and what the cluster looks
    like (``nodeenv.diagnose``: once per module — a module fixture's failure fails each of
    its tests)."""
    report = yield
    cluster = _state.get("cluster")
    if report.failed and isinstance(cluster, NodeCluster):
        report.sections.append(
            (
                "node tier",
                f"component logs: {cluster.workdir}/*.log and {cluster.workdir}/kube/*.log",
            )  # type: ignore[attr-defined]
        )
        diagnosed: set[str] = _state.setdefault("diagnosed", set())  # type: ignore[assignment]
        if item.nodeid.split("::")[0] not in diagnosed:
            diagnosed.add(item.nodeid.split("::")[0])
            with cluster.client(timeout=5) as kube:
                report.sections.append(("cluster state", cluster_state(kube)))
    return report
