"""CPU weight per conversation where a cgroup-v1 ``cpu`` hierarchy is writable (a root
runtime on a development machine; never in a sandbox pod, which has no CAP_SYS_ADMIN).

Why: without it, a conversation that spins on every core gets a share of the CPU per
process, so four spinning processes outweigh a neighbour's one interpreter four to one.
With one ``cpu`` cgroup per conversation (equal ``cpu.shares``), the scheduler shares
the CPU between conversations first, then between each one's processes.

Contract: ``CpuGroups.create()`` → an instance, or None when the hierarchy is not
writable; ``path(cid)`` makes (once) and returns the conversation's cgroup, which the
code process joins before exec (``reaper``; joining costs ~1 ms here); ``remove(cid)``
and ``close()`` remove what is empty (retrying briefly: killed processes leave a moment
after they are reaped). Cgroups of runtimes that died without cleaning up are removed.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from pathlib import Path

_HIERARCHY = Path("/sys/fs/cgroup/cpu")


class CpuGroups:
    def __init__(self, base: Path) -> None:
        self.base = base

    @classmethod
    def create(cls, hierarchy: Path = _HIERARCHY) -> CpuGroups | None:
        if os.geteuid() != 0 or not os.access(hierarchy, os.W_OK):
            return None
        parent = hierarchy / "sandbox-workspace"
        _remove_stale(parent)
        base = parent / f"runtime-{os.getpid()}"
        try:
            base.mkdir(parents=True, exist_ok=True)
        except OSError:
            return None
        return cls(base)

    def path(self, cid: str) -> str | None:
        group = self.base / hashlib.sha256(cid.encode()).hexdigest()[:16]
        try:
            group.mkdir(exist_ok=True)
        except OSError:
            return None
        return str(group)

    def remove(self, cid: str) -> None:
        _rmdir(self.base / hashlib.sha256(cid.encode()).hexdigest()[:16])

    def close(self) -> None:
        for group in self.base.iterdir() if self.base.is_dir() else ():
            if group.is_dir():
                _rmdir(group)
        _rmdir(self.base)


def _rmdir(path: Path, patience: float = 2.0) -> None:
    deadline = time.monotonic() + patience
    while path.exists():
        try:
            path.rmdir()
        except OSError:
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)


def _remove_stale(parent: Path) -> None:
    if not parent.is_dir():
        return
    for child in parent.glob("runtime-*"):
        pid = child.name.removeprefix("runtime-")
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            for group in child.iterdir():
                if group.is_dir():
                    with contextlib.suppress(OSError):
                        group.rmdir()
            with contextlib.suppress(OSError):
                child.rmdir()
