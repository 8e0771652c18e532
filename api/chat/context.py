"""What the model is told: the system prompt and the workspace context message.

Contract (seed 001 §4.7, seed 000 §7.3): the system prompt names the conversation's
working directory, where uploads live (with each available file's full path), and where
to write outputs, so the model never guesses paths. Files the user selected become one
separate ``user``-role context message, placed before the query, in the seed's format; the
query itself stays exactly as the user wrote it.
"""

from __future__ import annotations

from sandbox_workspace.runtime.schemas import UploadedFile

CONTEXT_HEADER = "【System auto-generated context - not user query】"


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
        lines.append("Available files:")
        lines += [f"- {f.name} ({f.path})" for f in uploads]
    else:
        lines.append("No files have been uploaded to this conversation yet.")
    return "\n".join(lines)


def workspace_context_message(
    workspace_path: str, conversation_id: str, session_id: str, selected: list[UploadedFile]
) -> str | None:
    if not selected:
        return None
    root = f"{workspace_path.rstrip('/')}/{conversation_id}/uploads/temparea/"
    files = "".join(f"- {f.name} ({f.path})\n" for f in selected)
    return (
        f"{CONTEXT_HEADER}\n\n"
        f"Current workspace path: {root}\n"
        f"Sandbox Session ID: {session_id} (IMPORTANT: code you run executes in this "
        "session; use the paths above exactly)\n\n"
        f"Available files:\n{files}"
    )


def build_messages(system: str, history: list[dict], context: str | None, query: str) -> list[dict]:
    messages = [{"role": "system", "content": system}]
    messages += [{"role": m["role"], "content": m["content"]} for m in history]
    if context:
        messages.append({"role": "user", "content": context})
    messages.append({"role": "user", "content": query})
    return messages
