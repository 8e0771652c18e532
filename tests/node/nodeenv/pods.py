"""A bare sandbox pod (test helper): the container exactly as the operator builds it —
image, command, security context, resources, readiness probe — without the operator,
its Secret or a PVC (an emptyDir workspace and a fixed runtime token). The node tier's
smoke test runs it; ``bench session_start`` uses it as the baseline of session start."""

from __future__ import annotations

from typing import Any

from sandbox_workspace.operator.builders import build_sandbox_pod
from sandbox_workspace.operator.models import SandboxSession
from sandbox_workspace.operator.settings import OperatorSettings

TOKEN = "bare-pod-token-" + "0" * 17


def bare_sandbox_pod(name: str, namespace: str, image: str) -> dict[str, Any]:
    session = SandboxSession.from_body(
        {
            "apiVersion": "sandboxworkspace.io/v1alpha1",
            "kind": "SandboxSession",
            "metadata": {"name": name, "namespace": namespace, "uid": "bare"},
            "spec": {"userId": name, "storage": {"persistent": False}},
        }
    )
    spec = build_sandbox_pod(session, OperatorSettings(image=image))["spec"]
    spec["containers"][0]["env"] = [
        {"name": "SANDBOX_RUNTIME_TOKEN", "value": TOKEN},
        {"name": "HOME", "value": "/tmp"},
    ]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}
