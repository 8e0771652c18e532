"""Tests of the cluster tier itself: the control plane behaves like Kubernetes, and the
node agent runs sandbox pods as real runtime processes on loopback addresses."""

from __future__ import annotations

import base64
import ipaddress
import os
import secrets
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubeenv import ApiError, ControlPlane, KubeClient, NodeAgent, wait_until
from kubeenv.client import ssl_context

pytestmark = pytest.mark.cluster

RUNTIME_LABELS = {"sandboxworkspace.io/component": "runtime"}


def pod_manifest(
    name: str,
    secret: str | None = None,
    restart_policy: str = "Never",
    labels: dict[str, str] | None = RUNTIME_LABELS,
    claim: str | None = None,
    owner: dict[str, Any] | None = None,
) -> dict[str, Any]:
    env: list[dict[str, Any]] = [{"name": "SANDBOX_RUNTIME_ROOT", "value": "/workspace"}]
    if secret:
        env.append(
            {
                "name": "SANDBOX_RUNTIME_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": secret, "key": "token"}},
            }
        )
    volume: dict[str, Any] = {"name": "workspace"}
    if claim:
        volume["persistentVolumeClaim"] = {"claimName": claim}
    else:
        volume["emptyDir"] = {}
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": dict(labels or {})},
        "spec": {
            "restartPolicy": restart_policy,
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "runtime",
                    "image": "sandbox-workspace:test",
                    "ports": [{"name": "http", "containerPort": 8080}],
                    "env": env,
                    "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http"}},
                    "volumeMounts": [{"name": "workspace", "mountPath": "/workspace"}],
                }
            ],
            "volumes": [volume],
        },
    }
    if owner:
        pod["metadata"]["ownerReferences"] = [owner]
    return pod


def make_token_secret(api: KubeClient, ns: str, name: str = "runtime-token") -> str:
    token = secrets.token_urlsafe(24)
    api.create(
        f"/api/v1/namespaces/{ns}/secrets",
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name},
            "type": "Opaque",
            "data": {"token": base64.b64encode(token.encode()).decode()},
        },
    )
    return token


def is_ready(pod: dict[str, Any]) -> bool:
    status = pod.get("status", {})
    return status.get("phase") == "Running" and any(
        c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", [])
    )


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def test_control_plane_serves_on_loopback(kube_control_plane: ControlPlane, kube_api: KubeClient):
    assert kube_control_plane.server.startswith("https://127.0.0.1:")
    version = kube_api.get("/version")
    assert version["gitVersion"].startswith("v1.")
    assert kube_control_plane.kubeconfig.exists()
    # Authentication is enforced: no token, no access beyond public info.
    with httpx.Client(verify=ssl_context(kube_control_plane.ca_file), trust_env=False) as anon:
        assert anon.get(f"{kube_control_plane.server}/api/v1/namespaces").status_code in (401, 403)


def test_crd_schema_rejects_invalid_object(
    kube_control_plane: ControlPlane, kube_api: KubeClient, namespace: str, tmp_path: Path
):
    group = "tier.test.sandboxworkspace.io"
    name = f"widgets{secrets.token_hex(3)}"
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{name}.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": name, "singular": name[:-1], "kind": "Widget" + name[7:]},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "required": ["size"],
                                    "properties": {"size": {"type": "integer", "minimum": 1}},
                                }
                            },
                        }
                    },
                }
            ],
        },
    }
    crd_path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}.{group}"
    # Through the same path the fixture uses for the project's crds/*.yaml.
    (tmp_path / "widget.yaml").write_text(yaml.safe_dump(crd))
    try:
        assert kube_control_plane.apply_crds(tmp_path) == [f"{name}.{group}"]
        kind = crd["spec"]["names"]["kind"]
        collection = f"/apis/{group}/v1/namespaces/{namespace}/{name}"

        def widget(obj_name: str, spec: dict[str, Any]) -> dict[str, Any]:
            return {
                "apiVersion": f"{group}/v1",
                "kind": kind,
                "metadata": {"name": obj_name},
                "spec": spec,
            }

        # The new resource can take a moment to be served after Established.
        created = wait_until(lambda: kube_api.create(collection, widget("good", {"size": 3})))
        assert created["spec"]["size"] == 3
        for bad in ({"size": "big"}, {"size": 0}, {}):
            with pytest.raises(ApiError) as info:
                kube_api.create(collection, widget("bad", bad))
            assert info.value.status == 422, info.value
    finally:
        kube_api.delete(crd_path)


