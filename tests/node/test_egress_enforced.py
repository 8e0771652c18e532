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

pytestmark = pytest.mark.node

KUBE_ROUTER = BIN_DIR / "kube-router"

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
