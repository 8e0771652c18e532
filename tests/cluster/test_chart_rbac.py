"""The Helm chart on a real apiserver: its RBAC is sufficient, and it is minimal.

The chart is rendered (``helm template``, default values) and applied server-side with
strict field validation. The operator and the API then run as subprocesses *as the
chart's own ServiceAccounts*: tokens minted with the TokenRequest API for those
ServiceAccounts, in kubeconfigs of their own, and each process gets exactly the
environment and arguments of its container in the rendered chart (Secrets resolved,
listen addresses moved to 127.0.0.1). A user then goes session → upload → execute →
conversation delete → session delete through the API, and sandbox pods (run by the test
node agent) are admitted under the sessions namespace's `restricted` Pod Security level.

Minimality: SelfSubjectAccessReviews and real requests made with the same tokens show
what each identity must not do (read Secrets outside the sessions namespace, list or
watch Secrets at all, create pods as the API, anything cluster-scoped, ...).
"""

from __future__ import annotations

import base64
import contextlib
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "chart"))

from charttools import Tools, ToolsMissing, build_tools, render
from kubeenv import ApiError, KubeClient, wait_until
from kubeenv.client import delete_sandbox_resources, object_path
from kubeenv.processes import clean_env, start_cli, stop
from ports import free_port

pytestmark = pytest.mark.cluster

RELEASE = "sw"
GROUP_PATH = "/apis/sandboxworkspace.io/v1alpha1"
APPLY_PATCH = "application/apply-patch+yaml"


@pytest.fixture(scope="module")
def chart_tools() -> Tools:
    try:
        return build_tools()  # built after collection by tests/chart/conftest.py
    except ToolsMissing as exc:
        pytest.skip(f"the chart test needs helm, built with Go: {exc}")


def server_side_apply(api: KubeClient, doc: dict[str, Any]) -> None:
    """`kubectl apply --server-side --force-conflicts`, refusing unknown fields."""
    collection, name = object_path(doc)
    api.patch(
        f"{collection}/{name}",
        doc,
        patch_type=APPLY_PATCH,
        fieldManager="helm-chart-test",
        force="true",
        fieldValidation="Strict",
    )


def mint_token(api: KubeClient, namespace: str, service_account: str) -> str:
    """A bound token of the ServiceAccount (TokenRequest API), as a pod would get."""
    answer = api.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 3600},
        },
    )
    return answer["status"]["token"]


def write_kubeconfig(path: Path, server: str, ca_file: str, user: str, token: str, ns: str):
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "c", "cluster": {"server": server, "certificate-authority": ca_file}}
                ],
                "users": [{"name": user, "user": {"token": token}}],
                "contexts": [
                    {"name": "c", "context": {"cluster": "c", "user": user, "namespace": ns}}
                ],
                "current-context": "c",
            }
        )
    )
    path.chmod(0o600)
    return path


@dataclass
class Identity:
    name: str
    token: str
    client: KubeClient

    def can(self, verb: str, resource: str, namespace: str = "", group: str = "", **extra) -> bool:
        """SelfSubjectAccessReview: what `kubectl auth can-i` asks."""
        attrs = {"verb": verb, "resource": resource, "group": group, **extra}
        if namespace:
            attrs["namespace"] = namespace
        review = self.client.create(
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": attrs},
            },
        )
        return bool(review["status"]["allowed"])


@dataclass
class Installed:
    release_ns: str
    sessions_ns: str
    docs: list[dict[str, Any]]
    api_identity: Identity
    operator_identity: Identity
    kubeconfigs: dict[str, Path]

    def container(self, component: str) -> dict[str, Any]:
        for doc in self.docs:
            if doc["kind"] in ("Deployment", "StatefulSet") and doc["metadata"]["name"].endswith(
                f"-{component}"
            ):
                return doc["spec"]["template"]["spec"]["containers"][0]
        raise LookupError(component)

    def secret_value(self, name: str, key: str) -> str:
        for doc in self.docs:
            if doc["kind"] == "Secret" and doc["metadata"]["name"] == name:
                return base64.b64decode(doc["data"][key]).decode()
        raise LookupError(f"Secret {name}")


