"""A cgroup root of the node tier's own (test helper).

The kubelet (cgroupfs driver, cgroup v1 here) creates ``kubepods`` below its
``cgroupRoot``, which must exist. Cgroups are not namespaced by the tier's unshare, so
each run gets ``/<name>`` in every v1 hierarchy, and removes it — kills what is left in
it, then removes the directories deepest first — at teardown.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

CGROUP_FS = Path("/sys/fs/cgroup")


class CgroupRoot:
    def __init__(self, name: str):
        self.name = name

    def hierarchies(self) -> list[Path]:
        """Mounted v1 hierarchies (the v2 ``unified`` mount is not the kubelet's)."""
        found = []
        for line in Path("/proc/self/mounts").read_text().splitlines():
            fields = line.split()
            if fields[2] == "cgroup" and fields[1].startswith(str(CGROUP_FS) + "/"):
                found.append(Path(fields[1]))
        return found

    def create(self) -> None:
        for hierarchy in self.hierarchies():
            path = hierarchy / self.name
            path.mkdir(exist_ok=True)
            if (hierarchy / "cpuset.cpus").exists():
                # A new v1 cpuset is empty: inherit the parent's CPUs and memory nodes.
                for key in ("cpuset.cpus", "cpuset.mems"):
                    (path / key).write_text((hierarchy / key).read_text())

    def remove(self, timeout: float = 10.0) -> None:
        for hierarchy in self.hierarchies():
            root = hierarchy / self.name
            if not root.exists():
                continue
            deadline = time.monotonic() + timeout
            while root.exists() and time.monotonic() < deadline:
                dirs = sorted(
                    (Path(d) for d, _, _ in os.walk(root)), key=lambda p: len(p.parts), reverse=True
                )
                for d in dirs:
                    with contextlib.suppress(OSError):
                        for pid in (d / "cgroup.procs").read_text().split():
                            with contextlib.suppress(ProcessLookupError):
                                os.kill(int(pid), signal.SIGKILL)
                    with contextlib.suppress(OSError):
                        d.rmdir()
                if root.exists():
                    time.sleep(0.1)
