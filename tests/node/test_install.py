"""The chart installed exactly as docs/operations.md's "Install with Helm" says, on a real
node, and its walk-through through ``kubectl port-forward``."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess

import pytest
from nodeenv.release import NAMESPACE, SESSIONS, install_doc_block

pytestmark = pytest.mark.node


def test_helm_install_as_documented(release_result, kube):
    release, result = release_result
    assert result.returncode == 0, result.stdout + result.stderr
    # Two peered operator replicas by default: a StatefulSet, rolled out whole (kubectl's
    # words depend on whether the apiserver filled in a partition: it does, 0).
    assert re.search(
        r"(partitioned roll out complete: 2 new pods|statefulset rolling update complete 2 pods)",
        result.stdout,
    ), result.stdout
    assert 'deployment "sw-sandbox-workspace-api" successfully rolled out' in result.stdout
    pods = kube.list(f"/api/v1/namespaces/{NAMESPACE}/pods")
    assert {p["metadata"]["labels"]["app.kubernetes.io/component"] for p in pods} == {
        "api",
        "operator",
    }
    for pod in pods:
        assert pod["status"]["phase"] == "Running"
        (status,) = pod["status"]["containerStatuses"]
        assert status["ready"] and status["image"] == release.image
        assert status["containerID"].startswith("containerd://")
    ns = kube.get(f"/api/v1/namespaces/{SESSIONS}")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_install_walkthrough_through_port_forward(release, kube):
    script = install_doc_block("install-walkthrough")
    assert "port-forward service/sw-sandbox-workspace-api 8000:80 &" in script
    workdir = release.workdir / "walkthrough"
    workdir.mkdir(exist_ok=True)
    out_file, err_file = workdir / "stdout", workdir / "stderr"
    with open(out_file, "w") as out_fd, open(err_file, "w") as err_fd:
        # Files, not pipes: the backgrounded port-forward would hold a pipe open.
        proc = subprocess.Popen(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=workdir,
            env=release.env(),
            stdout=out_fd,
            stderr=err_fd,
            start_new_session=True,
        )
    try:
        proc.wait(timeout=240)
    finally:
        # The port-forward is the script's child, left running: end the whole group.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    out, err = out_file.read_text(), err_file.read_text()
    assert proc.returncode == 0, out + err
    assert '"status":"pending"' in out or '"status":"running"' in out
    assert '"path":"/workspace/conv456/uploads/temparea/weather.csv"' in out
    assert '"stdout":' in out and "15.0" in out, out  # mean of 21 and 9
    # `kubectl get sbs,cws,pods`: the session Running, its pod a Running container.
    lines = out.splitlines()
    assert any(
        line.startswith("sandboxsession.") and "sb-session-alice" in line and "Running" in line
        for line in lines
    ), out
    # The container runs; READY may still say 0/1: the operator reports Running at the
    # runtime's first answer to its own check, the kubelet's probe follows within a period.
    assert any(
        line.startswith("pod/sb-session-alice") and line.split()[2] == "Running" for line in lines
    ), out
    assert '"deleted":true' in out or '"status":"deleted"' in out
