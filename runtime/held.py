"""Disk blocks a process tree holds that no name reaches: files it opened and unlinked.

A file unlinked while open keeps its blocks until its last descriptor closes, and no walk
of the conversation's directories finds it. Code that lives on (the Python interpreter
between cells, a process of ``runtime/processes.py``) held 20 MiB so past an 8 MiB quota,
unseen (each file up to RLIMIT_FSIZE, as many as RLIMIT_NOFILE: the volume). The reaper
counts them with the walk (``limits.TreeWatch.check_disk``).

Contract: ``unlinked_blocks(pids, devices)`` → bytes of disk blocks of the regular files
with no link left that ``pids`` have open (``/proc/PID/fd``; each file once), on the
filesystems ``devices`` (``st_dev``: the conversation's — a memfd or another volume's file
is not its quota's). A process gone or unreadable meanwhile is skipped. Not counted: a
file only mapped (its descriptor closed) — ``/proc/PID/map_files`` needs privilege; the
files of a process that is not dumpable (``prctl(PR_SET_DUMPABLE, 0)``, the exec of a
binary it may not read), whose ``/proc/PID/fd`` is root's, where the reaper has no
CAP_SYS_PTRACE (a pod); those of processes of other calls (each reaper passes its own
tree). Both open: tests marked xfail in ``tests/unit/test_execution_limits.py``.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator


def unlinked_blocks(pids: list[int], devices: set[int]) -> int:
    seen: set[tuple[int, int]] = set()
    total = 0
    for st in (st for pid in pids for st in _open_files(pid)):
        key = (st.st_dev, st.st_ino)
        unlinked = st.st_nlink == 0 and st.st_dev in devices and stat.S_ISREG(st.st_mode)
        if unlinked and key not in seen:
            seen.add(key)
            total += st.st_blocks * 512
    return total


def _open_files(pid: int) -> Iterator[os.stat_result]:
    """What each descriptor of ``pid`` refers to (the open file itself, not a path)."""
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                yield os.stat(f"/proc/{pid}/fd/{fd}")
