"""The product installed on the node as docs/operations.md's "Install with Helm" says (test
helper): its shell blocks, the tools they call (helm and kubectl 1.34 from .cache), and
handles on the release for the tests.

``install_doc_block(name)`` returns the block between ``<!-- name:start -->`` and
``<!-- name:end -->`` of docs/operations.md; ``Release.install()`` runs the ``install``
block with the flags its step 1 gives for a locally built image (plus the test's model and
a short operator check interval), so the install is the documented one, not a copy of it.
"""

from __future__ import annotations

import base64
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from doc_blocks import OPERATIONS, shell_block
from kubeenv.client import KubeClient, wait_until
from kubeenv.controlplane import BIN_DIR, REPO_ROOT

TOOLS_BIN = Path(os.environ.get("SANDBOX_TOOLS_CACHE", REPO_ROOT / ".cache" / "tools")) / "bin"
RELEASE = "sw"
NAMESPACE = "sandbox-workspace"
SESSIONS = f"{NAMESPACE}-sessions"
API = f"{RELEASE}-sandbox-workspace-api"
OPERATOR = f"{RELEASE}-sandbox-workspace-operator"
API_PORT = 8000  # the chart's api.containerPort


def install_doc_block(name: str) -> str:
    return shell_block(OPERATIONS, name)


@dataclass
class Release:
    kubeconfig: Path
    workdir: Path
    image: str
    set_values: dict[str, str] = field(default_factory=dict)
    service_token: str = ""
    api_url: str = ""

    def env(self) -> dict[str, str]:
        """What a user's shell has: kubectl and helm on PATH, the cluster's kubeconfig."""
        home = self.workdir / "home"
        home.mkdir(parents=True, exist_ok=True)
        return {
            "PATH": f"{BIN_DIR}:{TOOLS_BIN}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            "KUBECONFIG": str(self.kubeconfig),
            "HOME": str(home),
            "LANG": "C.UTF-8",
        }

    def shell(self, script: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Run ``script`` with bash -euo pipefail in the repository, as a user would."""
        return subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=REPO_ROOT,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def install(self) -> subprocess.CompletedProcess[str]:
        repository, _, tag = self.image.rpartition(":")
        flags = {"image.repository": repository, "image.tag": tag, **self.set_values}
        script = install_doc_block("install")
        line = "helm install sw charts/sandbox-workspace -n sandbox-workspace --create-namespace"
        assert line in script, "the documented install command changed: update the node tier"
        extra = " ".join(f"--set {key}={value}" for key, value in flags.items())
        return self.shell(script.replace(line, f"{line} {extra}"))

    def connect(self, kube: KubeClient) -> Release:
        """The service token and the API pod's address (reached over the pod network)."""
        secret = kube.get(f"/api/v1/namespaces/{NAMESPACE}/secrets/{API}")
        self.service_token = base64.b64decode(secret["data"]["service-token"]).decode()
        self.api_url = f"http://{api_pod_ip(kube)}:{API_PORT}"
        wait_until(
            lambda: httpx.get(f"{self.api_url}/healthz", timeout=2).status_code == 200,
            timeout=60,
            message="the API pod to answer on its pod IP",
        )
        return self

    def client(self, user: str, timeout: float = 120) -> httpx.Client:
        """The platform backend speaking for ``user``, straight to the API pod."""
        return httpx.Client(
            base_url=f"{self.api_url}/api/v1",
            headers={"Authorization": f"Bearer {self.service_token}", "X-User-Id": user},
            timeout=timeout,
            trust_env=False,
        )


def api_pod_ip(kube: KubeClient) -> str:
    pods = kube.list(
        f"/api/v1/namespaces/{NAMESPACE}/pods",
        labelSelector="app.kubernetes.io/component=api",
    )
    running = [p for p in pods if p["status"].get("phase") == "Running"]
    assert running, f"no running API pod: {[p['status'].get('phase') for p in pods]}"
    return running[0]["status"]["podIP"]
