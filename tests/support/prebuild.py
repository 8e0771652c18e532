"""The heavy tiers' builds in the background, and the order the tiers run in.

Why: on a new machine the Go builds (etcd, the control plane, kubelet; helm and
kubeconform) and the images take over ten minutes. Run before the first test, as the tiers
did, they add all of that to the run; run beside the light tiers (unit, api, clients,
browser), which spend much of their time waiting on their own processes, they cost little.

Contract:
- ``order(items)`` sorts the collected items by tier, light tiers first (stable within a
  tier), so the heavy tiers come last and find their builds done.
- ``Prebuild.start(root, items)`` starts ``scripts/prebuild.sh`` under ``nice`` with the
  steps the selected heavy tiers need (none selected: nothing starts); its output goes to
  ``build/prebuild.log``.
- ``Prebuild.wait(item)`` blocks until every step the item's tier needs has ended. It is
  called from a ``pytest_runtest_protocol`` wrapper that runs *outside* pytest-timeout's
  timer, so a cold build never counts against a test's timeout. A failed step is not
  reported here: the tier runs its script again itself (seconds when cached; each
  script locks its cache) and fails or skips with the script's own words.
- ``Prebuild.stop()`` ends the builds at the session's end (an interrupted run).

SANDBOX_PREBUILD=0 turns it off (the tiers then build on first use, as before).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

# Tier of a test file: its directory under tests/, or the file itself at the top.
_RANK = {
    "unit": 0,
    "test_docs.py": 1,
    "store": 2,
    "egress": 2,  # the egress proxy on loopback: light, no build
    "api": 3,
    "clients": 4,
    "browser": 5,
    "kind": 6,  # a kind cluster of its own, where Docker exists (skipped here)
    "chart": 7,
    "cluster": 8,
    "test_bench.py": 9,
    "image": 10,
    "node": 11,
}
# What each heavy tier needs built (steps of scripts/prebuild.sh).
NEEDS = {
    "chart": ("tools",),
    "image": ("images",),
    "cluster": ("tools", "kube"),  # test_chart_rbac.py renders the chart with helm
    "test_bench.py": ("kube",),
    "node": ("tools", "kube", "images"),
}
STEPS = ("tools", "kube", "images")
# Past this the tier goes on and runs its script itself, which waits on the script's lock.
WAIT_LIMIT = 2400.0


def tier(item: pytest.Item, tests_root: Path) -> str:
    try:
        rel = Path(str(item.path)).resolve().relative_to(tests_root)
    except ValueError:
        return ""
    return rel.parts[0] if rel.parts else ""


def order(items: list[pytest.Item], tests_root: Path) -> None:
    items.sort(key=lambda item: _RANK.get(tier(item, tests_root), 5))


class Prebuild:
    def __init__(self, repo: Path) -> None:
        self.repo = repo
        self.tests_root = repo / "tests"
        self.dir = repo / "build" / "prebuild"
        self.log = repo / "build" / "prebuild.log"
        self.proc: subprocess.Popen | None = None
        self.steps: tuple[str, ...] = ()
        self.started = 0.0

    def start(self, items: list[pytest.Item]) -> None:
        if os.environ.get("SANDBOX_PREBUILD", "1") == "0" or self.proc is not None:
            return
        wanted = {
            step
            for item in items
            if not item.get_closest_marker("skip")
            for step in NEEDS.get(tier(item, self.tests_root), ())
        }
        self.steps = tuple(s for s in STEPS if s in wanted)
        if not self.steps:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        for step in STEPS:
            (self.dir / f"{step}.rc").unlink(missing_ok=True)
        self.started = time.monotonic()
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                [
                    "nice",
                    "-n",
                    "10",
                    "bash",
                    str(self.repo / "scripts" / "prebuild.sh"),
                    str(self.dir),
                    *self.steps,
                ],
                cwd=self.repo,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def _ended(self, step: str) -> bool:
        return (self.dir / f"{step}.rc").exists() or (
            self.proc is not None and self.proc.poll() is not None
        )

    def wait(self, item: pytest.Item) -> None:
        steps = [s for s in NEEDS.get(tier(item, self.tests_root), ()) if s in self.steps]
        pending = [s for s in steps if not self._ended(s)]
        if not pending:
            return
        since = time.monotonic()
        sys.stderr.write(
            f"\n[prebuild] {item.nodeid} waits for {', '.join(pending)} "
            f"(started {since - self.started:.0f} s ago; log: {self.log})\n"
        )
        deadline = since + WAIT_LIMIT
        while not all(self._ended(s) for s in pending) and time.monotonic() < deadline:
            time.sleep(1)  # a build of minutes, polled each second
        sys.stderr.write(f"[prebuild] waited {time.monotonic() - since:.0f} s\n")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