@pytest.fixture
def installed(
    kube_control_plane, kube_api: KubeClient, namespace: str, chart_tools: Tools, tmp_path: Path
) -> Iterator[Installed]:
    docs = render(
        chart_tools,
        release=RELEASE,
        namespace=namespace,
        include_crds=True,
        set_values={
            # Tests run faster than a cluster's defaults; the settings path is the chart's.
            "operator.settings.CHECK_INTERVAL_SECONDS": "0.5",
            "operator.settings.RETRY_MAX_DELAY_SECONDS": "1",
        },
    )
    sessions_ns = f"{namespace}-sessions"
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    for doc in crds:
        server_side_apply(kube_api, doc)
    for doc in crds:
        kube_api.wait_for(
            f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{doc['metadata']['name']}",
            lambda crd: any(
                c["type"] == "Established" and c["status"] == "True"
                for c in crd.get("status", {}).get("conditions", [])
            ),
            timeout=60,
        )
    order = {"Namespace": 0, "ServiceAccount": 1, "Secret": 1, "Role": 2, "RoleBinding": 3}
    rest = sorted((d for d in docs if d not in crds), key=lambda d: order.get(d["kind"], 9))
    try:
        for doc in rest:
            server_side_apply(kube_api, doc)
        identities, kubeconfigs = {}, {}
        for component in ("api", "operator"):
            sa = f"{RELEASE}-sandbox-workspace-{component}"
            token = mint_token(kube_api, namespace, sa)
            kubeconfigs[component] = write_kubeconfig(
                tmp_path / f"{component}.kubeconfig",
                kube_control_plane.server,
                kube_control_plane.ca_file,
                f"system:serviceaccount:{namespace}:{sa}",
                token,
                namespace,
            )
            client = KubeClient(kube_control_plane.server, token, kube_control_plane.ca_file)
            identities[component] = Identity(component, token, client)
        yield Installed(
            namespace,
            sessions_ns,
            docs,
            identities["api"],
            identities["operator"],
            kubeconfigs,
        )
        for identity in identities.values():
            identity.client.close()
    finally:
        kube_api.delete(f"/api/v1/namespaces/{sessions_ns}")


# ------------------------------------------------------------------ the processes
def _clean_env() -> dict[str, str]:
    """As clean as a container's: no kubeconfig of ours to fall back on either."""
    env = clean_env()
    for name in ("KUBECONFIG", "POD_ID"):
        env.pop(name, None)
    return env


def container_env(chart: Installed, container: dict[str, Any], pod_name: str) -> dict[str, str]:
    """The container's environment as the kubelet would set it."""
    env = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
            continue
        source = item["valueFrom"]
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            env[item["name"]] = chart.secret_value(ref["name"], ref["key"])
        elif source.get("fieldRef", {}).get("fieldPath") == "metadata.name":
            env[item["name"]] = pod_name
        elif (
            source.get("fieldRef", {}).get("fieldPath")
            == "metadata.labels['apps.kubernetes.io/pod-index']"
        ):
            env[item["name"]] = "0"  # the StatefulSet's first replica (peering priority)
        else:
            raise AssertionError(f"unexpected env source in the chart: {item}")
    return env


@dataclass
class Running:
    url: str
    operator_health: str
    operator_metrics: str
    logs: dict[str, Path]


