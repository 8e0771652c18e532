"""The egress proxy on a real apiserver (issue 40 items 1, 2): ``sandbox-workspace
egress-proxy`` run as the chart runs it, sessions created and their policy changed
through the kubernetes backend, sandbox pods as real Pod objects whose addresses the test
sets (127.0.0.x: the test connects from them, so the proxy sees them as peers).

Nothing leaves the machine: the allowed name is ``localhost``, which the proxy resolves
and then refuses as loopback — a refusal that says the policy let it through, unlike
"not in this session's egress policy" or "no egress policy".
"""

from __future__ import annotations

import asyncio
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from kubeenv import wait_until

from sandbox_workspace.api.backends.base import SessionSpec
from sandbox_workspace.api.backends.kubernetes import KubernetesBackend
from sandbox_workspace.contract import crd
from sandbox_workspace.kube import Kube, load_credentials
from sandbox_workspace.operator import naming
from sandbox_workspace.operator.models import EgressSpec

pytestmark = pytest.mark.cluster

PASSED_POLICY = "inside the forbidden range"  # allowed by the policy, refused as loopback
NOT_IN_POLICY = "is not in this session's egress policy"
NO_POLICY = "has no egress policy"


def ask(proxy_port: int, source: str, host: str) -> str:
    """CONNECT host:443 through the proxy from ``source``; the status line answered."""
    with socket.create_connection(
        ("127.0.0.1", proxy_port), timeout=10, source_address=(source, 0)
    ) as s:
        s.sendall(f"CONNECT {host}:443 HTTP/1.1\r\nHost: {host}:443\r\n\r\n".encode())
        return s.recv(4096).split(b"\r\n", 1)[0].decode()


def sandbox_pod(kube_api, namespace: str, session: str, address: str) -> None:
    name = f"pod-{secrets.token_hex(3)}"
    kube_api.create(
        f"/api/v1/namespaces/{namespace}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "labels": {crd.LABEL_COMPONENT: crd.COMPONENT_RUNTIME, crd.LABEL_SESSION: session},
            },
            # No scheduler picks it: the address is the test's to set.
            "spec": {"schedulerName": "none", "containers": [{"name": "c", "image": "none"}]},
        },
    )
    kube_api.patch(
        f"/api/v1/namespaces/{namespace}/pods/{name}/status",
        {"status": {"podIP": address, "podIPs": [{"ip": address}]}},
    )


@pytest.fixture
def proxy(kube_control_plane, namespace, tmp_path: Path):
    port_file = tmp_path / "port"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sandbox_workspace",
            "egress-proxy",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--port-file",
            str(port_file),
            "--namespace",
            namespace,
            "--interval",
            "0.3",
            "--kubeconfig",
            str(kube_control_plane.kubeconfig),
        ]
    )
    try:
        wait_until(
            lambda: port_file.exists() and port_file.read_text(), timeout=30, message="proxy port"
        )
        yield int(port_file.read_text())
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_proxy_tells_sessions_apart_by_pod_address_and_follows_live_policy_changes(
    kube_control_plane, kube_api, namespace, proxy
):
    async def backend_calls(*calls):
        kube = Kube(load_credentials(kube_control_plane.kubeconfig))
        async with httpx.AsyncClient() as http:
            backend = KubernetesBackend(
                kube,
                namespace,
                http,
                egress=EgressSpec.model_validate({"rules": [{"host": "localhost"}]}),
            )
            try:
                return [await call(backend) for call in calls]
            finally:
                await kube.aclose()

    # Alice's session gets the platform default policy; Bob's is set to none.
    asyncio.run(
        backend_calls(
            lambda b: b.create_session(SessionSpec(session_id="sb-session-alice", user_id="alice")),
            lambda b: b.create_session(SessionSpec(session_id="sb-session-bob", user_id="bob")),
            lambda b: b.set_egress_policy("sb-session-bob", None),
        )
    )
    alice, bob = naming.session_name("sb-session-alice"), naming.session_name("sb-session-bob")
    sandbox_pod(kube_api, namespace, alice, "127.0.0.5")
    sandbox_pod(kube_api, namespace, bob, "127.0.0.6")
    sandbox_pod(kube_api, namespace, bob, "127.0.0.7")
    sandbox_pod(kube_api, namespace, alice, "127.0.0.7")  # an address two pods claim

    wait_until(
        lambda: PASSED_POLICY in ask(proxy, "127.0.0.5", "localhost"),
        timeout=20,
        message="alice's policy",
    )
    assert NOT_IN_POLICY in ask(proxy, "127.0.0.5", "pypi.org")
    assert NO_POLICY in ask(proxy, "127.0.0.6", "localhost")  # bob: none
    assert NO_POLICY in ask(proxy, "127.0.0.7", "localhost")  # ambiguous: nobody's
    assert NO_POLICY in ask(proxy, "127.0.0.8", "localhost")  # no pod: nobody's

    # Bob's policy changed on the live session: the proxy follows, alice's is untouched.
    policy = EgressSpec.model_validate({"rules": [{"host": "*.localhost"}, {"host": "localhost"}]})
    (_, seen) = asyncio.run(
        backend_calls(
            lambda b: b.set_egress_policy("sb-session-bob", policy.policy()),
            lambda b: b.egress_policy("sb-session-bob"),
        )
    )
    assert seen == policy.policy()
    started = time.monotonic()
    wait_until(
        lambda: PASSED_POLICY in ask(proxy, "127.0.0.6", "localhost"),
        timeout=20,
        message="bob's new policy",
    )
    assert time.monotonic() - started < 10
    assert kube_api.get(
        f"/apis/{crd.GROUP}/{crd.VERSION}/namespaces/{namespace}/{crd.SESSION_PLURAL}/{bob}"
    )["spec"]["egress"] == policy.model_dump(by_alias=True)
    assert PASSED_POLICY in ask(proxy, "127.0.0.5", "localhost")
