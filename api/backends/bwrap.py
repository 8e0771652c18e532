"""bubblewrap wrapping for the local backend: a session's runtime sees its workspace at
``/workspace``, exactly as in a pod, and little else.

Contract of ``bwrap_argv``: the returned prefix runs a command with
- the host's top-level directories read-only (so the interpreter and libraries work),
  ``/tmp`` private and writable, ``/proc`` and ``/dev`` fresh;
- the data directory hidden behind an empty tmpfs (other sessions are invisible), except
  the session's run directory (the runtime's port file) and its workspace bound at
  ``/workspace`` — never the session's record (``session.json``, which holds its egress
  policy and is read back when the API starts: code that could write it, where Landlock
  is missing, would choose its own policy);
- its own PID, IPC and UTS namespaces, dying with its parent;
- ``extra`` options before the command: the local backend's egress namespaces add
  ``--unshare-net`` and their socket directories (``local_egress``); without them the
  host network, where the API reaches the runtime on 127.0.0.1.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

SANDBOX_WORKSPACE = "/workspace"
_SKIP = {"proc", "dev", "tmp", "workspace", "lost+found"}


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def bwrap_argv(
    bwrap: str,
    *,
    data_dir: Path,
    run_dir: Path,
    workspace: Path,
    keep_visible: list[Path] | None = None,
    extra: list[str] | None = None,
) -> list[str]:
    argv = [bwrap, "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
    for entry in sorted(os.listdir("/")):
        path = Path("/") / entry
        if entry in _SKIP:
            continue
        if path.is_symlink():
            argv += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            argv += ["--ro-bind", str(path), str(path)]
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    # The interpreter and our package may live under /tmp (a CI clone): show them again.
    for path in keep_visible or default_visible():
        argv += ["--ro-bind", str(path), str(path)]
    argv += ["--tmpfs", str(data_dir)]
    argv += ["--bind", str(run_dir), str(run_dir)]
    argv += ["--bind", str(workspace), SANDBOX_WORKSPACE, *(extra or [])]
    argv += ["--chdir", SANDBOX_WORKSPACE, "--"]
    return argv


def default_visible() -> list[Path]:
    import sandbox_workspace

    package_root = Path(sandbox_workspace.__file__).resolve().parents[1]
    paths = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), package_root}
    return sorted(p for p in paths if p.exists())
