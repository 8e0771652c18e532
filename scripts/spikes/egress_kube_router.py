"""Spike for issue 40 (docs/egress-spike.md), item (c): does kube-router, built from Go
modules, enforce a NetworkPolicy inside the node tier's kind of namespace?

Run as root, inside a private namespace (it refuses otherwise):

    unshare --net --mount --pid --fork --mount-proc --kill-child -- \
        .venv/bin/python scripts/spikes/egress_kube_router.py KUBE_ROUTER BIN_DIR WORKDIR

BIN_DIR holds etcd, kube-apiserver and kube-controller-manager (scripts/build-kube.sh).
No kubelet: three "pods" are network namespaces on a bridge, registered as Pod objects
whose status carries their addresses (kube-router reads pod IPs and labels from the API).
A sandbox pod may reach the proxy pod; after an egress NetworkPolicy it must no longer
reach the "store" pod. Addresses exist only inside this namespace.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests" / "support"), str(ROOT / "tests" / "cluster")]
from kubeenv.controlplane import ControlPlane, spawn  # noqa: E402

NODE, NODE_IP, BRIDGE = "sbw-node", "10.99.0.1", "br9"
PODS = {"sandbox": "10.99.0.10", "proxy": "10.99.0.20", "store": "10.99.0.30"}


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=60)


def probe(target: str) -> str:
    out = sh(
        "ip", "netns", "exec", "pod-sandbox", "curl", "-s", "-o", "/dev/null", "-m", "1",
        "-w", "%{http_code}", f"http://{PODS[target]}:8080/", check=False,
    )  # fmt: skip
    return out.stdout or f"failed (curl rc={out.returncode})"


def wait_for(what: str, check, timeout: float = 60) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if check():
            return time.monotonic() - t0
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {what}")


def network() -> None:
    sh("mount", "--make-rprivate", "/")
    sh("ip", "link", "set", "lo", "up")
    Path("/run/netns").mkdir(parents=True, exist_ok=True)
    sh("mount", "-t", "tmpfs", "none", "/run/netns")
    sh("ip", "link", "add", BRIDGE, "type", "bridge")
    sh("ip", "addr", "add", f"{NODE_IP}/24", "dev", BRIDGE)
    sh("ip", "link", "set", BRIDGE, "up")
    Path("/proc/sys/net/bridge/bridge-nf-call-iptables").write_text("1")
    for name, ip in PODS.items():
        ns = f"pod-{name}"
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", f"v{name[:8]}", "type", "veth", "peer", "name", "eth0", "netns", ns)
        sh("ip", "link", "set", f"v{name[:8]}", "master", BRIDGE, "up")
        sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", ns, "route", "add", "default", "via", NODE_IP)
        if name != "sandbox":
            subprocess.Popen(
                ["ip", "netns", "exec", ns, sys.executable, "-m", "http.server", "8080",
                 "--bind", ip],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip


def objects(api) -> None:
    api.create(
        "/api/v1/nodes",
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}},
            "spec": {"podCIDR": "10.99.0.0/24", "podCIDRs": ["10.99.0.0/24"]},
        },
    )
    api.patch(
        f"/api/v1/nodes/{NODE}/status",
        {"status": {"addresses": [{"type": "InternalIP", "address": NODE_IP}]}},
    )
    api.create("/api/v1/namespaces", {"metadata": {"name": "sb"}})
    for name, ip in PODS.items():
        api.create(
            "/api/v1/namespaces/sb/pods",
            {
                "metadata": {"name": name, "labels": {"role": name}},
                "spec": {
                    "nodeName": NODE,
                    "containers": [{"name": "c", "image": "none"}],
                },
            },
        )
        api.patch(
            f"/api/v1/namespaces/sb/pods/{name}/status",
            {
                "status": {
                    "phase": "Running",
                    "hostIP": NODE_IP,
                    "podIP": ip,
                    "podIPs": [{"ip": ip}],
                }
            },
        )


POLICY = {
    "apiVersion": "networking.k8s.io/v1",
    "kind": "NetworkPolicy",
    "metadata": {"name": "sandbox-egress", "namespace": "sb"},
    "spec": {
        "podSelector": {"matchLabels": {"role": "sandbox"}},
        "policyTypes": ["Egress"],
        "egress": [
            {
                "to": [{"podSelector": {"matchLabels": {"role": "proxy"}}}],
                "ports": [{"protocol": "TCP", "port": 8080}],
            }
        ],
    },
}


def main() -> None:
    if os.environ.get("EGRESS_SPIKE_IN_NS") != "1":
        raise SystemExit("run inside unshare (see the docstring) with EGRESS_SPIKE_IN_NS=1")
    kube_router, bin_dir, workdir = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    network()
    plane = ControlPlane(workdir / "cp", bin_dir).start()
    print(f"control plane up in {time.monotonic() - t0:.1f} s", flush=True)
    try:
        with plane.client() as api:
            objects(api)
            wait_for("pods to answer", lambda: probe("proxy") == "200" == probe("store"))
            print(f"no policy: sandbox->proxy {probe('proxy')}, sandbox->store {probe('store')}")
            router = spawn(
                [kube_router, f"--kubeconfig={plane.kubeconfig}", "--run-firewall=true",
                 "--run-router=false", "--run-service-proxy=false",
                 f"--hostname-override={NODE}", "--health-port=0", "--metrics-port=0",
                 "--iptables-sync-period=5s", "-v=1"],
                workdir / "kube-router.log",
            )  # fmt: skip
            try:
                api.create("/apis/networking.k8s.io/v1/namespaces/sb/networkpolicies", POLICY)
                took = wait_for(
                    "the policy to block the store", lambda: probe("store") != "200", timeout=30
                )
                print(f"policy enforced {took:.1f} s after create")
                print(
                    f"with policy: sandbox->proxy {probe('proxy')}, sandbox->store {probe('store')}"
                )
                api.delete(
                    "/apis/networking.k8s.io/v1/namespaces/sb/networkpolicies/sandbox-egress"
                )
                took = wait_for("the store to be reachable again", lambda: probe("store") == "200")
                print(f"policy deleted: store reachable again after {took:.1f} s")
                print(f"kube-router alive: {router.poll() is None}")
            finally:
                router.terminate()
                router.wait(10)
    finally:
        # What kube-router programmed, for reading after the run.
        for name, argv in {
            "iptables.txt": ["iptables-save"],
            "ipset.txt": ["ipset", "list"],
        }.items():
            (workdir / name).write_text(sh(*argv, check=False).stdout)
        plane.stop()
        tail = (workdir / "kube-router.log").read_text(errors="replace").splitlines()[-15:]
        print("kube-router log tail:", *tail, sep="\n  ")


if __name__ == "__main__":
    main()
