"""The dependency direction of DESIGN.md holds: runtime ships alone into every pod, the
operator never needs the API, and the API never imports kopf handlers."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def imported_modules(folder: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in (ROOT / folder).rglob("*.py"):
        names: set[str] = set()
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # ``from pkg import mod`` imports pkg.mod: record both.
                names.add(node.module)
                names |= {f"{node.module}.{alias.name}" for alias in node.names}
        found[str(path.relative_to(ROOT))] = names
    return found


@pytest.mark.parametrize(
    ("folder", "forbidden"),
    [
        pytest.param(
            "runtime",
            (
                "sandbox_workspace.api",
                "sandbox_workspace.operator",
                "kopf",
                "kubernetes",
                # A sandbox pod holds no store credential: the API and operator move bytes.
                "sandbox_workspace.store",
                "obstore",
            ),
            id="runtime-ships-alone",
        ),
        pytest.param("operator", ("sandbox_workspace.api",), id="operator-without-api"),
        pytest.param(
            "api", ("kopf", "sandbox_workspace.operator.handlers"), id="api-without-kopf-handlers"
        ),
    ],
)
def test_dependency_direction(folder, forbidden):
    offending = {
        path: sorted(n for n in names if n.startswith(forbidden))
        for path, names in imported_modules(folder).items()
    }
    assert {p: n for p, n in offending.items() if n} == {}


# What the API may take from the operator: the contract of the custom resources.
API_MAY_USE_FROM_OPERATOR = {
    "sandbox_workspace.operator.models",
    "sandbox_workspace.operator.naming",
}


def test_api_uses_only_the_operators_crd_contract():
    """DESIGN: the API may use the operator's CRD models and naming rules, nothing else —
    not its Kubernetes client (that is the neutral ``sandbox_workspace.kube``)."""
    offending = {
        path: sorted(
            n
            for n in names
            if n.startswith("sandbox_workspace.operator.")
            and not n.startswith(tuple(API_MAY_USE_FROM_OPERATOR))
        )
        for path, names in imported_modules("api").items()
    }
    assert {p: n for p, n in offending.items() if n} == {}
