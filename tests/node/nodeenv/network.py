"""The node tier's network and private host paths, inside its own namespaces (test helper).

Everything here runs inside the network + mount namespace made by ``netns`` (it refuses
to run anywhere else), so every address below exists only there: nothing can leave the
machine, and the namespace's death takes every interface with it.

- ``node0``: a bridge carrying the node's IP (the kubelet refuses a loopback node IP;
  there is no ``dummy`` module here) and the ``kubernetes`` Service's ClusterIP — pods
  reach the API server on it without kube-proxy (the apiserver listens on :443 there).
- ``cni0``: made by the CNI ``bridge`` plugin; pods get addresses of ``POD_SUBNET``.
- Host paths the components insist on (hostpath provisioner, CNI cache, pod logs) are
  bind-mounted from the run's scratch directory, so nothing lands on the host.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

NODE_NAME = "sbw-node"
NODE_IP = "10.250.0.1"
NODE_PREFIX = 24
POD_SUBNET = "10.244.0.0/24"
# A second node (nodeenv.second_node), started only by the tests that ask for it: its
# own address on node0, its own pod bridge and subnet.
SECOND_NODE_NAME = "sbw-node-2"
SECOND_NODE_IP = "10.250.0.2"
SECOND_POD_SUBNET = "10.244.1.0/24"
SECOND_BRIDGE = "cni1"
# The first address of kubeenv's SERVICE_CIDR: the `kubernetes` Service's ClusterIP.
SERVICE_IP = "10.0.0.1"
NETNS_ENV = "SANDBOX_NODE_NETNS"

# Host paths written by the node's components -> name of the scratch dir bound there.
PRIVATE_DIRS = {
    # kube-controller-manager's hostpath provisioner: /tmp/hostpath_pv/<uuid>
    "/tmp/hostpath_pv": "hostpath",
    # libcni's result cache
    "/var/lib/cni": "cni-cache",
    # the kubelet's container logs and their symlinks
    "/var/log/pods": "pod-logs",
    "/var/log/containers": "container-logs",
}


class NotInNamespace(RuntimeError):
    """Refusing to touch the network outside the tier's own namespace."""


def inside() -> bool:
    """True in the namespace made by ``netns`` (it sets NETNS_ENV)."""
    return os.environ.get(NETNS_ENV) == "1"


def interfaces() -> list[str]:
    out = subprocess.run(["ip", "-j", "link", "show"], check=True, capture_output=True).stdout
    return [link["ifname"] for link in json.loads(out)]


def ensure_private() -> None:
    """Raise unless this is the tier's namespace: marked, and no interface but its own."""
    if not inside():
        raise NotInNamespace(f"{NETNS_ENV}=1 is not set: run through nodeenv.netns")
    foreign = [
        n
        for n in interfaces()
        if n not in ("lo", "node0", "cni0", SECOND_BRIDGE) and not n.startswith("veth")
    ]
    if foreign:
        raise NotInNamespace(f"interfaces {foreign} exist: not a private network namespace")


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def setup(scratch: Path) -> None:
    """Loopback up, the node bridge with the node and Service IPs, private host paths."""
    ensure_private()
    ip("link", "set", "lo", "up")
    if "node0" not in interfaces():
        ip("link", "add", "node0", "type", "bridge")
        ip("addr", "add", f"{NODE_IP}/{NODE_PREFIX}", "dev", "node0")
        ip("addr", "add", f"{SERVICE_IP}/32", "dev", "node0")
        ip("link", "set", "node0", "up")
    for host_path, name in PRIVATE_DIRS.items():
        source = scratch / name
        source.mkdir(parents=True, exist_ok=True)
        # The mount point itself stays on the host as an empty directory.
        Path(host_path).mkdir(parents=True, exist_ok=True)
        if not os.path.ismount(host_path):
            subprocess.run(["mount", "--bind", str(source), host_path], check=True)


def teardown() -> None:
    """Unmount the private host paths (the namespace's end would drop them too)."""
    for host_path in PRIVATE_DIRS:
        if os.path.ismount(host_path):
            subprocess.run(["umount", "-l", host_path], check=False, capture_output=True)


def unmount_under(path: Path) -> None:
    """Lazily unmount everything mounted below ``path`` (kubelet volumes), deepest first."""
    prefix = str(path).rstrip("/") + "/"
    mounts = [
        line.split()[4]
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if line.split()[4].startswith(prefix)
    ]
    for mount in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "-l", mount], check=False, capture_output=True)
