"""The node itself: Ready, and a bare pod of the product image running as a container."""

from __future__ import annotations

import ipaddress

import httpx
import pytest
from kubeenv.client import wait_until
from nodeenv.network import NODE_NAME, POD_SUBNET, interfaces
from nodeenv.pods import bare_sandbox_pod

pytestmark = pytest.mark.node


def test_node_is_ready_in_a_private_network(node_cluster, kube):
    node = kube.get(f"/api/v1/nodes/{NODE_NAME}")
    ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"]
    assert ready == "True"
    assert not node["spec"].get("taints")
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == "v1.34.4"
    assert info["containerRuntimeVersion"].startswith("containerd://1.")
    # Nothing but the tier's own interfaces: no way out of the namespace.
    assert set(interfaces()) <= {"lo", "node0", "cni0"} | {
        n for n in interfaces() if n.startswith("veth")
    }


def test_a_bare_pod_of_the_image_runs_on_the_pod_network(node_cluster, kube):
    image = node_cluster.images["image"]
    ns = "node-smoke"
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    wait_until(lambda: kube.get_or_none(f"/api/v1/namespaces/{ns}/serviceaccounts/default"))
    # The container as the operator builds it (read-only root, uid 10001, seccomp, probe).
    pod = bare_sandbox_pod("runtime", ns, image)
    kube.create(f"/api/v1/namespaces/{ns}/pods", pod)
    running = kube.wait_for(
        f"/api/v1/namespaces/{ns}/pods/runtime",
        lambda p: p.get("status", {}).get("phase") == "Running" and p["status"].get("podIP"),
        timeout=120,
        message="the bare pod to run",
    )
    ip = running["status"]["podIP"]
    assert ipaddress.ip_address(ip) in ipaddress.ip_network(POD_SUBNET)
    answer = wait_until(
        lambda: httpx.get(f"http://{ip}:8080/healthz", timeout=2, trust_env=False),
        timeout=60,
        message="the runtime to answer on its pod IP",
    )
    assert answer.status_code == 200
    kube.delete(f"/api/v1/namespaces/{ns}")
