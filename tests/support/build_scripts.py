"""Running the project's Go build scripts (scripts/build-kube.sh, scripts/build-tools.sh)
from test fixtures: finding Go the way the scripts do, and streaming their progress."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import IO

GO_MISSING_EXIT = 3  # what scripts/lib/go-build.sh exits with when there is no Go


def find_go() -> str | None:
    if os.environ.get("GO"):
        return os.environ["GO"] if os.access(os.environ["GO"], os.X_OK) else None
    found = shutil.which("go")
    if found:
        return found
    return "/usr/local/go/bin/go" if os.access("/usr/local/go/bin/go", os.X_OK) else None


def run_build_script(script: Path, cwd: Path, stream: IO[str] | None = None) -> tuple[int, str]:
    """Run ``bash script``, echoing its output to ``stream``; (exit code, last 40 lines)."""
    proc = subprocess.Popen(
        ["bash", str(script)], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    tail: list[str] = []
    for line in proc.stdout:
        tail = [*tail[-40:], line]
        if stream is not None:
            stream.write(line)
            stream.flush()
    return proc.wait(), "".join(tail)
