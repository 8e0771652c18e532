"""Run events → the Vercel AI SDK's UI message stream (protocol v1), a pure translator.

The wire format is the one ``ai``'s ``DefaultChatTransport`` parses (checked against the
chunk schema in ``ai`` 6's source, ``uiMessageChunkSchema``): SSE ``data:`` lines of JSON
chunks, ended by ``data: [DONE]``, with the header ``x-vercel-ai-ui-message-stream: v1``.

Contract of ``UiMessageStream`` (one instance per response, i.e. per segment — see
run_events.py):
- the first event opens the message: ``start`` (``messageId``, the run in
  ``messageMetadata``) then ``start-step``;
- ``text`` → ``text-start`` (once per text part) and ``text-delta``; any tool step or end
  closes the open text part with ``text-end``;
- a tool call → ``tool-input-available`` (input = the parsed JSON arguments), then
  ``tool-output-available`` (output: ``{output, duration_ms, data?}``) or
  ``tool-output-error``; a call denied by policy is announced and ends in an error;
- ``tool_approval`` → ``tool-input-available`` + ``tool-approval-request`` (``approvalId``
  from run_events.approval_id), then ``finish-step`` and ``finish`` (``tool-calls``): the
  segment ends and the client's next request carries the decision. A rejected (or
  timed-out) call continues as ``tool-output-denied``. Calls announced by an earlier
  segment (``announced``) are not announced again; a replay from the run's start passes
  the approvals already answered (``decided``), which then do not end the response;
- ``status`` → transient ``data-status``; ``result`` → one ``file`` chunk per presented
  file, ``data-outputs`` (files changed and presented), ``finish`` (``stop``);
  ``error`` → ``error`` then ``finish`` (``error``), or ``abort`` when cancelled; ``done``
  closes anything still open. After ``finish`` the translator has ``ended``.
"""

from __future__ import annotations

import json
import mimetypes
from collections.abc import Iterable
from typing import Any

from .run_events import RunEvent, Translator, approval_id, json_string

HEADERS = {
    "x-vercel-ai-ui-message-stream": "v1",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}
DONE = b"data: [DONE]\n\n"


def parse_arguments(arguments: str) -> Any:
    """Tool arguments as JSON when they are JSON (models sometimes send otherwise)."""
    try:
        return json.loads(arguments or "{}")
    except ValueError:
        return {"raw": arguments}


def media_type(name: str) -> str:
    return mimetypes.guess_type(name)[0] or "application/octet-stream"


class UiMessageStream(Translator):
    def __init__(
        self,
        run_id: str,
        message_id: str,
        metadata: dict[str, Any] | None = None,
        announced: Iterable[str] = (),
        decided: Iterable[str] = (),
    ) -> None:
        super().__init__(announced)
        self.run_id = run_id
        self.message_id = message_id
        self.metadata = metadata or {}
        self._decided = set(decided)

    def opening(self) -> list[dict]:
        start: dict[str, Any] = {"type": "start", "messageId": self.message_id}
        if self.metadata:
            start["messageMetadata"] = self.metadata
        return [start, {"type": "start-step"}]

    def text_start(self, text_id: str) -> dict:
        return {"type": "text-start", "id": text_id}

    def text_delta(self, text_id: str, delta: str) -> dict:
        return {"type": "text-delta", "id": text_id, "delta": delta}

    def delta_prefix(self, text_id: str) -> bytes:
        return b'data: {"type":"text-delta","id":' + json_string(text_id) + b',"delta":'

    def text_end(self, text_id: str) -> dict:
        return {"type": "text-end", "id": text_id}

    def tool_call(self, call_id: str, name: str, arguments: str) -> list[dict]:
        input_ = parse_arguments(arguments)
        return [
            {
                "type": "tool-input-available",
                "toolCallId": call_id,
                "toolName": name,
                "input": input_,
            }
        ]

    def _finish(self, out: list[dict], reason: str | None) -> None:
        self._close_text(out)
        out.append({"type": "finish-step"})
        out.append({"type": "finish", **({"finishReason": reason} if reason else {})})
        self.ended = True

    def _on_status(self, event: RunEvent, out: list[dict]) -> None:
        out.append({"type": "data-status", "data": event.data, "transient": True})

    def _on_tool_approval(self, event: RunEvent, out: list[dict]) -> None:
        d = event.data
        call_id = d["tool_call_id"]
        self._announce(out, call_id, d["name"], d.get("arguments", ""))
        out.append(
            {
                "type": "tool-approval-request",
                "approvalId": approval_id(self.run_id, call_id),
                "toolCallId": call_id,
            }
        )
        if call_id not in self._decided:  # a replay goes on past answered approvals
            self._finish(out, "tool-calls")

    def _on_tool_end(self, event: RunEvent, out: list[dict]) -> None:
        d = event.data
        call_id = d["tool_call_id"]
        self._announce(out, call_id, d["name"], "")
        decision = d.get("decision")
        if decision in ("rejected", "timeout"):
            out.append({"type": "tool-output-denied", "toolCallId": call_id})
        elif d.get("ok"):
            output = {"output": d.get("output", ""), "duration_ms": d.get("duration_ms", 0)}
            if d.get("data"):
                output["data"] = d["data"]
            out.append({"type": "tool-output-available", "toolCallId": call_id, "output": output})
        else:
            out.append(
                {"type": "tool-output-error", "toolCallId": call_id, "errorText": d.get("output")}
            )

    def _on_result(self, event: RunEvent, out: list[dict]) -> None:
        d = event.data
        self._close_text(out)
        for presented in d.get("presented", []):
            out.append(
                {
                    "type": "file",
                    "url": presented["download_url"],
                    "mediaType": media_type(presented["name"]),
                }
            )
        out.append(
            {
                "type": "data-outputs",
                "data": {"files": d.get("files", []), "presented": d.get("presented", [])},
            }
        )
        self._finish(out, "stop")

    def _on_error(self, event: RunEvent, out: list[dict]) -> None:
        d = event.data
        self._close_text(out)
        if d.get("code") == "cancelled":
            out.append({"type": "abort", "reason": d.get("message", "cancelled")})
            self._finish(out, None)
            return
        out.append({"type": "error", "errorText": f"{d.get('message')} ({d.get('code')})"})
        self._finish(out, "error")

    def _on_done(self, event: RunEvent, out: list[dict]) -> None:
        self._finish(out, "other")
