"""Watching a process under attack (test support): its peak RSS growth since the watch
began (``VmHWM`` in /proc/PID/status), checked against a bound."""

from __future__ import annotations

from pathlib import Path

RSS_GROWTH_LIMIT = 48 * 1024 * 1024


def status_field(pid: int, name: str) -> int:
    """A size field of /proc/PID/status (VmRSS, VmHWM …), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {name} in /proc/{pid}/status")


class PeakWatch:
    """``PeakWatch(pids)``; ``check()`` asserts no peak RSS grew by ``limit`` or more."""

    def __init__(self, *pids: int, limit: int = RSS_GROWTH_LIMIT) -> None:
        self.limit = limit
        self.start = {pid: status_field(pid, "VmHWM") for pid in pids}

    def check(self) -> None:
        for pid, start in self.start.items():
            growth = status_field(pid, "VmHWM") - start
            assert growth < self.limit, f"pid {pid}: peak RSS grew {growth >> 20} MiB"
