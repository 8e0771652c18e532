"""What every benchmark shares: servers started like a user starts them, and statistics."""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

# A file listing the work directories a run inside a private namespace made, for the
# outer run to remove once the namespace (and every mount made in it) is gone.
WORKDIRS_ENV = "SANDBOX_BENCH_WORKDIRS"


def note_workdir(path: Path) -> None:
    """Inside a namespaced run: ``path`` is removed by the outer run after it ends."""
    if listing := os.environ.get(WORKDIRS_ENV):
        with open(listing, "a") as f:
            f.write(f"{path}\n")


@contextmanager
def namespaced_scratch(prefix: str) -> Iterator[tuple[Path, dict[str, str]]]:
    """A directory for a namespaced run's result and the environment naming its list of
    work directories; afterwards both go, and every listed directory that is a
    ``sbw-bench-`` directory of the temporary directory with nothing mounted under it
    (a node's data: ~80 MB a run, left in /tmp by every run before)."""
    top = Path(tempfile.mkdtemp(prefix=prefix))
    listing = top / "workdirs"
    try:
        yield top, {WORKDIRS_ENV: str(listing)}
    finally:
        named = listing.read_text().split() if listing.exists() else []
        mountpoints = [m.split()[4] for m in Path("/proc/self/mountinfo").read_text().splitlines()]
        for path in map(Path, named):
            if removable(path, mountpoints):
                shutil.rmtree(path, ignore_errors=True)
            else:
                print(f"bench: left {path} (not a bench directory, or still mounted)")
        shutil.rmtree(top, ignore_errors=True)


def removable(path: Path, mountpoints: list[str]) -> bool:
    """A ``sbw-bench-`` directory right in the temporary directory, nothing mounted in it."""
    if path.parent != Path(tempfile.gettempdir()) or not path.name.startswith("sbw-bench-"):
        return False
    inside = str(path) + "/"
    return not any((point + "/").startswith(inside) for point in mountpoints)


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


@dataclass
class Figure:
    """One measured quantity beside its same-run baseline."""

    name: str
    unit: str
    p50: float
    p99: float
    baseline_name: str
    baseline_p50: float
    baseline_p99: float
    goal: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return self.p50 / self.baseline_p50 if self.baseline_p50 else float("nan")

    @classmethod
    def of(
        cls,
        name: str,
        unit: str,
        samples: list[float],
        baseline_name: str,
        baseline: list[float],
        goal: str = "",
        **extra,
    ) -> Figure:
        return cls(
            name,
            unit,
            statistics.median(samples),
            percentile(samples, 99),
            baseline_name,
            statistics.median(baseline),
            percentile(baseline, 99),
            goal,
            {"n": len(samples), "baseline_n": len(baseline), **extra},
        )


@dataclass
class Server:
    url: str
    pid: int
    data_dir: Path


def wait_for_port(proc: subprocess.Popen, port_file: Path, what: str) -> int:
    """The port a child process wrote to ``port_file`` once it listens (30 s at most)."""
    deadline = time.monotonic() + 30
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start")
        time.sleep(0.02)
    return int(port_file.read_text())


@contextmanager
def dev_server(**env: str) -> Iterator[Server]:
    """A real ``sandbox-workspace dev`` on a free loopback port; stopped afterwards."""
    with tempfile.TemporaryDirectory(prefix="sbw-bench-") as tmp:
        port_file = Path(tmp) / "port"
        clean = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_")}
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sandbox_workspace",
                "dev",
                "--data-dir",
                str(Path(tmp) / "data"),
                "--port",
                "0",
                "--port-file",
                str(port_file),
            ],
            env={**clean, "SANDBOX_WORKSPACE_LOG_LEVEL": "warning", **env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            url = f"http://127.0.0.1:{wait_for_port(proc, port_file, 'dev server')}"
            while True:
                try:
                    httpx.get(url + "/healthz")
                    break
                except httpx.TransportError:
                    time.sleep(0.02)
            yield Server(url=url, pid=proc.pid, data_dir=Path(tmp) / "data")
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def timed(fn, repeat: int) -> list[float]:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def real_python() -> str:
    """The interpreter binary itself (not a pyenv shim that adds its own start-up)."""
    return os.path.realpath(sys.executable)


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def record_run(results: Path, keep: bool, measure: Callable[[], dict], **fields) -> dict:
    """A floor bench's run: ``measure()``'s medians beside ``fields``, the start (UTC) and
    the load average at start and end (the machine is shared), printed, and written to
    ``results`` when ``keep`` (a smoke-sized run is not the figure)."""
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    load = os.getloadavg()
    medians = measure()
    record = {
        "started": started,
        "load_at_start": [round(x, 2) for x in load],
        "load_at_end": [round(x, 2) for x in os.getloadavg()],
        "machine_cpus": os.cpu_count(),
        **fields,
        "medians": medians,
    }
    print(json.dumps(record, indent=2))
    if keep:
        results.write_text(json.dumps(record, indent=2) + "\n")
    return record


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def runtime_pid(data_dir: Path) -> int:
    """The runtime process serving a session under ``data_dir``."""
    needle = str(data_dir).encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"sandbox_workspace\0runtime" in cmdline and needle in cmdline:
                return int(entry.name)
    raise LookupError("no runtime process found")
