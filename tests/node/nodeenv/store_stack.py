"""Store mode ``s3`` on the real node (test helper): the operator and the API as processes
of the tier's namespace (kubeenv's ``Stack``, backend ``kubernetes``) on a sessions
namespace of their own, both pointed at a real SeaweedFS on the namespace's loopback
(tests/support/seaweedfs.py, the suite's ``seaweedfs`` fixture).

Why processes and not a second helm release: the chart's release of this tier runs in
store mode ``local`` (its tests prove the claim per user), and a second install costs
~35 s of rollouts; the operator and the API here are the same code with the same
settings a release gives them, and the store on 127.0.0.1 is out of every pod's reach
by the network's shape too (a pod's loopback is its own) — what sandbox code can still
try against it, tests/node/test_store_isolation.py tries.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from kubeenv.client import KubeClient
from kubeenv.controlplane import REPO_ROOT
from kubeenv.stack import Stack

from sandbox_workspace.store.layout import DEFAULT_TENANT, Layout

NAMESPACE = "s3-sessions"
BUCKET = "node-s3"
PREFIX = "workspaces/"


def operator_env(api_env: dict[str, str]) -> dict[str, str]:
    """The operator's names of the API's store settings (SANDBOX_WORKSPACE_S3__BUCKET →
    SANDBOX_OPERATOR_S3__BUCKET: the same values, as the chart gives both)."""
    return {k.replace("SANDBOX_WORKSPACE_", "SANDBOX_OPERATOR_", 1): v for k, v in api_env.items()}


@dataclass
class StoreStack:
    """The running s3-mode stack: the API's URL, its namespace, the store and its bucket."""

    api_url: str
    namespace: str
    store: object  # seaweedfs.SeaweedFS
    bucket: str

    def client(self, user: str, timeout: float = 120) -> httpx.Client:
        """The platform backend speaking for ``user`` (the API runs in dev auth on loopback)."""
        return httpx.Client(
            base_url=f"{self.api_url}/api/v1",
            headers={"X-User-Id": user},
            timeout=timeout,
            trust_env=False,
        )

    def keys(self, session_id: str) -> list[str]:
        """Every object key of ``session_id``'s conversations (sandbox_workspace/store/layout.py:
        ``{prefix}{tenant}/{session}/…``, tenant ``default``)."""
        prefix = Layout(PREFIX).session(DEFAULT_TENANT, session_id)
        return sorted(info.key for info in self.store.list_keys(self.bucket, prefix))


@contextmanager
def store_stack(
    cluster, kube: KubeClient, store, workdir: Path, check_interval: str = "1"
) -> Iterator[StoreStack]:
    """Operator and API in store mode s3 on ``NAMESPACE`` (restricted Pod Security, as the
    chart makes its sessions namespace), the CRDs applied (helm skips them when present)."""
    cluster.plane.apply_crds(REPO_ROOT / "crds")
    restricted = {
        f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "warn")
    }
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": NAMESPACE, "labels": restricted},
        }
    )
    store.make_bucket(BUCKET)
    api_env = store.env(BUCKET, PREFIX)
    stack = Stack(
        cluster.kubeconfig,
        NAMESPACE,
        workdir,
        operator_env={
            **operator_env(api_env),
            "SANDBOX_OPERATOR_IMAGE": cluster.images["image"],
            "SANDBOX_OPERATOR_IMAGE_PULL_POLICY": "Never",  # imported, no registry
            # Executed code confined or not run at all: the isolation test relies on it.
            "SANDBOX_OPERATOR_CONFINEMENT": "require",
            "SANDBOX_OPERATOR_CHECK_INTERVAL_SECONDS": check_interval,
        },
        api_env=api_env,
    )
    with stack.running(kube) as url:
        yield StoreStack(url, NAMESPACE, store, BUCKET)
