"""The heavy tiers' builds in the background, the order the tiers run in, and how the
test command's two workers share them.

Why: on a new machine the Go builds (etcd, the control plane, kubelet; helm and
kubeconform) and the images take over ten minutes. Run before the first test, as the tiers
did, they add all of that to the run; run beside the light tiers (unit, api, clients,
browser), which spend much of their time waiting on their own processes, they cost little.
The test command runs on two pytest-xdist workers (``-n 2 --dist loadgroup``, Makefile):
the tiers keep about half a core busy each, so the second core halves what is left.

Contract:
- ``order(items)`` sorts the collected items by tier (stable within a tier): the light
  tiers that cover the builds' time first, then the heavy tiers longest unit first (the
  node tier is one inner session of ~5 min), then small light tiers that fill the other
  worker's time while the last heavy unit runs.
- ``unit(nodeid)`` is the test's xdist unit of work (``make_scheduler``, used for
  ``--dist loadgroup``): its file, so a module's fixtures start on one worker only, or
  its tier where a tier is one process (``node``: one inner session); the test itself
  for ``test_bench.py``, whose tests each run a bench of their own. Each worker of the
  cluster tier starts its own control plane.
- ``Prebuild.start(root, items)`` starts ``scripts/prebuild.sh`` (not niced: it is on the
  run's critical path) with the steps the selected heavy tiers need (none selected:
  nothing starts); its output goes to ``build/prebuild.log``. Under xdist only the
  controller starts it (``start_for_paths``, from the run's arguments, before the
  workers exist) and passes the steps and its pid to the workers in the environment
  (``adopt``).
- ``Prebuild.wait(item)`` blocks until every step the item's tier needs has ended (but
  ``NOT_WAITED``: the enforcer, which one node module waits for itself). It is
  called from a ``pytest_runtest_protocol`` wrapper that runs *outside* pytest-timeout's
  timer, so a cold build never counts against a test's timeout. A failed step is not
  reported here: the tier runs its script again itself (seconds when cached; each
  script locks its cache) and fails or skips with the script's own words.
- ``Prebuild.stop()`` ends the builds at the session's end (an interrupted run).

SANDBOX_PREBUILD=0 turns it off (the tiers then build on first use, as before).
"""

from __future__ import annotations

import contextlib
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
    "test_seeds_doc.py": 1,
    "store": 2,
    "egress": 2,  # the egress proxy on loopback: light, no build
    "api": 3,  # the largest light tier: ~10 min on two workers, the builds' cover
    "node": 4,  # one unit of ~5 min: started first of the heavy ones
    "cluster": 5,
    "test_bench.py": 6,
    "chart": 7,
    "image": 8,
    "kind": 9,  # a kind cluster of its own, where Docker exists (skipped here)
    "clients": 10,  # light fillers for the worker the last heavy unit leaves idle
    "browser": 11,
}
# Tiers that are one process whatever their files: one xdist unit each.
WHOLE_TIERS = frozenset({"node"})
# Tiers whose tests are each a unit of their own (each runs a bench of its own).
PER_TEST_TIERS = frozenset({"test_bench.py"})
# What each heavy tier needs built (steps of scripts/prebuild.sh).
NEEDS = {
    "chart": ("tools",),
    "image": ("images",),
    "cluster": ("tools", "kube"),  # test_chart_rbac.py renders the chart with helm
    "test_bench.py": ("kube",),
    "node": ("tools", "kube", "enforcer", "images"),
}
# scripts/prebuild.sh's order; ``enforcer`` (scripts/enforcer/) builds right after ``kube``,
# whose Go build cache it reuses, beside ``images``.
STEPS = ("tools", "kube", "enforcer", "images")
# Started for a tier but not waited for here: the node tier's egress module alone needs
# the enforcer, and waits for it itself (nodeenv.prepare.wait_for_enforcer).
NOT_WAITED = frozenset({"enforcer"})
# How an xdist controller tells its workers what it started.
STEPS_ENV = "SANDBOX_PREBUILD_STEPS"
PID_ENV = "SANDBOX_PREBUILD_PID"
# Past this the tier goes on and runs its script itself, which waits on the script's lock.
WAIT_LIMIT = 2400.0