@pytest.fixture
def running(
    installed: Installed, kube_api: KubeClient, node_agent, tmp_path: Path
) -> Iterator[Running]:
    """Operator and API as the chart configures them, under the chart's identities."""
    op = installed.container("operator")
    op_env = container_env(installed, op, f"{RELEASE}-sandbox-workspace-operator-0")
    health, metrics = free_port(), free_port()
    op_env.update(
        SANDBOX_OPERATOR_KUBECONFIG=str(installed.kubeconfigs["operator"]),
        # The chart listens on 0.0.0.0 in its pod; here only loopback is used.
        SANDBOX_OPERATOR_LIVENESS_ENDPOINT=f"http://127.0.0.1:{health}/healthz",
        SANDBOX_OPERATOR_METRICS_HOST="127.0.0.1",
        SANDBOX_OPERATOR_METRICS_PORT=str(metrics),
        SANDBOX_OPERATOR_LOG_FORMAT="text",
    )
    logs = {"operator": tmp_path / "operator.log", "api": tmp_path / "api.log"}
    operator = start_cli(op["args"], {**_clean_env(), **op_env}, logs["operator"])

    api_container = installed.container("api")
    api_env = container_env(installed, api_container, f"{RELEASE}-sandbox-workspace-api-0")
    api_env.update(
        SANDBOX_WORKSPACE_KUBECONFIG=str(installed.kubeconfigs["api"]),
        SANDBOX_WORKSPACE_LOG_FORMAT="text",
    )
    args = list(api_container["args"])
    args[args.index("--host") + 1] = "127.0.0.1"
    args[args.index("--port") + 1] = "0"
    port_file = tmp_path / "api.port"
    api = start_cli(
        [*args, "--port-file", str(port_file)], {**_clean_env(), **api_env}, logs["api"]
    )
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists():
            assert api.poll() is None, logs["api"].read_text()
            assert operator.poll() is None, logs["operator"].read_text()
            assert time.monotonic() < deadline, "the API did not start"
            time.sleep(0.05)
        url = f"http://127.0.0.1:{int(port_file.read_text())}"
        wait_until(lambda: httpx.get(url + "/readyz").status_code == 200, timeout=30)
        yield Running(
            url, f"http://127.0.0.1:{health}/healthz", f"http://127.0.0.1:{metrics}", logs
        )
    finally:
        stop(api)
        # Workspaces left behind have finalizers only the operator releases.
        with contextlib.suppress(Exception):
            delete_sandbox_resources(kube_api, installed.sessions_ns)
        stop(operator)


# -------------------------------------------------------------------------- tests
def test_chart_identities_run_the_whole_flow(
    installed: Installed, running: Running, kube_api: KubeClient
) -> None:
    token = installed.secret_value(f"{RELEASE}-sandbox-workspace-api", "service-token")
    ns = installed.sessions_ns
    base = f"{GROUP_PATH}/namespaces/{ns}"
    headers = {"Authorization": f"Bearer {token}", "X-User-Id": "alice"}
    with httpx.Client(base_url=running.url + "/api/v1", headers=headers, timeout=90) as client:
        # No credentials, no access: the chart's auth mode is `required`.
        assert httpx.get(running.url + "/api/v1/sessions/sb-session-alice").status_code == 401

        created = client.post("/sessions", json={"agent_id": "agent-1"})
        assert created.status_code == 201, created.text
        session = kube_api.get(f"{base}/sandboxsessions/sb-session-alice")
        assert session["spec"]["userId"] == "alice"
        assert session["spec"]["idleTimeoutSeconds"] == 1800  # sessions.idleTimeoutSeconds

        upload = client.post(
            "/sessions/sb-session-alice/files/upload",
            files={"file": ("weather.csv", b"city,temp\nParis,21\nOslo,9\n")},
            data={"conversation_id": "conv1", "subdir": "temparea"},
        )
        assert upload.status_code in (200, 201), upload.text
        listed = client.get("/sessions/sb-session-alice/files", params={"conversation_id": "conv1"})
        assert listed.json()["files"] == ["weather.csv"]

        # The sandbox pod passed `restricted` admission, has no token, runs as 10001.
        status = kube_api.get(f"{base}/sandboxsessions/sb-session-alice")["status"]
        pod = kube_api.get(f"/api/v1/namespaces/{ns}/pods/{status['podName']}")
        assert pod["spec"]["automountServiceAccountToken"] is False
        # Owned by the session: the garbage collector (not our identities) deletes it.
        assert [r["uid"] for r in pod["metadata"]["ownerReferences"]] == [
            kube_api.get(f"{base}/sandboxsessions/sb-session-alice")["metadata"]["uid"]
        ]
        assert pod["spec"]["securityContext"]["runAsUser"] == 10001

        run = client.post(
            "/sessions/sb-session-alice/execute",
            json={
                "conversation_id": "conv1",
                "language": "python",
                "code": "print(open('uploads/temparea/weather.csv').read().count('\\n'))",
            },
        )
        assert run.status_code == 200, run.text
        assert run.json()["stdout"].strip() == "3" and run.json()["exit_code"] == 0

        cws = kube_api.list(f"{base}/conversationworkspaces")
        assert [c["spec"]["conversationId"] for c in cws] == ["conv1"]
        deleted = client.delete("/sessions/sb-session-alice/conversations/conv1")
        assert deleted.status_code in (200, 202), deleted.text
        kube_api.wait_gone(f"{base}/conversationworkspaces/{cws[0]['metadata']['name']}", 60)
        listed = client.get("/sessions/sb-session-alice/files", params={"conversation_id": "conv1"})
        assert listed.json()["files"] == []

        assert client.delete("/sessions/sb-session-alice").status_code in (200, 202, 204)
        kube_api.wait_gone(f"{base}/sandboxsessions/sb-session-alice", timeout=60)

    assert httpx.get(running.operator_health).status_code == 200
    metrics = httpx.get(running.operator_metrics + "/metrics").text
    assert 'sandbox_operator_reconciles_total{kind="SandboxSession",outcome="ok"}' in metrics
    # Neither process was refused anything it tried.
    for name, log in running.logs.items():
        text = log.read_text(errors="replace")
        refused = [
            line
            for line in text.splitlines()
            # 403 as a status, not the milliseconds of a log timestamp ("17:05:38,403").
            if re.search(r"(?<![\d,.])403(?!\d)", line)
            or "Forbidden" in line
            or "forbidden" in line
            or "Not enough permissions" in line
        ]
        assert not refused, f"{name} was refused something:\n" + "\n".join(refused[:20])


