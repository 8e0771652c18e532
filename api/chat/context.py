"""What the model is told: the system prompt and the workspace context messages.

Contract (seed 001 §4.7, seed 000 §7.3–7.4, §8.5): the system prompt names the
conversation's working directory, where uploads live (with each available file's full
path), and where to write outputs, so the model never guesses paths. Files the user
selected become one separate ``user``-role context message, placed before the query, in
the seed's format; the query itself stays exactly as the user wrote it. An earlier user
turn of the history that carried its own selected files gets its context message rebuilt
before it (the seed's GetHistory). Every file name and path goes in as a JSON string
literal (``"data.csv" ("/workspace/c/uploads/temparea/data.csv")``): quotes, brackets or
instruction-like text in a name stay visibly quoted data, never prompt text (names
cannot hold newlines or control characters: ``pathsafe.check_name``).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from sandbox_workspace.runtime.schemas import UploadedFile

CONTEXT_HEADER = "【System auto-generated context - not user query】"


def quoted(text: str) -> str:
    """``text`` as a JSON string literal (non-ASCII kept readable)."""
    return json.dumps(text, ensure_ascii=False)


def _file_line(name: str, path: str) -> str:
    return f"- {quoted(name)} ({quoted(path)})"


def system_prompt(
    workspace_path: str, conversation_id: str, session_id: str, uploads: list[UploadedFile]
) -> str:
    root = f"{workspace_path.rstrip('/')}/{conversation_id}"
    lines = [
        "You are a data assistant working in a sandbox. Use the tools to inspect files and "
        "run code; do not guess file contents.",
        f"Working directory of your code: {root}",
        f"User-uploaded files are in: {root}/uploads/temparea/",
        f"Write files you create to: {root}/outputs/ and call present_file for those the "
        "user should receive.",
        f"Sandbox session: {session_id}",
    ]
    if uploads:
        lines.append("Available files (names and paths are JSON strings):")
        lines += [_file_line(f.name, f.path) for f in uploads]
    else:
        lines.append("No files have been uploaded to this conversation yet.")
    return "\n".join(lines)


def temparea(workspace_path: str, conversation_id: str) -> str:
    return f"{workspace_path.rstrip('/')}/{conversation_id}/uploads/temparea/"


def workspace_context_message(
    workspace_path: str, conversation_id: str, session_id: str, files: list[tuple[str, str]]
) -> str | None:
    """The seed's context message for ``files`` — (name, full path) pairs — or None."""
    if not files:
        return None
    lines = "".join(f"{_file_line(name, path)}\n" for name, path in files)
    return (
        f"{CONTEXT_HEADER}\n\n"
        f"Current workspace path: {temparea(workspace_path, conversation_id)}\n"
        f"Sandbox Session ID: {session_id} (IMPORTANT: code you run executes in this "
        "session; use the paths above exactly)\n\n"
        f"Available files (names and paths are JSON strings):\n{lines}"
    )


def history_with_context(
    history: list[dict], context_of: Callable[[list[str]], str | None]
) -> list[dict]:
    """The history as the model gets it: each turn's ``selected_files`` (upload names)
    become its context message, placed just before the turn (seed 000 §7.4 GetHistory)."""
    messages: list[dict] = []
    for m in history:
        context = context_of(m.get("selected_files") or [])
        if context:
            messages.append({"role": "user", "content": context})
        messages.append({"role": m["role"], "content": m["content"]})
    return messages


def build_messages(system: str, history: list[dict], context: str | None, query: str) -> list[dict]:
    messages = [{"role": "system", "content": system}]
    messages += [{"role": m["role"], "content": m["content"]} for m in history]
    if context:
        messages.append({"role": "user", "content": context})
    messages.append({"role": "user", "content": query})
    return messages
