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


def test_light_tiers_run_before_every_tier_that_waits_for_a_build():
    heavy = set(prebuild.NEEDS)
    last_light = max(rank for tier, rank in prebuild._RANK.items() if tier not in heavy)
    first_heavy = min(prebuild._RANK[tier] for tier in heavy)
    assert last_light < first_heavy


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
        "unit/test_c.py", "api/test_b.py", "api/test_a.py", "cluster/x.py", "node/test_a.py",
    ]  # fmt: skip