def test_api_identity_is_minimal(installed: Installed) -> None:
    api, ns, sessions = installed.api_identity, installed.release_ns, installed.sessions_ns
    # What it needs, and only in the sessions namespace.
    needed = [
        ("get", "secrets", sessions, ""),
        ("create", "sandboxsessions", sessions, "sandboxworkspace.io"),
        ("watch", "sandboxsessions", sessions, "sandboxworkspace.io"),
        ("patch", "sandboxsessions", sessions, "sandboxworkspace.io"),
        ("delete", "conversationworkspaces", sessions, "sandboxworkspace.io"),
        # The conversations being deleted, from a watch (writes to them are refused).
        ("watch", "conversationworkspaces", sessions, "sandboxworkspace.io"),
    ]
    for verb, resource, where, group in needed:
        assert api.can(verb, resource, where, group), f"API cannot {verb} {resource} in {where}"
    refused = [
        ("get", "secrets", ns, ""),  # the chart's own credentials live here
        ("get", "secrets", "default", ""),
        ("get", "secrets", "kube-system", ""),
        ("list", "secrets", sessions, ""),  # token names cannot even be discovered
        ("watch", "secrets", sessions, ""),
        ("create", "secrets", sessions, ""),
        ("create", "pods", sessions, ""),
        ("create", "pods", ns, ""),
        ("delete", "pods", sessions, ""),
        ("create", "pods/exec", sessions, ""),
        ("list", "sandboxsessions", sessions, "sandboxworkspace.io"),
        ("patch", "sandboxsessions/status", sessions, "sandboxworkspace.io"),
        ("patch", "conversationworkspaces", sessions, "sandboxworkspace.io"),  # finalizers
        ("create", "sandboxsessions", ns, "sandboxworkspace.io"),
        ("create", "rolebindings", sessions, "rbac.authorization.k8s.io"),
        ("create", "serviceaccounts/token", ns, ""),
        ("list", "namespaces", "", ""),
        ("get", "nodes", "", ""),
        ("impersonate", "serviceaccounts", sessions, ""),
    ]
    allowed = [r for r in refused if api.can(*r)]
    assert not allowed, f"the API's identity may do too much: {allowed}"

    # Real requests, not only reviews.
    chart_secret = f"/api/v1/namespaces/{ns}/secrets/{RELEASE}-sandbox-workspace-api"
    for method, path, body in [
        ("GET", chart_secret, None),
        ("GET", f"/api/v1/namespaces/{sessions}/secrets", None),
        (
            "POST",
            f"/api/v1/namespaces/{sessions}/pods",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "not-allowed"},
                "spec": {"containers": [{"name": "c", "image": "x"}]},
            },
        ),
    ]:
        with pytest.raises(ApiError) as refusal:
            api.client.request(method, path, body=body)
        assert refusal.value.status == 403, (method, path)


