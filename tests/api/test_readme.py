"""The README's curl walk-through, run verbatim against a fresh `sandbox-workspace dev`."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from doc_blocks import README, shell_block


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_readme_walkthrough_works_as_written(start_server, tmp_path):
    server = start_server("dev", "--data-dir", "data")
    script = shell_block(README, "walkthrough")
    assert "http://127.0.0.1:8000" in script
    script = script.replace("http://127.0.0.1:8000", server.url)
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert '"status":"pending"' in out or '"status":"running"' in out
    workspace = server.workdir / "data" / "sessions" / "sb-session-alice" / "workspace"
    # What a newcomer gets: /workspace as in a pod where bubblewrap is installed.
    shown = "/workspace" if shutil.which("bwrap") else str(workspace)
    assert f'"path":"{shown}/conv456/uploads/temparea/weather.csv"' in out
    assert '"status":"running"' in out
    assert '"files":["weather.csv"]' in out  # names; "items" the files (seed 000 §6.3)
    assert "identical" in out
    assert '"status":"deleted"' in out
    assert '"deleted":true' in out
    assert not workspace.exists(), "deleting the session must remove its files"
