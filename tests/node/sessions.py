"""Helpers of the node tier's session tests: a user's session, its pod, claim and volume
on the node (test helper)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from kubeenv.client import KubeClient
from nodeenv.release import SESSIONS, Release

from sandbox_workspace.contract.crd import API_VERSION, SESSION_PLURAL
from sandbox_workspace.operator import naming


def sbs_path(namespace: str) -> str:
    return f"/apis/{API_VERSION}/namespaces/{namespace}/{SESSION_PLURAL}"


SBS = sbs_path(SESSIONS)


class UserSession:
    """One user's session as the platform backend sees it, plus its cluster objects.

    ``release`` is what gives an API client for a user: the chart's release (sessions
    in its namespace), or the s3-mode stack (``nodeenv.store_stack``) with its namespace.
    """

    def __init__(self, release: Release, kube: KubeClient, user: str, namespace: str = SESSIONS):
        self.kube, self.user, self.namespace = kube, user, namespace
        self.name = naming.session_name_for(user)  # the SandboxSession's (DNS) name
        self.session_id = naming.session_id_for(user)
        self.api = release.client(user)
        self.url = f"/sessions/{self.session_id}"
        self.sbs_path = f"{sbs_path(namespace)}/{self.name}"

    # -- through the API -------------------------------------------------------------
    def upload(self, cid: str, name: str, data: bytes) -> dict[str, Any]:
        r = self.api.post(
            f"{self.url}/files/upload",
            files={"file": (name, data)},
            data={"conversation_id": cid},
        )
        assert r.status_code == 201, r.text
        return r.json()

    def download(self, cid: str, name: str) -> bytes:
        r = self.api.get(f"{self.url}/files/{name}", params={"conversation_id": cid})
        assert r.status_code == 200, r.text
        return r.content

    def listing(self, cid: str) -> list[str]:
        r = self.api.get(f"{self.url}/files", params={"conversation_id": cid})
        assert r.status_code == 200, r.text
        return sorted(r.json()["files"])

    def execute(
        self, code: str, cid: str = "c", timeout: float = 120, language: str = "python"
    ) -> dict[str, Any]:
        r = self.api.post(
            f"{self.url}/execute",
            json={"conversation_id": cid, "language": language, "code": code},
            timeout=timeout,
        )
        assert r.status_code == 200, r.text
        return r.json()

    # -- in the cluster ------------------------------------------------------------------
    def sbs(self) -> dict[str, Any]:
        return self.kube.get(self.sbs_path)

    def phase(self) -> str | None:
        obj = self.kube.get_or_none(self.sbs_path)
        return (obj or {}).get("status", {}).get("phase")

    def pod(self) -> dict[str, Any] | None:
        return self.kube.get_or_none(
            f"/api/v1/namespaces/{self.namespace}/pods/{naming.runtime_pod_name(self.name)}"
        )

    def claim(self) -> dict[str, Any] | None:
        return self.kube.get_or_none(
            f"/api/v1/namespaces/{self.namespace}/persistentvolumeclaims/"
            f"{naming.workspace_claim_name(self.name)}"
        )

    def volume_dir(self) -> Path:
        """The workspace's directory on the node (the hostpath volume behind the PVC)."""
        claim = self.claim()
        assert claim and claim["spec"].get("volumeName"), claim
        pv = self.kube.get(f"/api/v1/persistentvolumes/{claim['spec']['volumeName']}")
        return Path(pv["spec"]["hostPath"]["path"])

    def wait_phase(self, phase: str, timeout: float = 90) -> dict[str, Any]:
        return self.kube.wait_for(
            self.sbs_path,
            lambda s: s.get("status", {}).get("phase") == phase,
            timeout=timeout,
            message=f"session {self.name} to be {phase}",
        )

    def delete(self) -> None:
        self.api.delete(self.url)
        self.api.close()


def container_id(pod: dict[str, Any]) -> str:
    (status,) = pod["status"]["containerStatuses"]
    return status["containerID"].removeprefix("containerd://")


def get(url: str) -> httpx.Response:
    return httpx.get(url, timeout=5, trust_env=False)


def empty_dir(kubelet_dir: Path, pod: dict[str, Any], volume: str = "workspace") -> Path:
    """Where the kubelet keeps a pod's emptyDir ``volume`` on the node's disk."""
    uid = pod["metadata"]["uid"]
    return Path(kubelet_dir) / "pods" / uid / "volumes" / "kubernetes.io~empty-dir" / volume
