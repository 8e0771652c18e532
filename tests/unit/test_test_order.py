"""The test run's order and background builds (tests/support/prebuild.py): every tier has
a place, light tiers run before heavy ones, and every heavy tier names what it waits for."""

from __future__ import annotations

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
    def group_of(name: str) -> str | None:
        return prebuild.group(_Item(TESTS / name), TESTS)  # type: ignore[arg-type]

    assert group_of("api/test_b.py") == "tests/api/test_b.py"
    assert group_of("cluster/test_pool.py") == "tests/cluster/test_pool.py"
    assert group_of("node/test_a.py") == group_of("node/test_b.py") == "node"
    assert group_of("test_bench.py") is None


def test_the_controller_builds_what_its_paths_reach():
    repo = TESTS.parent
    assert prebuild.tiers_of_paths([], TESTS) == set(prebuild._RANK)
    assert prebuild.tiers_of_paths([str(repo)], TESTS) == set(prebuild._RANK)
    picked = [str(TESTS / "api" / "test_files.py") + "::test_x", str(TESTS / "node")]
    assert prebuild.tiers_of_paths(picked, TESTS) == {"api", "node"}
