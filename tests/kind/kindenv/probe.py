"""Can the kind tier run here? A real probe, not a guess: pytest-kind importable, a
``docker`` client, and a daemon that answers ``docker version``."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def kind_skip_reason() -> str | None:
    """Why the kind tier cannot run on this machine, or None when it can."""
    if os.environ.get("SANDBOX_SKIP_KIND", "") not in ("", "0"):
        return "SANDBOX_SKIP_KIND is set: kind tier disabled"
    if importlib.util.find_spec("pytest_kind") is None:
        return "pytest-kind is not installed (pip install 'pytest-kind>=22.11')"
    docker = shutil.which("docker")
    if docker is None:
        return "no Docker engine: no `docker` command on PATH (kind runs its nodes in Docker)"
    try:
        probe = subprocess.run(
            [docker, "version", "--format", "{{.Server.Version}}"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except subprocess.TimeoutExpired:
        return "no Docker engine: `docker version` got no answer from the daemon in 30 s"
    if probe.returncode != 0 or not probe.stdout.strip():
        detail = _last_line(probe.stderr or probe.stdout)
        return f"no Docker engine: `docker version` cannot reach a daemon ({detail})"
    return None
