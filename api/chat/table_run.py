"""The I/O half of seed 002's table agent (the pure half is ``table_agent``): what the run
loop calls to put a table's nodes into the sandbox and to take them back.

Contract: ``prepare_table`` writes every file of the plan into the conversation's
directory (a ``status`` event says so) and returns what the system prompt adds; a file
that cannot be written fails the run (``error`` ``table_write_failed``).
``table_read_only`` names the files every bash call of the model gets as the runtime's
``read_only`` (runtime/readonly.py: Landlock refuses any change to them, whatever the code
tries); ``prepare_table`` and ``finish_table`` themselves are ordinary calls.
``finish_table`` reads every ``full`` file back through the same runtime client and
returns the ``result`` fields (``table_agent.merge_back``); it never raises for what the
agent left behind. A plan with a ``table_id`` has the merged table PUT back to the table
source (``write_table``) before the fields are returned — so before the ``result`` event;
a write that fails (source down, slow, refusing) is ``success: false`` with the reason.
``table_tools_root`` is the file tools' root (None: unrestricted).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from sandbox_workspace.contract.errors import ApiError, Unavailable

from ..runtime_client import RuntimeClient
from .run import Run, RunFailed
from .table_agent import (
    conversation_root,
    describe,
    failed,
    merge_back,
    read_command,
    write_command,
)
from .tools import SandboxTools


def table_tools_root(plan: dict | None, workspace_path: str, cid: str) -> str | None:
    if plan is None or plan["files"]:
        return None
    return f"{conversation_root(workspace_path, cid)}/{plan['root']}".rstrip("/")


READ_ONLY_FEATURE = "read_only_entries"


async def check_read_only_enforced(client: RuntimeClient) -> None:
    """Refuse (503) unless this runtime enforces an execution's ``read_only``: a runtime
    without Landlock refuses such a call itself, but an older runtime image would ignore
    the field — read-only is enforced or refused, never pretended."""
    report = (await client.stats()).confinement
    if report is None or READ_ONLY_FEATURE not in report.features:
        raise Unavailable(
            "this sandbox's runtime cannot enforce read-only files (Landlock unavailable, or "
            "a runtime image older than the API)",
            code="read_only_unavailable",
        )


def table_read_only(plan: dict | None) -> list[str]:
    """The files the model's bash calls may not change (the runtime enforces it)."""
    return [f["file"] for f in (plan or {}).get("files", []) if f["mode"] == "readonly"]


async def prepare_table(run: Run, tools: SandboxTools, plan: dict) -> str:
    root = conversation_root(tools.workspace_path, tools.cid)
    if table_read_only(plan):
        await check_read_only_enforced(tools.client)
    for f in plan["files"]:
        result = await tools.run_trusted("bash", write_command(f))
        if result.exit_code != 0 or result.error is not None:
            why = result.error.value if result.error else result.stderr.strip()
            raise RunFailed("table_write_failed", f"could not write {f['file']}: {why}")
    if plan["files"]:
        names = ", ".join(f"{f['file']} ({f['mode']})" for f in plan["files"])
        run.emit("status", {"stage": "table", "message": f"table data written: {names}"})
    return describe(plan, root)


async def finish_table(
    run: Run,
    tools: SandboxTools,
    plan: dict,
    write_table: Callable[[Any], Awaitable[None]] | None = None,
) -> dict[str, Any]:
    contents: dict[str, str | None] = {}
    for f in plan["files"]:
        if f["mode"] != "full":
            continue
        result = await tools.run_trusted("bash", read_command(f))
        if result.truncated:
            return failed(f"{f['file']} is larger than the runtime's output limit")
        contents[f["file"]] = result.stdout if result.exit_code == 0 else None
    if plan["files"]:
        run.emit("status", {"stage": "table", "message": "table data read back"})
    outcome = merge_back(plan, contents)
    if plan.get("table_id") is None or outcome["updatedData"] is None:
        return outcome
    if write_table is None:
        return failed(
            "the run was carried on by another API replica, which holds no credential to "
            "write the table back (the caller's Authorization is never stored); nothing "
            "was written"
        )
    try:
        await write_table(outcome["updatedData"])
    except ApiError as e:
        return failed(f"the table was not written back: {e.message}")
    run.emit("status", {"stage": "table", "message": f"table {plan['table_id']} written back"})
    return outcome
