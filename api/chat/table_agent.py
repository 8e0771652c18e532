"""Seed 002's table agent: a table's nodes handed to the run as ``data.json`` files and
merged back at the end (``POST /api/v1/agents``).

Contract:
- ``make_plan`` (pure) turns the request into a JSON-able plan, or raises ``BadRequest``
  (400): every access point's ``path`` is a JSON pointer (``json_pointer``); two access
  points may not overlap (one the other or beneath it); ``workingDirectory`` must resolve
  inside the conversation. Access points whose node exists in the table get a file, in
  request order: the first ``data.json``, the n-th ``data_{n}.json``, each in the
  conversation's directory (``{workspace}/{conversation_id}/data.json``) — the model gets
  only ``bash``. Access points naming no node get no file; with no file at all the model
  gets the file tools (``read_file``, ``glob_search``, ``grep_search``) rooted at
  ``workingDirectory``.
- ``prepare`` writes each file before the first model turn; ``finish`` reads every
  ``full`` file back and merges it into the table at its pointer (``json_pointer.merge``,
  in request order). ``readonly`` files are never read back: nothing of them is merged
  or written. The outcome is ``{success, updatedData, modifiedPath}`` (``modifiedPath``
  the pointer of the one ``full`` node, or a list when several); a file that is missing or
  not valid JSON is ``success: false`` with the reason in ``error`` and ``updatedData``
  null — the table untouched.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from sandbox_workspace.contract import ids
from sandbox_workspace.contract.errors import BadRequest

from . import json_pointer
from .json_pointer import MISSING, PointerError

BASH_TOOLS = ["bash"]
FILE_TOOLS = ["read_file", "glob_search", "grep_search"]


def data_file(n: int) -> str:
    return "data.json" if n == 1 else f"data_{n}.json"


def conversation_root(workspace_path: str, cid: str) -> str:
    return f"{workspace_path.rstrip('/')}/{cid}"


def working_directory(value: str | None, cid: str, workspace_path: str | None) -> str:
    """The directory relative to the conversation (``""`` for the conversation itself)."""
    if not value or value in (".", "./"):
        return ""
    path = value
    if value.startswith("/"):
        if workspace_path is None:
            raise BadRequest(
                "workingDirectory: this user has no session yet, so no conversation "
                "directory; give it relative to the conversation",
                code="invalid_working_directory",
            )
        root = conversation_root(workspace_path, cid)
        if value.rstrip("/") == root:
            return ""
        if not value.startswith(root + "/"):
            raise BadRequest(
                f"workingDirectory must be inside this conversation ({root})",
                code="invalid_working_directory",
            )
        path = value[len(root) + 1 :]
    parts = [p for p in path.split("/") if p not in ("", ".")]
    try:
        for part in parts:
            if part == "..":
                raise ids.UnsafePath("'..' is not allowed")
            ids.check_name(part, what="workingDirectory component")
    except ids.UnsafePath as e:
        raise BadRequest(f"workingDirectory: {e}", code="invalid_working_directory") from e
    return "/".join(parts)


def make_plan(
    table: Any,
    points: list[dict],
    working_dir: str,
    *,
    has_table: bool,
    table_id: int | str | None = None,
) -> dict[str, Any]:
    parsed = []
    for i, point in enumerate(points):
        try:
            tokens = json_pointer.parse(point["path"])
        except PointerError as e:
            raise BadRequest(f"bashAccessPoints[{i}].path: {e}", code="invalid_access_point") from e
        for j, (other, _) in enumerate(parsed):
            if json_pointer.overlaps(tokens, other):
                raise BadRequest(
                    f"bashAccessPoints[{j}] and [{i}] overlap (one is the other or contains "
                    "it); give each node once",
                    code="overlapping_access_points",
                )
        parsed.append((tokens, point["mode"]))
    files = []
    for tokens, mode in parsed:
        node = json_pointer.resolve(table, tokens) if has_table else MISSING
        if node is MISSING:
            continue
        files.append(
            {
                "pointer": json_pointer.format_pointer(tokens),
                "mode": mode,
                "file": data_file(len(files) + 1),
                "node": node,
            }
        )
    return {
        "table": table if has_table else None,
        "table_id": table_id,
        "files": files,
        "tools": BASH_TOOLS if files else FILE_TOOLS,
        "root": working_dir,
    }


def describe(plan: dict, root: str) -> str:
    """What the system prompt adds for this run."""
    if not plan["files"]:
        where = f"{root}/{plan['root']}".rstrip("/")
        return (
            f"Use read_file, glob_search and grep_search to answer; they work inside {where} "
            "(relative paths are taken from there)."
        )
    lines = ["The table data you work on is in JSON files, one per node of the table:"]
    for f in plan["files"]:
        if f["mode"] == "full":
            how = "read-write: edit it in place; it is merged back into the table"
        else:
            how = "READ-ONLY: the sandbox refuses any change to it; nothing is written back"
        lines.append(f"- {root}/{f['file']}: the node at JSON pointer {f['pointer']} ({how})")
    lines.append(
        "Use the bash tool (jq, python3) to read and modify them. Keep every full file "
        "valid JSON: invalid JSON leaves the table untouched."
    )
    if any(f["mode"] == "readonly" for f in plan["files"]):
        lines.append(
            f"While a read-only file exists, nothing can be created at the top of {root}: "
            "edit full files in place (no temporary file + mv) and write other files "
            f"under {root}/outputs/."
        )
    return "\n".join(lines)


def write_command(f: dict) -> str:
    """A bash command writing one file (the JSON as base64 in a quoted here-document:
    no byte of it is ever interpreted by the shell)."""
    data = base64.b64encode(json.dumps(f["node"], ensure_ascii=False).encode()).decode()
    lines = "\n".join(data[i : i + 76] for i in range(0, len(data), 76))
    name = f["file"]
    return f"base64 -d > {name}.tmp <<'SBW_EOF'\n{lines}\nSBW_EOF\nmv -f {name}.tmp {name}\n"


def read_command(f: dict) -> str:
    return f"cat -- {f['file']}"


def merge_back(plan: dict, contents: dict[str, str | None]) -> dict[str, Any]:
    """The ``result`` fields, given each full file's text (None: it is gone)."""
    full = [f for f in plan["files"] if f["mode"] == "full"]
    if not full:
        return {"success": True, "updatedData": None, "modifiedPath": None}
    table = plan["table"]
    for f in full:
        text = contents.get(f["file"])
        if text is None:
            return failed(f"{f['file']} (node {f['pointer']}) was deleted")
        try:
            value = json.loads(text)
        except ValueError as e:
            return failed(f"{f['file']} (node {f['pointer']}) is not valid JSON: {e}")
        try:
            table = json_pointer.merge(table, json_pointer.parse(f["pointer"]), value)
        except PointerError as e:
            return failed(f"cannot merge {f['file']} back: {e}")
    paths = [f["pointer"] for f in full]
    return {
        "success": True,
        "updatedData": table,
        "modifiedPath": paths[0] if len(paths) == 1 else paths,
    }


def failed(reason: str) -> dict[str, Any]:
    return {"success": False, "updatedData": None, "modifiedPath": None, "error": reason}
