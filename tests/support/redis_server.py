"""A throwaway Redis-protocol server on 127.0.0.1 (test and benchmark support).

``start_redis(workdir)`` runs ``valkey-server`` or ``redis-server`` (whichever is
installed; scripts/install-system-deps.sh installs Debian's redis-server) on a free
loopback port, with no persistence and its files under ``workdir``; ``stop()`` ends it.
``missing_reason()`` says why none can run here (tests skip with it), or None.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ports import free_port

_START_TIMEOUT = 20.0


def server_binary() -> str | None:
    return shutil.which("valkey-server") or shutil.which("redis-server")


def missing_reason() -> str | None:
    if server_binary() is None:
        return (
            "no Redis-protocol server: install Debian's redis-server (or valkey-server), "
            "which scripts/install-system-deps.sh does as root"
        )
    return None


@dataclass
class RedisServer:
    url: str
    port: int
    proc: subprocess.Popen

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def start_redis(workdir: Path) -> RedisServer:
    binary = server_binary()
    if binary is None:
        raise RuntimeError(missing_reason())
    workdir.mkdir(parents=True, exist_ok=True)
    for _ in range(5):  # a free port can be taken between probe and bind: try another
        port = free_port()
        proc = subprocess.Popen(
            [
                binary,
                "--bind", "127.0.0.1",
                "--port", str(port),
                "--save", "",
                "--appendonly", "no",
                "--dir", str(workdir),
                "--logfile", str(workdir / f"redis-{port}.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + _START_TIMEOUT
        while proc.poll() is None and time.monotonic() < deadline:
            if _answers(port):
                return RedisServer(url=f"redis://127.0.0.1:{port}/0", port=port, proc=proc)
            time.sleep(0.02)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    raise RuntimeError(f"{binary} did not start (see {workdir}/redis-*.log)")
