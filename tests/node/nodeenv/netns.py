"""Running the node tier inside namespaces of its own, and reporting it in the calling
pytest session (test helper).

``command(argv)`` wraps a command in ``unshare --net --mount --pid --fork``: a private
network namespace (only ``lo``, brought up; nothing reaches the machine's network), a
private mount namespace (``mount --make-rprivate /``: kubelet and containerd mounts stay
inside) and a PID namespace whose end kills every process of the run — containerd
shims and containers included. ``bash`` is its PID 1 (it reaps orphans).

The pytest side: the calling session does not run node tests itself. The first node
test starts ONE inner pytest session over all selected node tests inside the namespace
(``InnerSession.run``); the inner session writes each test report as a JSON line
(``ReportWriter``, pytest's own report serialisation, as pytest-xdist does), and the
calling session replays them (``InnerSession.replay``) — so pass/fail/skip, longreprs
and durations appear as if the tests ran there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _pytest.reports import TestReport

from .network import NETNS_ENV

REPORTS_ENV = "SANDBOX_NODE_REPORTS"
UNSHARE = ["unshare", "--net", "--mount", "--pid", "--fork", "--mount-proc", "--kill-child"]
# bash stays PID 1 (no exec of the last command: the `; exit` keeps it) and reaps orphans.
PRELUDE = 'mount --make-rprivate / && ip link set lo up && "$@"; exit $?'


def command(argv: list[str]) -> list[str]:
    return [*UNSHARE, "--", "bash", "-c", PRELUDE, "bash", *argv]


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, NETNS_ENV: "1", **extra}


def unavailable() -> str | None:
    """Why this machine cannot make the namespaces (None when it can)."""
    if os.geteuid() != 0:
        return "needs root (unshare --net --mount --pid, a kubelet, containerd)"
    try:
        probe = subprocess.run(
            command(["true"]), capture_output=True, text=True, timeout=30, check=False
        )
    except FileNotFoundError as exc:
        return f"cannot make a private namespace: {exc}"
    if probe.returncode != 0:
        return f"cannot make a private namespace (unshare): {probe.stderr.strip()[-300:]}"
    return None


class ReportWriter:
    """Inner-session plugin: every test report as one JSON line in $SANDBOX_NODE_REPORTS."""

    def __init__(self, config: pytest.Config, path: Path):
        self.config, self.path = config, path

    def pytest_runtest_logreport(self, report: TestReport) -> None:
        data = self.config.hook.pytest_report_to_serializable(config=self.config, report=report)
        with open(self.path, "a") as out:
            out.write(json.dumps(data) + "\n")


class InnerSession:
    """One pytest session over ``nodeids`` inside the namespaces; its reports by node id."""

    def __init__(
        self,
        config: pytest.Config,
        nodeids: list[str],
        workdir: Path,
        timeout: float,
        extra_env: dict[str, str],
    ):
        self.config, self.nodeids, self.workdir = config, nodeids, workdir
        self.extra_env = extra_env
        self.timeout = timeout
        self.log = workdir / "inner-session.log"
        self.reports_file = workdir / "reports.jsonl"
        self.reports: dict[str, list[TestReport]] = {}
        self.failure = ""

    def run(self) -> InnerSession:
        self.workdir.mkdir(parents=True, exist_ok=True)
        argv = [
            sys.executable,
            "-m",
            "pytest",
            *self.nodeids,
            "-p",
            "no:cacheprovider",
            f"--basetemp={self.workdir / 'tmp'}",
            "-v",
            "--durations=12",  # where the tier's time goes, in the inner log
        ]
        with open(self.log, "wb") as log:
            proc = subprocess.Popen(
                command(argv),
                cwd=self.config.rootpath,
                env=env(**self.extra_env, **{REPORTS_ENV: str(self.reports_file)}),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                rc = proc.wait(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                proc.kill()  # unshare --kill-child: the whole namespace dies with it
                proc.wait()
                rc = None
        if rc is None:
            self.failure = f"the node tier's inner session exceeded {self.timeout:.0f}s"
        elif rc not in (0, 1, 5):
            self.failure = f"the node tier's inner session exited with {rc}"
        self._load()
        return self

    def _load(self) -> None:
        if not self.reports_file.exists():
            return
        for line in self.reports_file.read_text().splitlines():
            data: dict[str, Any] = json.loads(line)
            report = self.config.hook.pytest_report_from_serializable(config=self.config, data=data)
            if isinstance(report, TestReport):
                self.reports.setdefault(report.nodeid, []).append(report)

    def log_tail(self, chars: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def replay(self, item: pytest.Item) -> None:
        """Report ``item`` in this session as the inner session reported it."""
        hook = item.ihook
        hook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        reports = self.reports.get(item.nodeid)
        if not reports:
            why = self.failure or "the inner session produced no result for it"
            reports = [
                TestReport(
                    item.nodeid,
                    item.location,
                    {k: 1 for k in item.keywords},
                    "failed",
                    f"{why} (log: {self.log})\n{self.log_tail()}",
                    "call",
                )
            ]
        for report in reports:
            hook.pytest_runtest_logreport(report=report)
        hook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
