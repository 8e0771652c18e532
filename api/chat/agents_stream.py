"""Run events → seed 002's ``/api/agent`` events, a pure translator (``POST /agents``).

Every event is an SSE frame ``event: {type}`` + ``data: {"type": …, fields}`` (a reader
of named events and a reader of ``data:`` lines that switches on ``type`` both work), of
six types exactly, with the fields the seed's sidebar reads:
- ``status`` ``{message, stage}`` — the first one also ``run_id``, ``session_id`` and
  ``conversation_id``; an approval wait is a ``status`` (stage ``tool_approval``,
  ``tool_call_id``), answered with ``POST /api/v1/runs/{run_id}/approvals``;
- ``text`` ``{content}`` — a piece of the answer, to append;
- ``tool_start`` ``{id, name, input}`` — ``input`` the call's arguments (an object);
- ``tool_end`` ``{id, name, output, success}``;
- ``error`` ``{error, code}`` — the reason, to show in the assistant's message;
- ``result`` ``{success, updatedData, modifiedPath}`` (and ``answer``; ``error`` when
  ``success`` is false) — always the last event: after a run's error too, with
  ``success: false`` and ``updatedData: null``.
"""

from __future__ import annotations

import json
from typing import Any

from .run_events import RunEvent, Translator

EVENT_TYPES = ["status", "text", "tool_start", "tool_end", "result", "error"]


def encode(message: dict) -> bytes:
    body = json.dumps(message, separators=(",", ":"), ensure_ascii=False)
    return f"event: {message['type']}\ndata: {body}\n\n".encode()


def _input(arguments: str) -> Any:
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        return {"_raw": arguments}
    return value if isinstance(value, dict) else {"_raw": arguments}


def failed(reason: str, code: str) -> list[dict]:
    return [
        {"type": "error", "error": reason, "code": code},
        {
            "type": "result",
            "success": False,
            "updatedData": None,
            "modifiedPath": None,
            "error": reason,
        },
    ]


class AgentsStream(Translator):
    def opening(self) -> list[dict]:
        return []

    def _on_run_started(self, event: RunEvent, out: list[dict]) -> None:
        out.append(
            {"type": "status", "stage": "started", "message": "agent run started", **event.data}
        )

    def _on_status(self, event: RunEvent, out: list[dict]) -> None:
        d = event.data
        message = d.get("message") or f"thinking (iteration {d.get('iteration')})"
        out.append({"type": "status", "stage": d.get("stage", ""), "message": message})

    def _on_text(self, event: RunEvent, out: list[dict]) -> None:
        if event.data.get("delta"):
            out.append({"type": "text", "content": event.data["delta"]})

    def delta_frame(self, raw: bytes) -> bytes | None:
        # Text here opens no part: every non-empty delta is one ``text`` event.
        if self.ended or raw == b'""':
            return None
        return b'event: text\ndata: {"type":"text","content":' + raw + b"}\n\n"

    def _on_tool_approval(self, event: RunEvent, out: list[dict]) -> None:
        d = event.data
        out.append(
            {
                "type": "status",
                "stage": "tool_approval",
                "tool_call_id": d["tool_call_id"],
                "message": f"waiting for approval of {d['name']}",
            }
        )

    def _on_tool_start(self, event: RunEvent, out: list[dict]) -> None:
        d = event.data
        out.append(
            {
                "type": "tool_start",
                "id": d["tool_call_id"],
                "name": d["name"],
                "input": _input(d.get("arguments", "")),
            }
        )

    def _on_tool_end(self, event: RunEvent, out: list[dict]) -> None:
        d = event.data
        out.append(
            {
                "type": "tool_end",
                "id": d["tool_call_id"],
                "name": d["name"],
                "output": d.get("output", ""),
                "success": bool(d.get("ok")),
            }
        )

    def _on_result(self, event: RunEvent, out: list[dict]) -> None:
        d = event.data
        result = {
            "type": "result",
            "success": bool(d.get("success")),
            "updatedData": d.get("updatedData"),
            "modifiedPath": d.get("modifiedPath"),
            "answer": d.get("answer", ""),
        }
        if not result["success"]:
            reason = d.get("error") or "the run failed"
            out.append({"type": "error", "error": reason, "code": "table_not_merged"})
            result["error"] = reason
        out.append(result)
        self.ended = True

    def _on_error(self, event: RunEvent, out: list[dict]) -> None:
        out.extend(failed(event.data.get("message", ""), event.data.get("code", "error")))
        self.ended = True

    def _on_done(self, event: RunEvent, out: list[dict]) -> None:
        out.extend(failed("the run ended without a result", "no_result"))
        self.ended = True
