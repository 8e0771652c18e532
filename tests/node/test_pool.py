"""The warm pool on a real node (issue 25 item 5): a pooled pod is nobody's until its
claim — no token, no files, no owner — and a claimed one is no weaker than a cold pod:
the hostile catalogue finds no leak inside it, and deleting the session deletes it.

The module turns the pool on for its own tests (``helm upgrade --reuse-values`` with
``sandbox.pool.size``, as docs/operations.md says) and off again afterwards, deleting the
free pods it leaves, so the other node tests see the release as installed. The sessions
here ask for no volume of their own (``storage.persistent: false``): the release's store
mode is `local`, where only such sessions may take a pooled pod (in mode `s3` every
session may; the benchmark runs that mode).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hostile_code import run_hostile_suite
from kubeenv.client import KubeClient, wait_until
from nodeenv.release import API, NAMESPACE, OPERATOR, RELEASE, SESSIONS, Release
from sessions import SBS, UserSession

from sandbox_workspace.contract.crd import API_VERSION, WORKSPACE_PLURAL
from sandbox_workspace.operator import naming
from sandbox_workspace.operator.pool.spec import CLAIM_ENV
from sandbox_workspace.runtime.state import STATE

pytestmark = pytest.mark.node

POOL = "sandboxworkspace.io/pool"
PODS = f"/api/v1/namespaces/{SESSIONS}/pods"
SIZE = 2
API_PODS = "app.kubernetes.io/component=api"
WORKSPACES = f"/apis/{API_VERSION}/namespaces/{SESSIONS}/{WORKSPACE_PLURAL}"


def _ready(pod: dict) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def free_ready(kube: KubeClient) -> list[dict]:
    pods = kube.list(PODS, labelSelector=f"{POOL}=free")
    return [p for p in pods if _ready(p) and not p["metadata"].get("deletionTimestamp")]


def _set_pool_size(release: Release, kube: KubeClient, size: int) -> None:
    """helm upgrade to a pool of ``size``; the operators roll, and so may the API (its pod
    template carries a checksum of the chart's Secret): the release then points at the
    new API pod."""
    done = release.shell(
        f"helm upgrade {RELEASE} charts/sandbox-workspace -n {NAMESPACE} --reuse-values "
        f"--set sandbox.pool.size={size}\n"
        f"kubectl -n {NAMESPACE} rollout status statefulset/{OPERATOR} --timeout=300s\n"
        f"kubectl -n {NAMESPACE} rollout status deployment/{API} --timeout=300s\n",
        timeout=700,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    wait_until(
        lambda: len(kube.list(f"/api/v1/namespaces/{NAMESPACE}/pods", labelSelector=API_PODS)) == 1,
        timeout=120,
        message="one API pod (the old one gone)",
    )
    release.connect(kube)


@pytest.fixture(scope="module")
def pool(release: Release, kube: KubeClient) -> Iterator[None]:
    _set_pool_size(release, kube, SIZE)
    try:
        wait_until(
            lambda: len(free_ready(kube)) >= SIZE, timeout=180, message="a full pool of ready pods"
        )
        yield
    finally:
        _set_pool_size(release, kube, 0)
        # Without a pool no operator looks after its free pods: ours to delete.
        for pod in kube.list(PODS, labelSelector=f"{POOL}=free"):
            kube.delete(f"{PODS}/{pod['metadata']['name']}")


def workspace_dir(node_cluster, pod: dict) -> Path:
    """The pod's /workspace on the node: its emptyDir under the kubelet's directory."""
    uid = pod["metadata"]["uid"]
    return (
        Path(node_cluster.kubelet_dir) / "pods" / uid / "volumes/kubernetes.io~empty-dir/workspace"
    )


def files_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if not p.is_dir())


def user_files(path: Path) -> list[str]:
    """Files of a workspace outside the runtime's own state (``.runtime/``: its layout
    marker, written at every start)."""
    return [f for f in files_under(path) if not f.startswith(f"{STATE}/")]


def test_a_pooled_pod_holds_no_token_owner_or_files_before_its_claim(
    pool, kube: KubeClient, node_cluster
):
    for pod in free_ready(kube):
        meta = pod["metadata"]
        assert "ownerReferences" not in meta
        assert not {"sandboxworkspace.io/session", "sandboxworkspace.io/user"} & set(meta["labels"])
        assert "sandboxworkspace.io/user-id" not in (meta.get("annotations") or {})
        (container,) = pod["spec"]["containers"]
        env = {e["name"] for e in container.get("env", [])}
        assert "SANDBOX_RUNTIME_TOKEN" not in env and CLAIM_ENV in env
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert "emptyDir" in volumes["workspace"]  # no user's volume
        # Up, answering only /healthz: nothing works without a claim.
        url = f"http://{pod['status']['podIP']}:8080"
        assert httpx.get(url + "/healthz", trust_env=False).status_code == 200
        assert httpx.get(url + "/v1/stats", trust_env=False).status_code == 401
        # And nothing was ever written into its workspace.
        directory = workspace_dir(node_cluster, pod)
        assert directory.is_dir(), directory
        assert user_files(directory) == [], files_under(directory)


@pytest.fixture
def pooled_session(pool, release: Release, kube: KubeClient) -> Iterator[UserSession]:
    """A user's session that took a pooled pod (created as its SandboxSession: the API's
    sessions ask for a volume in this release)."""
    user = f"p-{uuid.uuid4().hex[:8]}"
    session = UserSession(release, kube, user)
    wait_until(lambda: len(free_ready(kube)) >= SIZE, timeout=180, message="a full pool")
    session.free_before = {p["metadata"]["name"] for p in free_ready(kube)}  # type: ignore[attr-defined]
    kube.create(
        SBS,
        {
            "apiVersion": "sandboxworkspace.io/v1alpha1",
            "kind": "SandboxSession",
            "metadata": {"name": session.name},
            "spec": {"userId": user, "storage": {"persistent": False}},
        },
    )
    try:
        yield session
    finally:
        session.delete()


def test_hostile_catalogue_inside_a_claimed_pool_pod_and_the_pod_goes_with_its_session(
    pooled_session: UserSession, release: Release, kube: KubeClient, node_cluster
):
    status = pooled_session.wait_phase("Running")["status"]
    assert status["startedFrom"] == "pool"
    name = status["podName"]
    assert name.startswith("sbx-pool-") and name != naming.runtime_pod_name(pooled_session.name)
    pod = kube.get(f"{PODS}/{name}")
    assert pod["metadata"]["labels"][POOL] == "claimed"
    assert name in pooled_session.free_before  # type: ignore[attr-defined]
    pooled_session.execute("print(1)")
    with httpx.Client(
        base_url=release.api_url, headers=pooled_session.api.headers, timeout=240, trust_env=False
    ) as client:
        run_hostile_suite(client, f"/api/v1{pooled_session.url}")
    # The user's files are in this pod's workspace now, and only since its claim.
    pooled_session.upload("c1", "mine.txt", b"only after the claim\n")
    assert any(f.endswith("mine.txt") for f in user_files(workspace_dir(node_cluster, pod)))

    # Deleting the session deletes the pod (it never returns to the pool) and the files.
    uid = pod["metadata"]["uid"]
    r = pooled_session.api.delete(pooled_session.url)
    assert r.status_code in (200, 202, 204), r.text
    kube.wait_gone(f"{SBS}/{pooled_session.name}", timeout=120)
    wait_until(
        lambda: (p := kube.get_or_none(f"{PODS}/{name}")) is None or p["metadata"]["uid"] != uid,
        timeout=120,
        message="the claimed pod deleted with its session",
    )


def test_e2b_sdk_create_run_files_kill_on_a_claimed_pool_pod(
    pooled_session: UserSession, release: Release, kube: KubeClient, node_cluster
):
    """Issue 39 item 4: E2B's official SDK, unchanged, against the API pod of the release
    (backend kubernetes): its sandbox is a conversation of the user's session, whose pod
    came from the pool; kill deletes the conversation under the guarantee."""
    from e2b import Sandbox

    status = pooled_session.wait_phase("Running")["status"]
    assert status["startedFrom"] == "pool"
    name = status["podName"]
    assert name in pooled_session.free_before  # type: ignore[attr-defined]
    pod = kube.get(f"{PODS}/{name}")
    # The release's auth mode is `required`: the platform issues the user an E2B key.
    r = pooled_session.api.post(f"{release.api_url}/e2b/keys")
    assert r.status_code == 201, r.text
    options = {
        "api_key": r.json()["key"],
        "api_url": f"{release.api_url}/e2b",
        "sandbox_url": f"{release.api_url}/e2b/envd",
    }
    sandbox = Sandbox.create(**options)
    cid = f"e2b-{sandbox.sandbox_id}"
    cw = f"{WORKSPACES}/{naming.workspace_name(pooled_session.name, cid)}"
    assert kube.get(cw)["spec"]["conversationId"] == cid
    result = sandbox.commands.run("echo hi")
    assert (result.exit_code, result.stdout) == (0, "hi\n")
    sandbox.files.write("/home/user/from-sdk.txt", "written through the SDK")
    assert sandbox.files.read("from-sdk.txt") == "written through the SDK"
    # In the claimed pool pod's workspace, under the sandbox's conversation.
    directory = workspace_dir(node_cluster, pod)
    mine = [f for f in user_files(directory) if f.startswith(f"{cid}/")]
    assert any(f.endswith("/from-sdk.txt") for f in mine), user_files(directory)
    assert pooled_session.sbs()["status"]["podName"] == name  # no other pod served it

    assert sandbox.kill() is True
    kube.wait_gone(cw, timeout=60)
    assert not (directory / cid).exists(), user_files(directory)
    assert kube.get(f"{PODS}/{name}")["metadata"]["uid"] == pod["metadata"]["uid"]