def test_owned_pod_is_garbage_collected(kube_api: KubeClient, namespace: str):
    owner = kube_api.create(
        f"/api/v1/namespaces/{namespace}/configmaps",
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}},
    )
    ref = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "owner",
        "uid": owner["metadata"]["uid"],
    }
    # No runtime label: the node agent leaves it alone (never bound, deleted at once).
    kube_api.create(
        f"/api/v1/namespaces/{namespace}/pods",
        pod_manifest("owned", labels={"app": "gc-test"}, owner=ref),
    )
    kube_api.delete(f"/api/v1/namespaces/{namespace}/configmaps/owner")
    kube_api.wait_gone(f"/api/v1/namespaces/{namespace}/pods/owned", timeout=60)


def test_finalizer_holds_object_until_removed(kube_api: KubeClient, namespace: str):
    path = f"/api/v1/namespaces/{namespace}/configmaps/held"
    kube_api.create(
        f"/api/v1/namespaces/{namespace}/configmaps",
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "held", "finalizers": ["sandboxworkspace.io/test"]},
        },
    )
    kube_api.delete(path)
    held = kube_api.get(path)
    assert held["metadata"]["deletionTimestamp"]
    assert held["metadata"]["finalizers"] == ["sandboxworkspace.io/test"]
    kube_api.patch(path, {"metadata": {"finalizers": None}})
    kube_api.wait_gone(path)


def test_runtime_pod_runs_on_loopback_address(
    kube_api: KubeClient, node_agent: NodeAgent, namespace: str
):
    token = make_token_secret(kube_api, namespace)
    kube_api.create(f"/api/v1/namespaces/{namespace}/pods", pod_manifest("rt", "runtime-token"))
    pod = kube_api.wait_for(
        f"/api/v1/namespaces/{namespace}/pods/rt", is_ready, timeout=60, message="pod rt Ready"
    )
    status = pod["status"]
    assert pod["spec"]["nodeName"] == node_agent.node_name
    ip = ipaddress.ip_address(status["podIP"])
    assert ip.is_loopback and str(ip) != "127.0.0.1"
    assert status["podIPs"] == [{"ip": str(ip)}]
    (container,) = status["containerStatuses"]
    assert container["ready"] and "running" in container["state"]

    base = f"http://{ip}:8080"
    with httpx.Client(base_url=base, timeout=5, trust_env=False) as http:
        health = http.get("/healthz")
        assert health.status_code == 200 and health.json()["status"] == "ok"
        assert http.get("/v1/stats").status_code == 401
        stats = http.get("/v1/stats", headers={"Authorization": f"Bearer {token}"})
        assert stats.status_code == 200, stats.text

    # Graceful deletion: the agent stops the process, then the pod object goes away.
    pid = node_agent.pid(namespace, "rt")
    assert pid is not None
    kube_api.delete(f"/api/v1/namespaces/{namespace}/pods/rt")
    kube_api.wait_gone(f"/api/v1/namespaces/{namespace}/pods/rt", timeout=30)
    wait_until(lambda: not pid_alive(pid), timeout=30, message="runtime process to exit")


def test_killed_runtime_pod_reports_failed(
    kube_api: KubeClient, node_agent: NodeAgent, namespace: str
):
    make_token_secret(kube_api, namespace)
    path = f"/api/v1/namespaces/{namespace}/pods/victim"
    kube_api.create(f"/api/v1/namespaces/{namespace}/pods", pod_manifest("victim", "runtime-token"))
    kube_api.wait_for(path, is_ready, timeout=60, message="pod victim Ready")
    node_agent.kill(namespace, "victim", signal.SIGKILL)
    pod = kube_api.wait_for(
        path, lambda p: p["status"].get("phase") == "Failed", timeout=30, message="phase Failed"
    )
    (container,) = pod["status"]["containerStatuses"]
    assert container["state"]["terminated"]["exitCode"] == 137
    assert not container["ready"]
    assert not any(
        c["type"] == "Ready" and c["status"] == "True" for c in pod["status"]["conditions"]
    )


