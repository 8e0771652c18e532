"""The egress proxy on a real apiserver (issue 40 items 1, 2, 3): ``sandbox-workspace
egress-proxy`` run as the chart runs it, sessions created and their policy changed
through the kubernetes backend, sandbox pods as real Pod objects whose addresses the test
sets (127.0.0.x: the test connects from them, so the proxy sees them as peers).

Nothing leaves the machine: the allowed name is ``localhost``, which the proxy resolves
and then refuses as loopback — a refusal that says the policy let it through, unlike
"not in this session's egress policy" or "no egress policy".
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.server
import json
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from kubeenv import wait_until

from sandbox_workspace.api.backends.base import SessionSpec
from sandbox_workspace.api.backends.kubernetes import KubernetesBackend
from sandbox_workspace.contract import crd
from sandbox_workspace.egress.ca import InterceptCA
from sandbox_workspace.egress.ca_store import ensure_ca_secret
from sandbox_workspace.egress.kube_secrets import LABEL_EGRESS_SECRET
from sandbox_workspace.kube import Kube, load_credentials
from sandbox_workspace.operator import naming
from sandbox_workspace.operator.builders import EGRESS_CA_BUNDLE, build_sandbox_pod
from sandbox_workspace.operator.models import EgressSpec, SandboxSession
from sandbox_workspace.operator.settings import OperatorSettings

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


@contextlib.contextmanager
def egress_proxy(
    kubeconfig: Path, namespace: str, tmp_path: Path, *extra: str, started: list | None = None
):
    """``sandbox-workspace egress-proxy`` as the chart runs it (plus ``extra``); its port.
    ``started`` (a list) receives the process."""
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
            str(kubeconfig),
            *extra,
        ],
        # SIGTERM ignored, as for PID 1 in a container (no handler: the signal does
        # nothing): the proxy must install its own.
        preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN),
    )
    if started is not None:
        started.append(process)
    try:
        wait_until(
            lambda: port_file.exists() and port_file.read_text(), timeout=30, message="proxy port"
        )
        yield int(port_file.read_text())
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()  # SIGTERM ignored (see above): never leave it running
            process.wait(timeout=10)
            raise


def test_the_proxy_ends_on_sigterm_as_pid_1_in_its_container(
    kube_control_plane, namespace, tmp_path: Path
):
    # Without its own handler the kubelet waited out the grace period (30 s) at each
    # rollout of the proxy (the node tier's egress module measured it), then killed it.
    started: list[subprocess.Popen] = []
    with egress_proxy(kube_control_plane.kubeconfig, namespace, tmp_path, started=started):
        started[0].terminate()
        # A deadline for a clean shutdown on a loaded machine; without the handler the
        # proxy ignores SIGTERM and never exits, so no deadline lets that pass.
        assert started[0].wait(timeout=30) == 0


@pytest.fixture
def proxy(kube_control_plane, namespace, tmp_path: Path):
    with egress_proxy(kube_control_plane.kubeconfig, namespace, tmp_path) as port:
        yield port


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


# -- secrets injected on the way out (issue 40 item 3, the cluster wiring) ---------------

BOUND_HOST = "api.test"  # resolved by the proxy's test name table to 127.0.0.1
SANDBOX_ADDRESS = "127.0.0.9"


class _Upstream(http.server.BaseHTTPRequestHandler):
    seen: list[str]

    def do_GET(self) -> None:
        self.seen.append(self.headers.get("Authorization", ""))
        body = b"upstream ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def https_upstream(tmp_path: Path):
    """An HTTPS server for ``BOUND_HOST`` with a certificate of the test's own CA; yields
    (port, its CA file, the Authorization headers it received)."""
    upstream_ca = InterceptCA.generate()
    chain = tmp_path / "upstream.pem"
    chain.write_bytes(upstream_ca.issue_pem(BOUND_HOST))
    ca_file = tmp_path / "upstream-ca.pem"
    ca_file.write_bytes(upstream_ca.cert_pem)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(chain)
    seen: list[str] = []
    handler = type("Handler", (_Upstream,), {"seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], ca_file, seen
    finally:
        server.shutdown()
        server.server_close()


def call_bound_host(proxy_port: int, upstream_port: int, trust: str, header: str) -> str:
    """What code in the sandbox does: CONNECT through the proxy from the pod's address,
    TLS trusting only ``trust`` (the CA certificate the sandbox is given), one request."""
    with socket.create_connection(
        ("127.0.0.1", proxy_port), timeout=10, source_address=(SANDBOX_ADDRESS, 0)
    ) as raw:
        authority = f"{BOUND_HOST}:{upstream_port}"
        raw.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
        answer = raw.recv(4096).decode(errors="replace")
        if not answer.startswith("HTTP/1.1 200"):
            return answer.split("\r\n", 1)[0]
        context = ssl.create_default_context(cadata=trust)
        with context.wrap_socket(raw, server_hostname=BOUND_HOST) as tls:
            tls.sendall(
                f"GET / HTTP/1.1\r\nHost: {BOUND_HOST}\r\nAuthorization: {header}\r\n\r\n".encode()
            )
            data = b""
            while chunk := tls.recv(65536):
                data += chunk
    return data.decode(errors="replace")


def test_bound_kubernetes_secret_reaches_the_host_and_never_the_pod(
    kube_control_plane, kube_api, namespace, tmp_path: Path
):
    """A session binds a platform Secret to an HTTPS host: the proxy (its CA made by the
    chart's hook code, its public part published by the proxy) puts the value into the
    request; the pod the operator builds holds only the placeholder and the CA
    certificate; changes to the Secret apply without restart; a missing Secret or key
    is a refusal the code sees; the sandbox's ServiceAccount cannot read the Secret."""
    value, rotated = "sk-live-" + secrets.token_hex(16), "sk-next-" + secrets.token_hex(16)
    secret_path = f"/api/v1/namespaces/{namespace}/secrets/api-key"
    kube_api.create(
        f"/api/v1/namespaces/{namespace}/secrets",
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "api-key", "labels": {LABEL_EGRESS_SECRET: "true"}},
            "stringData": {"token": value},
        },
    )
    # The CA as the hook Job makes it (kept when present), handed to the proxy as the
    # chart mounts it.
    kube = lambda: Kube(load_credentials(kube_control_plane.kubeconfig))  # noqa: E731

    async def make_ca() -> tuple[bytes, bytes]:
        client = kube()
        try:
            first = await ensure_ca_secret(client, namespace, "egress-ca")
            again = await ensure_ca_secret(client, namespace, "egress-ca")
            return first, again
        finally:
            await client.aclose()

    first, again = asyncio.run(make_ca())
    assert first == again  # a second run (helm upgrade) keeps the CA
    stored = kube_api.get(f"/api/v1/namespaces/{namespace}/secrets/egress-ca")["data"]
    ca_dir = tmp_path / "ca"
    ca_dir.mkdir()
    for key in ("tls.crt", "tls.key"):
        (ca_dir / key).write_bytes(base64.b64decode(stored[key]))

    with https_upstream(tmp_path) as (upstream_port, upstream_ca, seen):
        egress = EgressSpec.model_validate(
            {
                "rules": [{"host": BOUND_HOST, "ports": [upstream_port]}],
                "secrets": [
                    {
                        "name": "api",
                        "host": BOUND_HOST,
                        "secretKeyRef": {"name": "api-key", "key": "token"},
                    }
                ],
            }
        )

        async def create_session() -> None:
            client = kube()
            async with httpx.AsyncClient() as http:
                backend = KubernetesBackend(client, namespace, http, egress=egress)
                try:
                    await backend.create_session(
                        SessionSpec(session_id="sb-session-carol", user_id="carol")
                    )
                    # The API changes rules only: the platform's bindings stay.
                    await backend.set_egress_policy("sb-session-carol", egress.policy())
                finally:
                    await client.aclose()

        asyncio.run(create_session())
        name = naming.session_name("sb-session-carol")
        body = kube_api.get(
            f"/apis/{crd.GROUP}/{crd.VERSION}/namespaces/{namespace}/{crd.SESSION_PLURAL}/{name}"
        )
        assert body["spec"]["egress"]["secrets"][0]["secretKeyRef"]["name"] == "api-key"

        # The pod the operator builds: the placeholder and the CA's public part only.
        settings = OperatorSettings(
            _env_file=None, image="i", egress_proxy="10.96.0.9:3128", egress_ca_configmap="ca"
        )
        pod = build_sandbox_pod(SandboxSession.from_body(body), settings)
        runtime_env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        env = json.loads(runtime_env["SANDBOX_RUNTIME_CODE_ENV"])  # what its code sees
        placeholder = env["SBW_SECRET_API"]
        assert placeholder.startswith("sbw-secret-api-")
        assert env["SSL_CERT_FILE"] == env["NODE_EXTRA_CA_CERTS"] == EGRESS_CA_BUNDLE
        text = json.dumps(pod)
        assert value not in text and base64.b64encode(value.encode()).decode() not in text
        assert "api-key" not in text  # not even the Secret's name: no secretKeyRef
        assert [v.get("configMap", {}).get("name") for v in pod["spec"]["volumes"]][-1] == "ca"
        assert not any("secret" in v for v in pod["spec"]["volumes"])
        assert pod["spec"]["automountServiceAccountToken"] is False
        sandbox_pod(kube_api, namespace, name, SANDBOX_ADDRESS)

        # The sandbox's ServiceAccount (its pods have no token at all) cannot read it.
        review = kube_api.create(
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {
                    "user": f"system:serviceaccount:{namespace}:default",
                    "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"],
                    "resourceAttributes": {
                        "namespace": namespace,
                        "verb": "get",
                        "resource": "secrets",
                        "name": "api-key",
                    },
                },
            },
        )
        assert review["status"]["allowed"] is False, review["status"]

        extra = (
            "--ca-dir", str(ca_dir), "--upstream-ca", str(upstream_ca),
            "--publish-ca", f"{namespace}/egress-ca-public", "--secret-ttl", "0.5",
            "--hosts", json.dumps({BOUND_HOST: ["127.0.0.1"]}), "--permit", "127.0.0.0/8",
        )  # fmt: skip
        with egress_proxy(kube_control_plane.kubeconfig, namespace, tmp_path, *extra) as port:
            published = kube_api.get(f"/api/v1/namespaces/{namespace}/configmaps/egress-ca-public")
            assert published["data"]["ca.crt"].encode() == first
            assert "PRIVATE KEY" not in json.dumps(published)
            trust = published["data"]["ca.crt"]

            def call() -> str:
                return call_bound_host(port, upstream_port, trust, f"Bearer {placeholder}")

            wait_until(lambda: "upstream ok" in call(), timeout=30, message="policy seen")
            assert seen[-1] == f"Bearer {value}"
            # Another placeholder (or text around ours) is sent as written.
            call_bound_host(port, upstream_port, trust, f"Bearer {placeholder}x")
            assert seen[-1] == f"Bearer {placeholder}x"

            # A changed value is used within the TTL (0.5 s here; the chart's 5 s).
            kube_api.patch(secret_path, {"stringData": {"token": rotated}})
            started = time.monotonic()
            wait_until(
                lambda: call() and seen[-1] == f"Bearer {rotated}", timeout=30, message="rotated"
            )
            assert time.monotonic() - started < 5
            # Key absent, then Secret gone (seen within the TTL, as a change is): refused,
            # nothing reaches the host.
            kube_api.patch(secret_path, {"data": {"token": None, "other": "eA=="}})
            wait_until(lambda: "has no key 'token'" in call(), timeout=30, message="no key")
            before = len(seen)
            kube_api.delete(secret_path)
            wait_until(lambda: "not found" in call(), timeout=30, message="no Secret")
            assert call().startswith("HTTP/1.1 502 Egress refused: secret 'api'")
            assert len(seen) == before
