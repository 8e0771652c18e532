"""A TCP port for a server that a test starts and that binds by number (no socket can be
handed to it, nor its own port read back).

The old way, ``bind(("127.0.0.1", 0))`` then close and pass the number on, raced: that
port is in the kernel's ephemeral range, where every other process's ``bind(0)`` and
every outgoing connection's local port are drawn too, so between the probe and the
server's own bind (a process spawned in between: hundreds of milliseconds on a loaded
machine) anyone could take it, and the server failed to start. ``free_port`` draws below
that range instead, where only a process binding that very number can take it: at
random, from the pytest worker's own share of the range (two workers never draw the
same number), never the same port twice in one process, and probed free. 20000-29999:
above the fixed ports of the node tier's kubelet and friends (102xx), below Kubernetes'
NodePorts (30000-32767).
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

_RANGE = range(20000, 30000)
_given: set[int] = set()
_draw = random.Random()  # its own: a test seeding `random` must not pin our draws


def _ephemeral() -> range:
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def _share() -> tuple[int, int]:
    """This pytest worker's residue class (modulus, residue): each of the test command's
    workers draws from its own, so two workers never probe the same number at once."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1))
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    return count, index % count


def free_port(host: str = "127.0.0.1") -> int:
    """A port no socket holds now, outside the ephemeral range (see the module)."""
    ephemeral = _ephemeral()
    count, index = _share()
    candidates = [
        p for p in _RANGE if p % count == index and p not in ephemeral and p not in _given
    ]
    for port in _draw.sample(candidates, min(200, len(candidates))):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _given.add(port)
        return port
    raise RuntimeError(f"no free port in {_RANGE} outside the ephemeral range {ephemeral}")
