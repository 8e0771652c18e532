"""contract/conditions.py: every condition type and reason is a documented constant, and
the operator spells its reasons only through them."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from sandbox_workspace.contract import conditions
from sandbox_workspace.contract.conditions import ConditionType, Reason

ROOT = Path(__file__).resolve().parents[2]


def constants(cls: type) -> dict[str, str]:
    return {k: v for k, v in vars(cls).items() if k.isupper()}


def test_each_constant_says_what_it_means():
    """Every constant has a comment on its line (what a reader of an Event is told)."""
    source = inspect.getsource(conditions)
    for cls in (ConditionType, Reason):
        for name, value in constants(cls).items():
            line = next(ln for ln in source.splitlines() if ln.strip().startswith(f"{name}:"))
            assert "#" in line and line.split("#", 1)[1].strip(), name
            assert line.count(f'"{value}"') == 1, name


def test_values_are_unique_within_each_kind():
    for cls in (ConditionType, Reason):
        values = list(constants(cls).values())
        assert len(values) == len(set(values)), cls.__name__


# Reasons that are also a phase or a condition type ("Stopped", "Deleting", "Expired"):
# a literal of those names may be the phase, so the scan below cannot tell them apart.
PHASE_OR_TYPE = {"Stopped", "Deleting", "Expired", *constants(ConditionType).values()}


def test_the_operator_names_no_reason_by_a_literal():
    reasons = set(constants(Reason).values()) - PHASE_OR_TYPE
    found = []
    for path in (ROOT / "operator").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in reasons:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
    assert found == []
