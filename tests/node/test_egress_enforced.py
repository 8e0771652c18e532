"""The chart's sandbox NetworkPolicy really enforced on a real node (issue 40 item 4).

A session with an egress policy runs its code with the network allowed (runtime
``network=allow``: no Landlock connect rule, no socket filter): its one way out is meant
to be the egress proxy, and the only thing that keeps it there in a cluster is the
sandbox NetworkPolicy. The tier's bridge CNI enforces no NetworkPolicy, so this module
starts a real enforcer in the tier's namespace — kube-router's firewall (iptables +
ipset, scripts/build-enforcer.sh) — against the tier's apiserver.

The test first shows that code of such a session *does* reach the test's servers with
no enforcer (without that the checks would prove nothing), then that it reaches none of
them once kube-router programmed the chart's policy, while the API still reaches the
runtime (the policy's one allowed ingress). The targets are servers this module starts
on the node's address, which exists only inside the tier's namespace.

After the module kube-router is stopped and its rules removed (``--cleanup-config``), so
the tier's other tests see the network as before.
"""

from __future__ import annotations

import json
import socketserver
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubeenv.client import wait_until
from kubeenv.controlplane import BIN_DIR, spawn, stop_process
from nodeenv.network import NODE_IP, NODE_NAME, SERVICE_IP
from nodeenv.release import NAMESPACE

pytestmark = pytest.mark.node

KUBE_ROUTER = BIN_DIR / "kube-router"
PROXY_PORT = 3128  # the chart's egressProxy.port

# Executed in the sandbox: one probe, printed as JSON. tcp: "open" (connected),
# "refused" or "timeout"; udp: the echoed reply or "timeout"; else "error <errno>".
PROBE = r"""
import json, socket
kind, host, port = %r, %r, %d
family = socket.AF_INET6 if ":" in host else socket.AF_INET
if kind == "tcp":
    s = socket.socket(family, socket.SOCK_STREAM); s.settimeout(1.5)
    try:
        s.connect((host, port)); out = "open"
    except ConnectionRefusedError:
        out = "refused"
    except OSError as e:
        out = "timeout" if isinstance(e, TimeoutError) else f"error {e.errno}"
else:
    s = socket.socket(family, socket.SOCK_DGRAM); s.settimeout(1.5)
    try:
        s.sendto(b"ping", (host, port)); out = s.recvfrom(64)[0].decode()
    except OSError as e:
        out = "timeout" if isinstance(e, TimeoutError) else f"error {e.errno}"
print(json.dumps(out))
"""


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        data, sock = self.request
        sock.sendto(b"pong:" + data, self.client_address)


