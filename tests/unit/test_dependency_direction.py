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


# ---- no import cycles ------------------------------------------------------------------
# The packages as they are installed (pyproject's package-dir): folder → import name.
PACKAGES = {
    "sandbox_workspace": "sandbox_workspace",
    "api": "sandbox_workspace.api",
    "operator": "sandbox_workspace.operator",
    "runtime": "sandbox_workspace.runtime",
}


def module_files() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for folder, package in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((package, *parts))] = path
    return modules


def import_targets(module: str, path: Path, node: ast.AST, modules: dict) -> set[str]:
    """The project modules one import statement loads (``from . import x`` loads x)."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names} & modules.keys()
    assert isinstance(node, ast.ImportFrom)
    base = node.module or ""
    if node.level:
        package = module.split(".")
        if path.name != "__init__.py":
            package = package[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, base] if base else package)
    named = {f"{base}.{alias.name}" for alias in node.names}
    submodules = named & modules.keys()
    # A name that is not a submodule is an attribute: the package itself is loaded for it.
    package = {base} & modules.keys() if named - submodules else set()
    return submodules | package


def import_graph() -> dict[str, set[str]]:
    """Every import counts: the lazy ones inside functions and those made only for type
    checking too — a cycle broken by a late import or hidden behind ``TYPE_CHECKING`` is
    still two modules that need each other (runtime/recover ↔ runtime/workspace was
    one, api/chat/runs ↔ runstore another)."""
    modules = module_files()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets: set[str] = set()
        pending = list(ast.parse(path.read_text()).body)
        while pending:  # iteratively: no recursion limit on deep trees
            node = pending.pop()
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                targets |= import_targets(module, path, node, modules)
            pending.extend(ast.iter_child_nodes(node))
        graph[module] = targets - {module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        work = [(start, iter(sorted(graph[start])))]
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_lazy_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    assert cycles(import_graph()) == []


# ---- the ground imports nothing above it ------------------------------------------------
ABOVE_THE_GROUND = (
    "sandbox_workspace.api",
    "sandbox_workspace.operator",
    "sandbox_workspace.runtime",
)
# The command line starts each deployable: it is the top, not the ground.
ENTRY_POINTS = {"sandbox_workspace.cli", "sandbox_workspace.__main__"}


def test_the_ground_imports_nothing_above_it():
    """STYLE 19: ``sandbox_workspace/`` (the contract, the store, the Kubernetes client,
    tracing, logging) is what the runtime, the operator and the API stand on; it knows
    none of them (kube.py once imported operator.models, store/base.py runtime.errors)."""
    offending = {
        module: sorted(t for t in targets if t.startswith(ABOVE_THE_GROUND))
        for module, targets in import_graph().items()
        if not module.startswith(ABOVE_THE_GROUND) and module not in ENTRY_POINTS
    }
    assert {m: t for m, t in offending.items() if t} == {}


def test_the_contract_stands_on_nothing_of_the_project():
    """The contract is the bottom of the ground: the store, the Kubernetes client and
    tracing may use it, never the other way round."""
    offending = {
        module: sorted(t for t in targets if not t.startswith("sandbox_workspace.contract"))
        for module, targets in import_graph().items()
        if module.startswith("sandbox_workspace.contract")
    }
    assert {m: t for m, t in offending.items() if t} == {}
