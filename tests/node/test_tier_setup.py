"""The node tier never disappears silently: where it cannot run, its tests are reported
as skipped with the reason (these run in the calling session, not in the namespace)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TARGET = f"{HERE / 'test_node.py'}::test_node_is_ready_in_a_private_network"


def run_node_test(**env: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", TARGET],
        cwd=HERE.parents[1],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    return out


def test_node_tests_skip_with_reason_when_disabled():
    out = run_node_test(SANDBOX_SKIP_NODE="1")
    assert "1 skipped" in out and "SANDBOX_SKIP_NODE is set" in out, out


def test_node_tests_skip_with_reason_without_unshare(tmp_path: Path):
    # A PATH whose `unshare` cannot make namespaces (as in a container without
    # CAP_SYS_ADMIN): the reason says so.
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "unshare").write_text(
        "#!/bin/sh\necho 'unshare failed: Operation not permitted' >&2\nexit 1\n"
    )
    (fake / "unshare").chmod(0o755)
    out = run_node_test(SANDBOX_SKIP_NODE="", PATH=f"{fake}:{os.environ['PATH']}")
    if os.geteuid() != 0:
        assert "needs root" in out, out
    else:
        assert "cannot make a private namespace" in out and "Operation not permitted" in out, out
