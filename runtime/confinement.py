"""How executed code is started: limits and isolation around every process we spawn for it.

Contract: ``Confinement.wrap(argv)`` returns the argv to spawn instead, and
``after_spawn(pid)`` applies what cannot be set before. What is applied depends on what
this machine allows, decided once at start-up and reported by ``describe``:

- ``pids cgroup`` (a writable cgroup-v1 ``pids`` hierarchy, e.g. a root runtime on a
  development machine): every process of executed code joins one cgroup of this runtime
  with ``pids.max`` — a fork bomb hits the ceiling instead of the machine's pid table. The
  process joins *before* exec, through ``sh -c 'echo $$ > cgroup.procs; exec …'``, so no
  child escapes the limit.
- ``pid namespace`` (root with util-linux ``unshare``): code gets its own PID namespace
  and ``/proc``, so it cannot see the runtime's process (its environment holds the bearer
  token) and killing the namespace's first process reliably ends everything in it.
- ``setpriv --pdeathsig`` (util-linux): executed code dies with the runtime even when the
  runtime is SIGKILLed, so no interpreter outlives it.
- ``RLIMIT_NPROC`` (non-root, as in a pod): set right after spawn; the pod's own pid limit
  and ``PR_SET_DUMPABLE=0`` on the runtime (see ``harden_runtime_process``) do the rest.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import shutil
import time
from pathlib import Path

_PR_SET_DUMPABLE = 4
_CGROUP_V1_PIDS = Path("/sys/fs/cgroup/pids")


def harden_runtime_process() -> None:
    """Make /proc/<runtime>/environ and friends unreadable to same-uid processes."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)


class Confinement:
    def __init__(self, *, max_processes: int, mode: str = "auto") -> None:
        self.max_processes = max_processes
        self.root = os.geteuid() == 0
        enabled = mode != "none"
        self.cgroup = self._make_cgroup() if enabled and self.root else None
        self.unshare = shutil.which("unshare") if enabled and self.root else None
        self.setpriv = shutil.which("setpriv") if enabled else None

    def _make_cgroup(self) -> Path | None:
        if not os.access(_CGROUP_V1_PIDS, os.W_OK):
            return None
        parent = _CGROUP_V1_PIDS / "sandbox-workspace"
        path = parent / f"runtime-{os.getpid()}"
        _remove_stale(parent)
        try:
            path.mkdir(parents=True, exist_ok=True)
            (path / "pids.max").write_text(str(self.max_processes))
        except OSError:
            return None
        return path

    def describe(self) -> list[str]:
        parts = []
        if self.cgroup:
            parts.append(f"pids cgroup (max {self.max_processes})")
        if self.unshare:
            parts.append("pid namespace")
        if not self.root:
            parts.append(f"RLIMIT_NPROC {self.max_processes}")
        return parts or ["none"]

    def wrap(self, argv: list[str]) -> list[str]:
        if self.unshare:
            argv = [self.unshare, "--pid", "--fork", "--mount-proc", "--kill-child", *argv]
        if self.setpriv:
            # If the runtime is killed outright, its code processes must die with it.
            argv = [self.setpriv, "--pdeathsig", "KILL", "--", *argv]
        if self.cgroup:
            argv = [
                "/bin/sh",
                "-c",
                'echo $$ > "$0/cgroup.procs" && exec "$@"',
                str(self.cgroup),
                *argv,
            ]
        return argv

    def after_spawn(self, pid: int) -> None:
        if not self.root:
            limit = (self.max_processes, self.max_processes)
            with contextlib.suppress(OSError, ValueError):
                resource.prlimit(pid, resource.RLIMIT_NPROC, limit)

    def close(self) -> None:
        if self.cgroup is None:
            return
        # Killed processes leave the cgroup a moment after their parent was reaped.
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            try:
                self.cgroup.rmdir()
                return
            except OSError:
                time.sleep(0.01)


def _remove_stale(parent: Path) -> None:
    """cgroups of runtimes that died without cleaning up (their pid is gone, no members)."""
    if not parent.is_dir():
        return
    for child in parent.glob("runtime-*"):
        pid = child.name.removeprefix("runtime-")
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            with contextlib.suppress(OSError):
                child.rmdir()
