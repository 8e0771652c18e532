"""Run a program written with an E2B SDK in a process of its own; its JSON report.

The program prints one JSON line last (its report); only the environment given (E2B's
variables, PATH, HOME) reaches it, so nothing of Sandbox Workspace configures it.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path


def e2b_env(url: str, key: str, home: Path | None = None) -> dict[str, str]:
    """E2B's three variables for a server at ``url`` (and what any process needs: PATH,
    HOME — ours unless ``home``): no Sandbox Workspace setting."""
    return {
        "PATH": os.environ["PATH"],
        "HOME": str(home) if home else os.environ.get("HOME", "/tmp"),
        "E2B_API_URL": f"{url}/e2b",
        "E2B_SANDBOX_URL": f"{url}/e2b/envd",
        "E2B_API_KEY": key,
    }


def run_program(argv: list[str], env: dict[str, str], cwd: Path, timeout: float = 120) -> dict:
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# Program text: calls of the SDK's ``sbx`` that docs/e2b.md lists as answering "not
# supported"; each one's error (or "answered") lands in ``report["unsupported"]``.
UNSUPPORTED_CALLS = r"""
unsupported = {}
for name, call in [
    ("pause", lambda: sbx.pause()),
    ("create_snapshot", lambda: sbx.create_snapshot()),
    ("fork", lambda: sbx.fork()),
    ("get_metrics", lambda: sbx.get_metrics()),
    ("run_code_r", lambda: sbx.run_code("1", language="r")),
]:
    try:
        call()
        unsupported[name] = "answered"
    except Exception as e:
        unsupported[name] = f"{type(e).__name__}: {e}"
report["unsupported"] = unsupported
"""
