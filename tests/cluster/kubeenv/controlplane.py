"""Start and stop a real Kubernetes control plane for tests (test helper).

etcd, kube-apiserver and kube-controller-manager run as child processes, each in its
own process group, on ephemeral 127.0.0.1 ports, with certificates generated here. The
binaries come from ``scripts/build-kube.sh`` (cached under ``.cache/kube/``).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import datetime as dt
import ipaddress
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx
import yaml
from build_scripts import build_with_go  # tests/support
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from ports import free_port  # tests/support: outside the ephemeral range

from .client import KubeClient, ssl_context, wait_until

REPO_ROOT = Path(__file__).resolve().parents[3]
BUILD_SCRIPT = REPO_ROOT / "scripts" / "build-kube.sh"
BIN_DIR = Path(os.environ.get("SANDBOX_KUBE_CACHE", REPO_ROOT / ".cache" / "kube")) / "bin"
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager")

# The apiserver must allocate Service IPs from *some* range; nothing is ever sent there.
SERVICE_CIDR = "10.0.0.0/24"


# --------------------------------------------------------------------------- building
def binaries_present(bin_dir: Path = BIN_DIR) -> bool:
    return all(os.access(bin_dir / name, os.X_OK) for name in COMPONENTS)


class GoMissing(RuntimeError):
    """No Go toolchain: the cluster tier cannot build its binaries."""


def build_binaries(stream: IO[str] | None = None) -> Path:
    """Run scripts/build-kube.sh (seconds when cached); return the bin directory.

    Raises GoMissing when the binaries are absent and no Go toolchain exists, and
    RuntimeError (with the log tail) when the build fails.
    """
    build_with_go(
        BUILD_SCRIPT,
        REPO_ROOT,
        present=binaries_present,
        missing=GoMissing,
        what=f"binaries in {BIN_DIR}: cannot build etcd/kube-apiserver for the cluster tier",
        stream=stream,
    )
    return BIN_DIR


# ----------------------------------------------------------------------- certificates
def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _pem_key(key: Any) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


@dataclass
class Pki:
    """A test CA, the apiserver's serving certificate and the service-account key pair.

    ``extra_ips``: more IP SANs of the serving certificate (the node tier serves the API
    on an address inside its network namespace too).
    """

    dir: Path
    extra_ips: tuple[str, ...] = ()
    ca_cert: Path = field(init=False)
    ca_key: Path = field(init=False)
    serving_cert: Path = field(init=False)
    serving_key: Path = field(init=False)
    sa_key: Path = field(init=False)
    sa_pub: Path = field(init=False)

    def generate(self) -> Pki:
        self.dir.mkdir(parents=True, exist_ok=True)
        now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
        later = now + dt.timedelta(days=2)

        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca = (
            x509.CertificateBuilder()
            .subject_name(_name("sandbox-workspace-test-ca"))
            .issuer_name(_name("sandbox-workspace-test-ca"))
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(later)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
            )
            .sign(ca_key, hashes.SHA256())
        )

        key = ec.generate_private_key(ec.SECP256R1())
        sans: list[x509.GeneralName] = [
            x509.DNSName(n)
            for n in (
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            )
        ]
        sans += [
            x509.IPAddress(ipaddress.ip_address(ip))
            for ip in (
                "127.0.0.1",
                str(next(ipaddress.ip_network(SERVICE_CIDR).hosts())),
                *self.extra_ips,
            )
        ]
        serving = (
            x509.CertificateBuilder()
            .subject_name(_name("kube-apiserver"))
            .issuer_name(ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(later)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
            )
            .sign(ca_key, hashes.SHA256())
        )

        sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

        self._ca, self._ca_key, self._not_before, self._not_after = ca, ca_key, now, later
        self.ca_cert = self._write("ca.crt", ca.public_bytes(serialization.Encoding.PEM))
        self.ca_key = self._write("ca.key", _pem_key(ca_key))
        self.serving_cert = self._write(
            "apiserver.crt", serving.public_bytes(serialization.Encoding.PEM)
        )
        self.serving_key = self._write("apiserver.key", _pem_key(key))
        self.sa_key = self._write("sa.key", _pem_key(sa_key))
        self.sa_pub = self._write(
            "sa.pub",
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ),
        )
        return self

    def issue_client(self, name: str, cn: str, org: str | None = None) -> tuple[Path, Path]:
        """A client certificate signed by the CA (after :meth:`generate`): (cert, key)
        written as ``name.crt`` / ``name.key``. The apiserver presents one to kubelets."""
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(cn, org))
            .issuer_name(self._ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self._not_before)
            .not_valid_after(self._not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False)
            .sign(self._ca_key, hashes.SHA256())
        )
        return (
            self._write(f"{name}.crt", cert.public_bytes(serialization.Encoding.PEM)),
            self._write(f"{name}.key", _pem_key(key)),
        )

    def _write(self, name: str, data: bytes) -> Path:
        path = self.dir / name
        path.write_bytes(data)
        path.chmod(0o600)
        return path


# -------------------------------------------------------------------------- processes
_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def spawn(
    args: list[str], log_path: Path, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start ``args`` in a new session (its own process group), output to ``log_path``.

    The child also gets SIGKILL if the spawning thread dies, so a crashed pytest leaves
    no stray processes behind.
    """
    log = open(log_path, "ab")  # noqa: SIM115 - handed to the child, closed below
    try:
        return subprocess.Popen(
            args,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env if env is not None else base_env(),
            cwd=cwd,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
    finally:
        log.close()


def base_env() -> dict[str, str]:
    """A minimal environment: no proxies, no inherited credentials."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    if "HOME" in os.environ:
        env["HOME"] = os.environ["HOME"]
    return env


def stop_process(proc: subprocess.Popen[Any], grace: float = 10.0) -> int | None:
    """SIGTERM the process group, wait up to ``grace`` seconds, then SIGKILL it."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
    # Kill whatever is left in the group (children of the component), even if the
    # leader already exited.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    return proc.returncode


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` from /proc (0 when gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


# ------------------------------------------------------------------------ the cluster
class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager on 127.0.0.1.

    Attributes after :meth:`start`: ``server`` (https URL), ``token`` (admin bearer
    token, group system:masters), ``kubeconfig`` (path), ``ca_file``.

    Subclasses (the node tier's) adapt it through the class attributes below and by
    overriding :meth:`apiserver_args` / :meth:`kcm_args`, whose flags are appended after
    the defaults (a scalar flag's last occurrence wins; list flags accumulate, so those
    are class attributes).
    """

    #: The apiserver's port; 0 picks a free one.
    apiserver_port = 0
    authorization_modes = "RBAC"
    #: No real nodes: the node agent registers one, node lifecycle (taints, evictions on
    #: missed heartbeats) would only add noise.
    controllers = "*,-nodelifecycle,-nodeipam"
    #: Extra IP SANs of the serving certificate.
    extra_ips: tuple[str, ...] = ()

    def __init__(self, workdir: Path, bin_dir: Path = BIN_DIR):
        self.workdir = Path(workdir)
        self.bin_dir = Path(bin_dir)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.token = secrets.token_urlsafe(24)
        self.kcm_token = secrets.token_urlsafe(24)
        # More bearer tokens of the static token file: (token, user, groups).
        self.tokens: list[tuple[str, str, str]] = []
        self.server = ""
        self.kubeconfig = self.workdir / "admin.kubeconfig"
        self.timings: dict[str, float] = {}
        self.pki = Pki(self.workdir / "pki", extra_ips=self.extra_ips)
        self._atexit_registered = False

    def add_user(self, user: str, groups: str = "") -> str:
        """A bearer token for ``user`` (before :meth:`start`); returns it."""
        token = secrets.token_urlsafe(24)
        self.tokens.append((token, user, groups))
        return token

    def apiserver_args(self) -> list[str]:
        """Flags appended to the apiserver's defaults (subclasses override)."""
        return []

    def kcm_args(self) -> list[str]:
        """Flags appended to kube-controller-manager's defaults (subclasses override)."""
        return []

    @property
    def admin_token(self) -> str:
        return self.token

    @property
    def ca_file(self) -> str:
        return str(self.pki.ca_cert)

    def log_path(self, component: str) -> Path:
        return self.workdir / f"{component}.log"

    def client(self, timeout: float = 30.0) -> KubeClient:
        return KubeClient(self.server, self.token, self.ca_file, timeout=timeout)

    # -- lifecycle --------------------------------------------------------------------
    def start(self, timeout: float = 120.0) -> ControlPlane:
        t0 = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        if not self._atexit_registered:
            atexit.register(self.stop)
            self._atexit_registered = True
        try:
            self.pki.generate()
            self._start_etcd(timeout)
            self.timings["etcd"] = time.monotonic() - t0
            self._start_apiserver(timeout)
            self.timings["kube-apiserver"] = time.monotonic() - t0
            self._start_kcm(timeout)
            self.timings["kube-controller-manager"] = time.monotonic() - t0
        except BaseException:
            self.stop()
            raise
        self.timings["total"] = time.monotonic() - t0
        return self

    def stop(self) -> None:
        # Reverse order: controllers first, storage last.
        for name in reversed(list(self.procs)):
            stop_process(self.procs.pop(name))

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def rss(self) -> dict[str, int]:
        return {name: rss_bytes(p.pid) for name, p in self.procs.items()}

    def _check_alive(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is not None:
            tail = self.log_path(name).read_text(errors="replace")[-4000:]
            raise RuntimeError(f"{name} exited with {proc.returncode}; log tail:\n{tail}")

    def _wait_ready(self, name: str, probe: Any, timeout: float) -> None:
        def check() -> bool:
            self._check_alive(name)
            return bool(probe())

        try:
            wait_until(check, timeout=timeout, interval=0.1, message=f"{name} to be ready")
        except TimeoutError as exc:
            tail = self.log_path(name).read_text(errors="replace")[-4000:]
            raise RuntimeError(f"{exc}\n{name} log tail:\n{tail}") from None

    # -- components -------------------------------------------------------------------
    def _start_etcd(self, timeout: float) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        peer_url = f"http://127.0.0.1:{peer}"
        self.procs["etcd"] = spawn(
            [
                str(self.bin_dir / "etcd"),
                "--name=default",
                f"--data-dir={self.workdir / 'etcd-data'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
            self.log_path("etcd"),
        )

        def healthy() -> bool:
            r = httpx.get(f"{self.etcd_url}/health", timeout=1, trust_env=False)
            return r.status_code == 200 and r.json().get("health") == "true"

        self._wait_ready("etcd", healthy, timeout)

    def restart_apiserver(self, down_seconds: float = 0.0, timeout: float = 120.0) -> None:
        """Stop kube-apiserver (SIGTERM), stay down ``down_seconds``, start it again on
        the same port: every client sees a real apiserver restart."""
        port = int(self.server.rsplit(":", 1)[1])
        stop_process(self.procs.pop("kube-apiserver"))
        time.sleep(down_seconds)
        self._start_apiserver(timeout, port=port)

    def _start_apiserver(self, timeout: float, port: int | None = None) -> None:
        port = port or self.apiserver_port or free_port()
        self.server = f"https://127.0.0.1:{port}"
        tokens = self.workdir / "tokens.csv"
        tokens.write_text(
            f'{self.token},admin,admin-uid,"system:masters"\n'
            f"{self.kcm_token},system:kube-controller-manager,kcm-uid\n"
            + "".join(f'{t},{user},{user}-uid,"{groups}"\n' for t, user, groups in self.tokens)
        )
        tokens.chmod(0o600)
        pki = self.pki
        self.procs["kube-apiserver"] = spawn(
            [
                str(self.bin_dir / "kube-apiserver"),
                f"--etcd-servers={self.etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.workdir / 'apiserver-certs'}",
                f"--tls-cert-file={pki.serving_cert}",
                f"--tls-private-key-file={pki.serving_key}",
                f"--client-ca-file={pki.ca_cert}",
                f"--token-auth-file={tokens}",
                f"--authorization-mode={self.authorization_modes}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                # The "kubernetes" Service would get 127.0.0.1 endpoints, which the API
                # rejects; nothing in the tests needs in-cluster access to the API.
                "--endpoint-reconciler-type=none",
                "--allow-privileged=true",
                "--profiling=false",
                "--v=1",
                *self.apiserver_args(),
            ],
            self.log_path("kube-apiserver"),
        )
        probe = httpx.Client(
            verify=ssl_context(str(pki.ca_cert)),
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=2,
            trust_env=False,
        )
        try:
            self._wait_ready(
                "kube-apiserver",
                lambda: probe.get(f"{self.server}/readyz").status_code == 200,
                timeout,
            )
        finally:
            probe.close()
        self.write_kubeconfig(self.kubeconfig, "admin", self.token)

    def _start_kcm(self, timeout: float) -> None:
        port = free_port()
        kubeconfig = self.workdir / "kcm.kubeconfig"
        self.write_kubeconfig(kubeconfig, "system:kube-controller-manager", self.kcm_token)
        pki = self.pki
        self.procs["kube-controller-manager"] = spawn(
            [
                str(self.bin_dir / "kube-controller-manager"),
                f"--kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.workdir / 'kcm-certs'}",
                "--leader-elect=false",
                # Every controller acts with its own service account, as in a real
                # cluster, so RBAC of the bootstrap policy applies to each.
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={pki.sa_key}",
                f"--root-ca-file={pki.ca_cert}",
                f"--cluster-signing-cert-file={pki.ca_cert}",
                f"--cluster-signing-key-file={pki.ca_key}",
                f"--controllers={self.controllers}",
                "--pvclaimbinder-sync-period=1s",
                "--profiling=false",
                "--v=1",
                *self.kcm_args(),
            ],
            self.log_path("kube-controller-manager"),
        )
        probe = httpx.Client(verify=False, timeout=2, trust_env=False)  # self-signed
        try:
            self._wait_ready(
                "kube-controller-manager",
                lambda: probe.get(f"https://127.0.0.1:{port}/healthz").status_code == 200,
                timeout,
            )
        finally:
            probe.close()
        # The service-account controller is up when "default" gets its service account
        # (pods cannot be created in a namespace before that).
        with self.client() as api:
            self._wait_ready(
                "kube-controller-manager",
                lambda: api.get_or_none("/api/v1/namespaces/default/serviceaccounts/default"),
                timeout,
            )

    def write_kubeconfig(self, path: Path, user: str, token: str) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "sandbox-test",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority": str(self.pki.ca_cert),
                    },
                }
            ],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [
                {"name": "sandbox-test", "context": {"cluster": "sandbox-test", "user": user}}
            ],
            "current-context": "sandbox-test",
        }
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        path.chmod(0o600)

    # -- CRDs -------------------------------------------------------------------------
    def apply_crds(self, crd_dir: Path, timeout: float = 60.0) -> list[str]:
        """Apply every CustomResourceDefinition in ``crd_dir/*.yaml``; wait Established."""
        names: list[str] = []
        with self.client() as api:
            for path in sorted(Path(crd_dir).glob("*.yaml")):
                for doc in yaml.safe_load_all(path.read_text()):
                    if not doc:
                        continue
                    api.apply(doc)
                    if doc.get("kind") == "CustomResourceDefinition":
                        names.append(doc["metadata"]["name"])
            for name in names:
                api.wait_for(
                    f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}",
                    crd_established,
                    timeout=timeout,
                    message=f"CRD {name} to be Established",
                )
        return names


def crd_established(crd: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Established" and c.get("status") == "True"
        for c in crd.get("status", {}).get("conditions", [])
    )