def test_restart_policy_always_restarts_killed_process(
    kube_api: KubeClient, node_agent: NodeAgent, namespace: str
):
    token = make_token_secret(kube_api, namespace)
    path = f"/api/v1/namespaces/{namespace}/pods/phoenix"
    kube_api.create(
        f"/api/v1/namespaces/{namespace}/pods",
        pod_manifest("phoenix", "runtime-token", restart_policy="Always"),
    )
    pod = kube_api.wait_for(path, is_ready, timeout=60, message="pod phoenix Ready")
    first_pid = node_agent.kill(namespace, "phoenix")
    pod = kube_api.wait_for(
        path,
        lambda p: is_ready(p) and p["status"]["containerStatuses"][0]["restartCount"] == 1,
        timeout=60,
        message="pod phoenix restarted and Ready",
    )
    last = pod["status"]["containerStatuses"][0]["lastState"]["terminated"]
    assert last["exitCode"] == 137
    assert node_agent.pid(namespace, "phoenix") != first_pid
    ip = pod["status"]["podIP"]
    r = httpx.get(
        f"http://{ip}:8080/v1/stats",
        headers={"Authorization": f"Bearer {token}"},
        timeout=5,
        trust_env=False,
    )
    assert r.status_code == 200


def test_claim_data_survives_pod_recreation(
    kube_api: KubeClient, node_agent: NodeAgent, namespace: str
):
    make_token_secret(kube_api, namespace)
    kube_api.create(
        f"/api/v1/namespaces/{namespace}/persistentvolumeclaims",
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "ws"},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    )
    kube_api.wait_for(
        f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/ws",
        lambda c: c.get("status", {}).get("phase") == "Bound",
        timeout=60,
        message="claim ws Bound",
    )
    pods = f"/api/v1/namespaces/{namespace}/pods"
    kube_api.create(pods, pod_manifest("one", "runtime-token", claim="ws"))
    kube_api.wait_for(f"{pods}/one", is_ready, timeout=60, message="pod one Ready")
    root = node_agent.data_dir_of(namespace, "one")
    assert root is not None
    (root / "kept.txt").write_text("still here")
    kube_api.delete(f"{pods}/one")
    kube_api.wait_gone(f"{pods}/one")
    kube_api.create(pods, pod_manifest("two", "runtime-token", claim="ws"))
    kube_api.wait_for(f"{pods}/two", is_ready, timeout=60, message="pod two Ready")
    assert node_agent.data_dir_of(namespace, "two") == root
    assert (root / "kept.txt").read_text() == "still here"
    # Deleting the claim (after its pods) deletes the emulated volume and its data.
    kube_api.delete(f"{pods}/two")
    kube_api.wait_gone(f"{pods}/two")
    kube_api.delete(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/ws")
    wait_until(lambda: not root.exists(), timeout=60, message="claim data to be removed")


def test_missing_secret_keeps_pod_pending(
    kube_api: KubeClient, node_agent: NodeAgent, namespace: str
):
    path = f"/api/v1/namespaces/{namespace}/pods/nosecret"
    kube_api.create(f"/api/v1/namespaces/{namespace}/pods", pod_manifest("nosecret", "absent"))
    pod = kube_api.wait_for(
        path,
        lambda p: (
            p.get("status", {})
            .get("containerStatuses", [{}])[0]
            .get("state", {})
            .get("waiting", {})
            .get("reason")
            == "CreateContainerConfigError"
        ),
        timeout=30,
        message="CreateContainerConfigError",
    )
    assert pod["status"]["phase"] == "Pending"
    make_token_secret(kube_api, namespace, "absent")
    kube_api.wait_for(path, is_ready, timeout=60, message="pod Ready once the secret exists")


def test_agent_restart_keeps_address_and_data(
    kube_api: KubeClient, node_agent: NodeAgent, namespace: str
):
    token = make_token_secret(kube_api, namespace)
    path = f"/api/v1/namespaces/{namespace}/pods/again"
    kube_api.create(f"/api/v1/namespaces/{namespace}/pods", pod_manifest("again", "runtime-token"))
    before = kube_api.wait_for(path, is_ready, timeout=60, message="pod again Ready")
    root = node_agent.data_dir_of(namespace, "again")
    assert root is not None
    (root / "note.txt").write_text("kept across restarts")
    old_pid = node_agent.pid(namespace, "again")
    new_pid = node_agent.restart(namespace, "again")
    assert new_pid != old_pid
    after = kube_api.wait_for(
        path,
        lambda p: is_ready(p) and p["status"]["containerStatuses"][0]["restartCount"] == 1,
        timeout=60,
        message="pod again restarted and Ready",
    )
    assert after["status"]["podIP"] == before["status"]["podIP"]
    assert (root / "note.txt").read_text() == "kept across restarts"
    r = httpx.get(
        f"http://{after['status']['podIP']}:8080/v1/stats",
        headers={"Authorization": f"Bearer {token}"},
        timeout=5,
        trust_env=False,
    )
    assert r.status_code == 200
    wait_until(lambda: not pid_alive(old_pid), timeout=30, message="old process gone")
