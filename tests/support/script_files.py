"""``script_files(root_pid)``: the large-script memfds (``runtime/bash_script.py``) open
anywhere in a process tree — the server, its runtimes, their spawners, reapers, code."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def script_files(root_pid: int) -> list[str]:
    """Each as "pid:fd"."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry.name))
    found, todo = [], [root_pid]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    if "sbw-script" in os.readlink(fd):
                        found.append(f"{pid}:{fd.name}")
    return found