def test_operator_identity_is_minimal(installed: Installed) -> None:
    op, ns, sessions = installed.operator_identity, installed.release_ns, installed.sessions_ns
    needed = [
        ("create", "pods", sessions, ""),
        ("watch", "pods", sessions, ""),
        ("create", "secrets", sessions, ""),
        ("create", "persistentvolumeclaims", sessions, ""),
        # An earlier incarnation's token and a cleanup pod's are deleted; a claim left by
        # `--cascade=orphan` is adopted; retained volumes are looked at (read-only).
        ("delete", "secrets", sessions, ""),
        ("patch", "persistentvolumeclaims", sessions, ""),
        ("list", "persistentvolumes", "", ""),
        ("patch", "conversationworkspaces", sessions, "sandboxworkspace.io"),
        # A workspace whose session is gone or going (its files deleted by the finalizer).
        ("delete", "conversationworkspaces", sessions, "sandboxworkspace.io"),
        ("patch", "sandboxsessions/status", sessions, "sandboxworkspace.io"),
        ("create", "events", sessions, ""),
        # kopf's discovery, read-only and cluster-wide (names of namespaces and CRDs).
        ("watch", "namespaces", "", ""),
        ("watch", "customresourcedefinitions", "", "apiextensions.k8s.io"),
        # The warm pool's claim: one compare-and-swap patch moving a free pod to a session.
        ("patch", "pods", sessions, ""),
        # The pool's SandboxPool: made once, its status (the counts) written.
        ("create", "sandboxpools", sessions, "sandboxworkspace.io"),
        ("patch", "sandboxpools/status", sessions, "sandboxworkspace.io"),
        # Two peered replicas by default: each keeps its record in the KopfPeering object.
        ("patch", "kopfpeerings", sessions, "kopf.dev"),
    ]
    for verb, resource, where, group in needed:
        assert op.can(verb, resource, where, group), f"operator cannot {verb} {resource}"
    refused = [
        ("get", "secrets", ns, ""),
        ("list", "secrets", sessions, ""),
        ("delete", "secrets", ns, ""),
        ("create", "pods", ns, ""),
        ("create", "pods", "default", ""),
        ("create", "pods/exec", sessions, ""),
        ("create", "sandboxsessions", sessions, "sandboxworkspace.io"),
        ("delete", "sandboxpools", sessions, "sandboxworkspace.io"),
        ("patch", "sandboxpools", sessions, "sandboxworkspace.io"),
        ("delete", "persistentvolumeclaims", sessions, ""),
        ("patch", "persistentvolumes", "", ""),
        ("delete", "persistentvolumes", "", ""),
        ("create", "roles", sessions, "rbac.authorization.k8s.io"),
        ("get", "secrets", "", ""),
        ("delete", "namespaces", "", ""),
        ("patch", "customresourcedefinitions", "", "apiextensions.k8s.io"),
        ("list", "nodes", "", ""),
    ]
    allowed = [r for r in refused if op.can(*r)]
    assert not allowed, f"the operator's identity may do too much: {allowed}"
    with pytest.raises(ApiError) as refusal:
        op.client.get(f"/api/v1/namespaces/{ns}/secrets/{RELEASE}-sandbox-workspace-api")
    assert refusal.value.status == 403
