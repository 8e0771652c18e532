"""Running ``sandbox-workspace`` processes (operator, API) as real subprocesses in tests:
each in its own process group, logging to a file, stopped with SIGTERM then SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any of our settings, plus ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        # OTEL_*: a developer's own collector never receives the tests' spans.
        if not k.startswith(
            ("SANDBOX_WORKSPACE_", "SANDBOX_OPERATOR_", "SANDBOX_RUNTIME_", "OTEL_")
        )
    }
    env.update(extra)
    return env


def cli_command() -> list[str]:
    exe = Path(sys.executable).parent / "sandbox-workspace"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "sandbox_workspace"]


def start_cli(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [*cli_command(), *argv],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=log.parent,
            start_new_session=True,
        )


def stop(proc: subprocess.Popen, grace: float = 30.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
