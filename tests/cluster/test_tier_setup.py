"""The cluster tier never disappears silently: without Go (and without cached
binaries) its tests are reported as skipped, with the reason."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_cluster_tests_skip_with_reason_without_go(tmp_path: Path):
    env = {
        **os.environ,
        "GO": str(tmp_path / "no-go-here"),
        "SANDBOX_KUBE_CACHE": str(tmp_path / "empty-cache"),
    }
    env.pop("SANDBOX_SKIP_CLUSTER", None)
    target = f"{HERE / 'test_control_plane.py'}::test_control_plane_serves_on_loopback"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", target],
        cwd=HERE.parents[1],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "1 skipped" in out, out
    assert "SKIPPED" in out and "needs Go" in out, out
