"""scripts/cluster.py's outer half (``make cluster`` / ``make cluster-down``), without a
node: the Makefile targets call it, ``down`` with nothing running says so, and ``up``
where the node tier cannot run says why instead of failing half-way. The node itself —
install, relay, printed commands — is tests/node/test_cluster_script.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _run(*args: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / "cluster.py"), *args],
        env={**os.environ, "SANDBOX_CLUSTER_DIR": str(tmp_path), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_make_targets_run_the_script():
    out = subprocess.run(
        ["make", "-n", "cluster", "cluster-down", "STAMP=Makefile", "CLUSTER_PORT=8123"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "scripts/cluster.py up --port 8123" in out
    assert "scripts/cluster.py down" in out


def test_down_without_a_cluster_says_so(tmp_path):
    result = _run("down", tmp_path=tmp_path)
    assert result.returncode == 0 and "no cluster is running" in result.stdout


def test_up_where_the_node_cannot_run_says_why(tmp_path):
    result = _run("up", "--port", "0", tmp_path=tmp_path, SANDBOX_SKIP_NODE="1")
    assert result.returncode == 2
    assert "make cluster cannot run here: SANDBOX_SKIP_NODE is set" in result.stderr
    assert not (tmp_path / "pid").exists()


def test_kubectl_without_a_cluster_says_so(tmp_path):
    # kubectl's own flags pass through (not taken for the script's).
    result = _run("kubectl", "-n", "sandbox-workspace", "get", "pods", tmp_path=tmp_path)
    assert result.returncode == 1 and "no cluster is running: make cluster" in result.stderr
