"""Tool policies: ``auto`` runs, ``require_approval`` pauses for a human, ``deny`` refuses.

Contract: the configured policy of each tool is the floor; a request may only make a
tool stricter (auto < require_approval < deny). A looser or unknown entry in a request is
a 400 naming the tool, so a client never believes it relaxed something it did not.
"""

from __future__ import annotations

from typing import Literal

from sandbox_workspace.contract.errors import BadRequest

Policy = Literal["auto", "require_approval", "deny"]
_RANK = {"auto": 0, "require_approval": 1, "deny": 2}


def effective_policies(
    tools: list[str], configured: dict[str, Policy], requested: dict[str, Policy] | None
) -> dict[str, Policy]:
    policies: dict[str, Policy] = {name: configured.get(name, "auto") for name in tools}
    for name, wanted in (requested or {}).items():
        if name not in policies:
            raise BadRequest(
                f"tool_policies names an unknown tool '{name}'; tools: {', '.join(tools)}",
                code="unknown_tool",
            )
        if _RANK[wanted] < _RANK[policies[name]]:
            raise BadRequest(
                f"tool_policies may only be stricter: '{name}' is "
                f"'{policies[name]}' here, not '{wanted}'",
                code="policy_too_loose",
            )
        policies[name] = wanted
    return policies


def allowed_policies(tools: list[str], configured: dict[str, Policy]) -> dict[str, list[str]]:
    """Per tool, the policies a request may ask for (the configured one or stricter)."""
    floor = {name: _RANK[configured.get(name, "auto")] for name in tools}
    return {name: [p for p, rank in _RANK.items() if rank >= floor[name]] for name in tools}
