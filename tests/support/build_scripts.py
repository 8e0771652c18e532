"""Running the project's Go build scripts (scripts/build-kube.sh, scripts/build-tools.sh)
from test fixtures: finding Go the way the scripts do, and streaming their progress."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
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


def build_with_go(
    script: Path,
    cwd: Path,
    *,
    present: Callable[[], bool],
    missing: type[Exception],
    what: str,
    stream: IO[str] | None = None,
) -> None:
    """Run ``script`` (seconds when its output is cached) until ``present()`` holds.

    Raises ``missing`` when nothing is cached and no Go toolchain exists (or the script
    says so), and RuntimeError with the log tail when the build fails.
    """
    if not present() and find_go() is None:
        raise missing(
            f"Go toolchain not found (no `go` on PATH or /usr/local/go/bin/go) and no cached {what}"
        )
    rc, tail = run_build_script(script, cwd, stream)
    if rc == GO_MISSING_EXIT:
        raise missing("".join(tail.splitlines(True)[-3:]).strip())
    if rc != 0 or not present():
        raise RuntimeError(f"scripts/{script.name} failed (exit {rc}):\n{tail}")
