"""docs/seeds.md stays true: every test it names exists, and its counts are its rows'.

Each row of a seed table is ``| # | requirement | § | status | where served | proven by |
note |``. A test named there (``tests/…py::test_name``, or a whole file) must exist — a test
renamed or removed fails here until the table follows. A served row (✅) names at least
one test unless its note says "By construction"; a different one (≠) gives its reason;
the counts table is the rows', counted.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from functools import cache
from pathlib import Path

import pytest
from doc_blocks import REPO_ROOT

SEEDS = REPO_ROOT / "docs" / "seeds.md"
ROW = re.compile(r"^\| (\d)-(\d+) \|")
REF = re.compile(r"`(tests/[\w/.\-]+?\.(?:py|mjs))(?:::(\w+))?`")


def _rows() -> list[list[str]]:
    return [
        [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        for line in SEEDS.read_text().splitlines()
        if ROW.match(line)
    ]


@cache
def _functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


def _refs() -> list[tuple[str, str | None]]:
    found = {(m[0], m[1]) for row in _rows() for m in REF.findall(row[5])}
    return [(path, name or None) for path, name in sorted(found)]


def test_every_requirement_has_one_row_with_all_its_cells():
    rows = _rows()
    assert len(rows) == 166
    assert all(len(r) == 7 for r in rows), [r[0] for r in rows if len(r) != 7]
    for seed, numbers in Counter(r[0].split("-")[0] for r in rows).items():
        got = sorted(int(r[0].split("-")[1]) for r in rows if r[0].startswith(f"{seed}-"))
        assert got == list(range(1, numbers + 1)), f"seed {seed}: rows {got}"


@pytest.mark.parametrize(("path", "name"), _refs(), ids=lambda v: v or "file")
def test_named_test_exists(path, name):
    file = REPO_ROOT / path
    assert file.is_file(), f"docs/seeds.md names {path}, which is gone: update the table"
    if name is not None:
        assert name in _functions(file), (
            f"docs/seeds.md names {path}::{name}, which is gone: update the table"
        )


def test_served_rows_name_a_test_and_different_rows_a_reason():
    for number, _, _, status, _, tests, note in _rows():
        if status == "✅":
            assert REF.search(tests) or note.startswith("By construction"), number
        if status in ("≠", "🟡", "❌"):
            assert note, f"{number}: say why ({status})"


def test_counts_are_the_rows():
    counted = Counter((r[0].split("-")[0], r[3]) for r in _rows())
    table = re.search(r"## Counts\n\n(.*?)\n\n", SEEDS.read_text(), re.S).group(1)
    for line in table.splitlines()[2:-1]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        seed = cells[0][2]  # "000 …" → "0"
        expected = dict(zip(["✅", "🟡", "❌", "≠"], map(int, cells[2:6]), strict=True))
        assert {s: counted[(seed, s)] for s in expected} == expected, line
