"""What an idle API and an idle runtime cost: CPU and wakeups, variants side by side.

    .venv/bin/python scripts/idle_cost.py [--seconds 20] [--samples 3] NAME=PYTHON [NAME=PYTHON ...]

Each variant is an interpreter with its own install of the project (``main=/work/main/
.venv/bin/python``, ``branch=.venv/bin/python``): a ``dev`` API each, started at the same
time on the same machine, one session each, then measured twice — its runtime with no
interpreter, and with one left idle after ``1 + 1``. CPU is utime + stime from /proc;
wakeups are voluntary context switches of every thread (each sleep that ends is one).
Only the processes this script started are read. Results in docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from sandbox_workspace.runtime.limits import descendants

_TICK = os.sysconf("SC_CLK_TCK")


def _sample(pids: list[int]) -> tuple[int, int]:
    """(CPU clock ticks, voluntary context switches) of ``pids`` so far."""
    cpu = switches = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            cpu += int(fields[11]) + int(fields[12])
            for tid in os.listdir(f"/proc/{pid}/task"):
                for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
                    if line.startswith("voluntary_ctxt_switches:"):
                        switches += int(line.split()[1])
        except OSError:
            continue
    return cpu, switches


def _call(url: str, body: dict | None = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as r:
        return json.loads(r.read())


def _start(name: str, python: str, base: Path) -> tuple[subprocess.Popen, str]:
    d = base / name
    d.mkdir()
    listen = ["--host", "127.0.0.1", "--port", "0", "--port-file", str(d / "port")]
    proc = subprocess.Popen(
        [python, "-m", "sandbox_workspace", "dev", *listen, "--data-dir", str(d / "data")],
        stdout=(d / "log").open("w"),
        stderr=subprocess.STDOUT,
        env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"),
        cwd=d,  # never a checkout: ``-m sandbox_workspace`` would import its package from there
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while not (d / "port").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{name} did not start: {(d / 'log').read_text()}")
        time.sleep(0.1)
    return proc, f"http://127.0.0.1:{int((d / 'port').read_text())}"


def _measure(label: str, procs: dict[str, subprocess.Popen], seconds: float) -> None:
    sets = {}
    for name, proc in procs.items():
        sets[f"{name} API"] = [proc.pid]
        sets[f"{name} runtime"] = descendants(proc.pid)
    before = {k: _sample(v) for k, v in sets.items()}
    began = time.monotonic()
    time.sleep(seconds)
    after = {k: _sample(v) for k, v in sets.items()}
    spent = time.monotonic() - began
    load = os.getloadavg()[0]
    for k in sets:
        cpu = 100 * (after[k][0] - before[k][0]) / _TICK / spent
        wakeups = (after[k][1] - before[k][1]) / spent
        print(
            f"| {label} | {k} | {cpu:.2f} % | {wakeups:.1f} | {load:.2f} |",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("variants", nargs="+", metavar="NAME=PYTHON")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--samples", type=int, default=3)
    args = parser.parse_args()
    variants = dict(v.split("=", 1) for v in args.variants)
    procs: dict[str, subprocess.Popen] = {}
    with tempfile.TemporaryDirectory(prefix="idle-cost-") as tmp:
        try:
            urls = {}
            for name, python in variants.items():
                procs[name], urls[name] = _start(name, python, Path(tmp))
            for url in urls.values():
                _call(url + "/api/v1/sessions", {})
            for url in urls.values():
                while _call(url + "/api/v1/sessions/sb-session-dev")["status"] != "running":
                    time.sleep(0.2)
            print("| state | process | CPU (of a core) | wakeups/s | load (1 min) |")
            print("|---|---|---|---|---|")
            time.sleep(3)
            for _ in range(args.samples):
                _measure("no interpreter", procs, args.seconds)
            for url in urls.values():
                code = {"conversation_id": "c", "language": "python", "code": "1 + 1"}
                _call(url + "/api/v1/sessions/sb-session-dev/execute", code)
            time.sleep(3)
            for _ in range(args.samples):
                _measure("an idle interpreter", procs, args.seconds)
        finally:
            for proc in procs.values():
                proc.send_signal(signal.SIGINT)
            for proc in procs.values():
                proc.wait(30)


if __name__ == "__main__":
    main()
