"""Every Python package of the product is in pyproject's `packages` list.

An editable install (the tests', `make dev`'s) imports any folder; a wheel — the image the
chart runs — ships only the listed packages. api/files was missing once: every test
passed and the image would have lacked the file service."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_listed_for_the_wheel():
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    package_dir: dict[str, str] = tool["package-dir"]
    found = set()
    for name, folder in package_dir.items():
        for init in sorted((ROOT / folder).rglob("__init__.py")):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([name, *rel.parts]))
    # A folder mapped on its own (api/ under sandbox_workspace/) is its own entry.
    assert found - set(tool["packages"]) == set()
