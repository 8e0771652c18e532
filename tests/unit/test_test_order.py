"""The test run's order and background builds (tests/support/prebuild.py): every tier has
a place, light tiers run before heavy ones, and every heavy tier names what it waits for."""

from __future__ import annotations

import os
from pathlib import Path

import prebuild

TESTS = Path(__file__).resolve().parents[1]


def tiers_on_disk() -> set[str]:
    dirs = {p.name for p in TESTS.iterdir() if p.is_dir() and any(p.rglob("test_*.py"))}
    return dirs | {p.name for p in TESTS.glob("test_*.py")}


def test_every_tier_on_disk_has_a_place_in_the_order():
    assert tiers_on_disk() - set(prebuild._RANK) == set()


def test_the_api_tier_covers_the_builds_before_every_tier_that_waits_for_one():
    # The API tier (~10 min on two workers) is what the background builds hide behind;
    # the light tiers after the heavy ones are fillers for the worker left idle at the end.
    first_heavy = min(prebuild._RANK[tier] for tier in prebuild.NEEDS)
    assert prebuild._RANK["api"] < first_heavy
    assert all(prebuild._RANK[t] < first_heavy for t in ("unit", "store", "test_docs.py"))


def test_the_node_tier_is_the_first_heavy_unit_it_being_the_longest():
    first_heavy = min(prebuild._RANK[tier] for tier in prebuild.NEEDS)
    assert prebuild._RANK["node"] == first_heavy


def test_each_step_a_tier_waits_for_is_one_the_script_builds():
    script = (TESTS.parent / "scripts" / "prebuild.sh").read_text()
    for steps in prebuild.NEEDS.values():
        for step in steps:
            assert step in prebuild.STEPS and f"    {step})" in script


class _Item:
    def __init__(self, path: Path) -> None:
        self.path = path


def test_order_is_by_tier_and_stable_within_one():
    names = ["node/test_a.py", "api/test_b.py", "unit/test_c.py", "api/test_a.py", "cluster/x.py"]
    items = [_Item(TESTS / n) for n in names]
    prebuild.order(items, TESTS)  # type: ignore[arg-type]
    assert [str(i.path.relative_to(TESTS)) for i in items] == [
        "unit/test_c.py", "api/test_b.py", "api/test_a.py", "node/test_a.py", "cluster/x.py",
    ]  # fmt: skip


def test_a_file_is_one_unit_of_work_the_node_tier_one_and_each_bench_its_own():
    unit = prebuild.unit
    assert unit("tests/api/test_b.py::test_x[a-b]") == unit("tests/api/test_b.py::test_y")
    assert unit("tests/api/test_b.py::test_y") == "tests/api/test_b.py"
    assert unit("tests/cluster/test_pool.py::C::test_z") == "tests/cluster/test_pool.py"
    assert unit("tests/node/test_a.py::test_1") == unit("tests/node/test_b.py::t") == "node"
    assert unit("tests/test_bench.py::test_a") != unit("tests/test_bench.py::test_b")


def test_the_scheduler_keeps_a_unit_on_one_worker(tmp_path: Path):
    """Through xdist itself: two workers, three files; each file's tests ran on one."""
    import subprocess
    import sys

    for name in ("a", "b", "c"):
        (tmp_path / f"test_{name}.py").write_text(
            "import os, pytest\n"
            "@pytest.mark.parametrize('i', range(4))\n"
            f"def test_{name}(i):\n"
            "    print('WORKER', os.environ['PYTEST_XDIST_WORKER'])\n"
        )
    (tmp_path / "conftest.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(TESTS / 'support')!r})\n"
        "from prebuild import make_scheduler\n"
        "def pytest_xdist_make_scheduler(config, log):\n"
        "    return make_scheduler(config, log)\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p",
         "no:cacheprovider", "-c", "/dev/null", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        # The outer run's options (a --basetemp, --durations…) are not this inner run's.
        env={k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    workers: dict[str, set[str]] = {}
    for line in result.stdout.splitlines():
        if "PASSED" in line and line.startswith("[gw"):
            workers.setdefault(line.split("::")[0].split()[-1], set()).add(line[1:4])
    assert len(workers) == 3 and all(len(w) == 1 for w in workers.values()), workers


def test_the_controller_builds_what_its_paths_reach():
    repo = TESTS.parent
    assert prebuild.tiers_of_paths([], TESTS) == set(prebuild._RANK)
    assert prebuild.tiers_of_paths([str(repo)], TESTS) == set(prebuild._RANK)
    picked = [str(TESTS / "api" / "test_files.py") + "::test_x", str(TESTS / "node")]
    assert prebuild.tiers_of_paths(picked, TESTS) == {"api", "node"}