class _Ok(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok")


class Targets:
    """A TCP server (any port) and a UDP echo on port 53 — DNS to an address that is not
    the cluster's (the tier runs no cluster DNS) — both on the node's address."""

    def __init__(self) -> None:
        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self.tcp = socketserver.ThreadingTCPServer((NODE_IP, 0), _Ok)
        self.udp = socketserver.ThreadingUDPServer((NODE_IP, 53), _Echo)
        self.tcp_port = self.tcp.server_address[1]
        for server in (self.tcp, self.udp):
            threading.Thread(target=server.serve_forever, daemon=True).start()

    def close(self) -> None:
        for server in (self.tcp, self.udp):
            server.shutdown()
            server.server_close()


@pytest.fixture(scope="module")
def targets() -> Iterator[Targets]:
    t = Targets()
    try:
        yield t
    finally:
        t.close()


class Enforcer:
    """kube-router's firewall for the tier's node, started on demand, its rules removed
    at the end."""

    def __init__(self, kubeconfig: Path, workdir: Path) -> None:
        self.kubeconfig, self.workdir = kubeconfig, workdir
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        if self.proc is not None:
            return  # one enforcer for the module: the first test that needs it starts it
        self.proc = spawn(
            [
                str(KUBE_ROUTER),
                f"--kubeconfig={self.kubeconfig}",
                f"--hostname-override={NODE_NAME}",
                "--run-firewall=true",
                "--run-router=false",
                "--run-service-proxy=false",
                "--health-port=0",
                "--metrics-port=0",
                "--iptables-sync-period=5s",
                "-v=1",
            ],
            self.workdir / "kube-router.log",
        )

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
        # Its chains and sets outlive it; the rest of the tier runs without an enforcer.
        subprocess.run(
            [str(KUBE_ROUTER), "--cleanup-config"],
            capture_output=True,
            timeout=60,
            check=False,
        )


@pytest.fixture(scope="module")
def enforcer(node_cluster, tmp_path_factory) -> Iterator[Enforcer]:
    if not KUBE_ROUTER.exists():
        pytest.fail(f"no {KUBE_ROUTER}: scripts/build-enforcer.sh builds it")
    e = Enforcer(node_cluster.kubeconfig, tmp_path_factory.mktemp("enforcer"))
    try:
        yield e
    finally:
        e.stop()


def probe(session, kind: str, host: str, port: int) -> str:
    out = session.execute(PROBE % (kind, host, port))
    assert out["exit_code"] == 0, out
    return json.loads(out["stdout"])


def with_egress_policy(session, kube, rules: list[dict] | None = None) -> None:
    """Give the session an egress policy, then a pod made for it: the operator rolls a
    ready pod only later, so the test deletes it and waits for the new one."""
    assert session.execute("print(1)")["exit_code"] == 0  # the session's first pod runs
    r = session.api.put(f"{session.url}/egress", json={"rules": rules or [{"host": "pypi.test"}]})
    assert r.status_code == 200, r.text
    old = session.pod()
    assert old is not None
    kube.delete(f"/api/v1/namespaces/{session.namespace}/pods/{old['metadata']['name']}")

    def new_pod_running() -> bool:
        pod = session.pod()
        return bool(
            pod
            and pod["metadata"]["uid"] != old["metadata"]["uid"]
            and pod["status"].get("phase") == "Running"
        )

    wait_until(new_pod_running, timeout=90, interval=0.5, message="the session's new pod")
    env = {e["name"]: e.get("value") for e in session.pod()["spec"]["containers"][0]["env"]}
    assert env["SANDBOX_RUNTIME_NETWORK"] == "allow", env


def test_sandbox_with_egress_policy_reaches_nothing_once_the_policy_is_enforced(
    session, kube, enforcer, targets
):
    with_egress_policy(session, kube)
    # No enforcer: executed code reaches the test's servers over the bridge — what any
    # cluster whose CNI ignores NetworkPolicy gives a session with an egress policy.
    assert probe(session, "tcp", NODE_IP, targets.tcp_port) == "open"
    assert probe(session, "udp", NODE_IP, 53) == "pong:ping"

    enforcer.start()
    wait_until(
        lambda: probe(session, "tcp", NODE_IP, targets.tcp_port) != "open",
        timeout=60,  # kube-router's first sync: a few seconds on a loaded machine
        interval=0.5,
        message="kube-router to enforce the chart's NetworkPolicy",
    )
    # A raw IP outside the policy (the test's server), UDP and DNS to an address that is
    # not the cluster's (the tier has no cluster DNS), the apiserver's Service address and
    # the API pod: none is reached.
    assert probe(session, "tcp", NODE_IP, targets.tcp_port) in ("timeout", "refused")
    assert probe(session, "udp", NODE_IP, 53) == "timeout"
    assert probe(session, "tcp", SERVICE_IP, 443) != "open"
    api_ip = release_api_ip(session)
    assert probe(session, "tcp", api_ip, 8000) != "open"
    # IPv6: the tier's CNI gives pods IPv4 only, so there is no IPv6 way out to test; a
    # connection fails before any policy is involved.
    assert probe(session, "tcp", "fd00::1", 80).startswith("error")
    # The policy's one ingress still works: the API reaches the runtime through it.
    assert session.execute("print(2)")["stdout"].strip() == "2"
    assert enforcer.proc is not None and enforcer.proc.poll() is None, "kube-router died"


def release_api_ip(session) -> str:
    return session.api.base_url.host


# Executed in the sandbox: CONNECT through the proxy at its pod address; the status line.
CONNECT = r"""
import socket
s = socket.create_connection((%r, %d), timeout=10)
s.sendall(b"CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n")
data = b""
while b"\r\n\r\n" not in data and len(data) < 4096:
    chunk = s.recv(4096)
    if not chunk:
        break
    data += chunk
print(data.split(b"\r\n", 1)[0].decode())
"""


@pytest.fixture(scope="module")
def egress_proxy(release, kube) -> Iterator[str]:
    """The chart's egress proxy turned on (helm upgrade) for this module, rolled back after
    it so the tier's other tests see the release they installed; its pod address (the
    tier has no kube-proxy, so Service addresses lead nowhere: the test names the pod)."""
    up = release.shell(
        "helm upgrade sw charts/sandbox-workspace -n sandbox-workspace --reuse-values "
        "--set egressProxy.enabled=true --wait --timeout 180s",
        timeout=240,
    )
    assert up.returncode == 0, up.stdout + up.stderr
    reconnect(release, kube)

    def proxy_ip() -> str | None:
        pods = kube.list(
            f"/api/v1/namespaces/{NAMESPACE}/pods",
            labelSelector="app.kubernetes.io/component=egress-proxy",
        )
        ready = [p for p in pods if p["status"].get("phase") == "Running"]
        return ready[0]["status"].get("podIP") if ready else None

    try:
        yield wait_until(proxy_ip, timeout=90, interval=0.5, message="the egress proxy pod")
    finally:
        back = release.shell(
            "helm rollback sw 1 -n sandbox-workspace --wait --timeout 180s", timeout=240
        )
        assert back.returncode == 0, back.stdout + back.stderr
        reconnect(release, kube)


def reconnect(release, kube) -> None:
    """An upgrade may roll the API pod (a new address): wait until one API pod is left,
    then point the shared release handle at it (the tier's later tests use it)."""

    def one_api_pod() -> bool:
        pods = kube.list(
            f"/api/v1/namespaces/{NAMESPACE}/pods",
            labelSelector="app.kubernetes.io/component=api",
        )
        return len(pods) == 1 and not pods[0]["metadata"].get("deletionTimestamp")

    wait_until(one_api_pod, timeout=120, interval=0.5, message="one API pod after helm")
    release.connect(kube)


def connect(session, proxy_ip: str, target: str) -> str:
    out = session.execute(CONNECT % (proxy_ip, PROXY_PORT, target, target))
    assert out["exit_code"] == 0, out
    return out["stdout"].strip()


def test_sandbox_reaches_only_the_proxy_and_the_proxy_refuses_what_the_policy_does_not_allow(
    session, kube, enforcer, targets, egress_proxy
):
    """With the enforcer on, the proxy is the one way out, and it refuses a raw IP and a
    name that resolves to a forbidden address (``localhost``: the tier has no DNS, so
    loopback stands for every rebinding target; the metadata, pod, service and store
    ranges are refused the same way, shown on loopback in tests/egress/test_proxy.py and
    tests/unit/test_egress_policy.py)."""
    enforcer.start()
    with_egress_policy(session, kube, [{"host": "localhost", "ports": [443, 8000]}])
    wait_until(
        lambda: probe(session, "tcp", egress_proxy, PROXY_PORT) == "open",
        timeout=60,  # the enforcer's next sync adds the new pod to its sets
        interval=0.5,
        message="the sandbox to reach the egress proxy",
    )
    assert probe(session, "tcp", NODE_IP, targets.tcp_port) != "open"
    # (The proxy pod's other ports are not probed: kube-router rejects with an ICMP
    # port-unreachable, which reads the same as a closed port, and the proxy listens on
    # no other port — no admin or metrics listener.)
    raw = wait_until(
        # The proxy reads the sessions and their pods every egressProxy.pollSeconds (2 s):
        # until it has seen the new pod it answers "no egress policy" (also a refusal).
        lambda: (
            (r := connect(session, egress_proxy, f"{NODE_IP}:{targets.tcp_port}"))
            and "no egress policy" not in r
            and r
        ),
        timeout=30,
        interval=0.5,
        message="the egress proxy to know the session's pod",
    )
    assert raw.startswith("HTTP/1.1 403") and "raw IP" in raw, raw
    other = connect(session, egress_proxy, "pypi.org:443")
    assert other.startswith("HTTP/1.1 403") and "not in this session" in other, other
    rebound = connect(session, egress_proxy, "localhost:8000")
    assert rebound.startswith("HTTP/1.1 403") and "forbidden range" in rebound, rebound
