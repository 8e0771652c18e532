"""Addressing one process, not a pid number: a pid is reused once its process is reaped.

Contract:
- ``start_time(pid)``: when the process now holding ``pid`` started (clock ticks since
  boot, ``/proc/PID/stat`` field 22), or None when no process holds it. A pid and its
  start time name one process for good: a later holder of the pid started later.
- ``send_signal(pid, started, number)`` signals the process ``(pid, started)`` and
  answers True, or answers False (and signals nothing) when that process is gone — its
  pid free or another process's. Race-free where the kernel has pidfds (Linux 5.3+): the
  pidfd is opened first and pins one process, the start time then says whether it is
  the right one; without pidfds the check and ``kill`` leave a window of microseconds,
  not the seconds a pid can now be stale.
"""

from __future__ import annotations

import os
import signal


def start_time(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        # The command name may hold spaces and parentheses: fields start after the last ')'
        # (the state, field 3, is the first; the start time is field 22).
        return int(stat.rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def send_signal(pid: int, started: int | None, number: int) -> bool:
    fd = None
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except OSError:  # no pidfds here (ENOSYS), or refused: the check alone
        fd = None
    try:
        if started is None or start_time(pid) != started:
            return False
        if fd is None:
            os.kill(pid, number)
        else:
            signal.pidfd_send_signal(fd, number)
        return True
    except ProcessLookupError:
        return False
    finally:
        if fd is not None:
            os.close(fd)