def tier(item: pytest.Item, tests_root: Path) -> str:
    try:
        rel = Path(str(item.path)).resolve().relative_to(tests_root)
    except ValueError:
        return ""
    return rel.parts[0] if rel.parts else ""


def order(items: list[pytest.Item], tests_root: Path) -> None:
    items.sort(key=lambda item: _RANK.get(tier(item, tests_root), 3))


def unit(nodeid: str) -> str:
    """The xdist unit of work a test belongs to, from its node id (``tests/api/x.py::t``):
    its file, so a module's fixtures start on one worker only; its tier where a tier is one
    process (``node``: one inner session); the test itself for ``test_bench.py``, whose
    tests each run a bench of their own."""
    path = nodeid.split("::", 1)[0]
    parts = Path(path).parts
    name = parts[1] if len(parts) > 1 and parts[0] == "tests" else ""
    if name in WHOLE_TIERS:
        return name
    if name in PER_TEST_TIERS:
        return nodeid
    return path


def make_scheduler(config: pytest.Config, log):
    """The test command's scheduler: xdist's load-by-scope with ``unit`` as the scope.
    (Not ``xdist_group`` marks: pytest 9 derives ``nodeid`` from the node's structured id,
    so the suffix xdist 3.8 writes into ``_nodeid`` for them never reaches the scheduler
    and every test became a unit of its own.)"""
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit(nodeid)

    return UnitScheduling(config, log)


def tiers_of_paths(args: list[str], tests_root: Path) -> set[str]:
    """The tiers a run's path arguments reach (a path above ``tests/`` reaches them all;
    ``-k``/``-m`` are not looked at: a build too many costs only background time)."""
    found: set[str] = set()
    for arg in args or [str(tests_root)]:
        path = Path(arg.split("::")[0]).resolve()
        if path == tests_root or tests_root.is_relative_to(path):
            return set(_RANK)
        with contextlib.suppress(ValueError):
            found.add(path.relative_to(tests_root).parts[0])
    return found


class Prebuild:
    def __init__(self, repo: Path) -> None:
        self.repo = repo
        self.tests_root = repo / "tests"
        self.dir = repo / "build" / "prebuild"
        self.log = repo / "build" / "prebuild.log"
        self.proc: subprocess.Popen | None = None
        self.steps: tuple[str, ...] = ()
        self.started = 0.0
        self.adopted_pid = 0  # a worker's: the controller's prebuild process

    def start(self, items: list[pytest.Item]) -> None:
        wanted = {
            step
            for item in items
            if not item.get_closest_marker("skip")
            for step in NEEDS.get(tier(item, self.tests_root), ())
        }
        self._start(wanted)

    def start_for_paths(self, args: list[str]) -> None:
        """The xdist controller's start: it collects nothing, so the steps come from the
        tiers its arguments reach. The workers learn them (and whom to ask whether the
        builds still run) from the environment they inherit."""
        tiers = tiers_of_paths(args, self.tests_root)
        self._start({step for name in tiers for step in NEEDS.get(name, ())})
        if self.proc is not None:
            os.environ[STEPS_ENV] = ",".join(self.steps)
            os.environ[PID_ENV] = str(self.proc.pid)

    def adopt(self) -> None:
        """A worker's side: wait for the steps its controller started, never start any."""
        self.steps = tuple(s for s in os.environ.get(STEPS_ENV, "").split(",") if s)
        self.adopted_pid = int(os.environ.get(PID_ENV, "0") or 0)
        self.started = time.monotonic()

    def _start(self, wanted: set[str]) -> None:
        if os.environ.get("SANDBOX_PREBUILD", "1") == "0" or self.proc is not None:
            return
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
                    # Not niced (it was, at 10): with two busy workers a niced cold Go
                    # build got almost no CPU — kube took over 30 min in a fresh-clone
                    # run (4 min beside a serial run) and the heavy tiers waited for it.
                    "nice",
                    "-n",
                    "0",
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
        return (
            (self.dir / f"{step}.rc").exists()
            or (self.proc is not None and self.proc.poll() is not None)
            or (self.adopted_pid > 0 and not _alive(self.adopted_pid))
        )

    def wait(self, item: pytest.Item) -> None:
        steps = [
            s
            for s in NEEDS.get(tier(item, self.tests_root), ())
            if s in self.steps and s not in NOT_WAITED
        ]
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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
