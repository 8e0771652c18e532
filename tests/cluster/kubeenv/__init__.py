"""Test-only helpers for the `cluster` tier: a real control plane started from locally
built binaries (etcd, kube-apiserver, kube-controller-manager), a thin Kubernetes REST
client on httpx, and a node agent that runs sandbox pods as loopback processes.

Nothing here is product code. Only loopback addresses are ever contacted.
"""

from .client import ApiError, KubeClient, wait_until
from .controlplane import ControlPlane, build_binaries
from .nodeagent import NodeAgent

__all__ = [
    "ApiError",
    "ControlPlane",
    "KubeClient",
    "NodeAgent",
    "build_binaries",
    "wait_until",
]
