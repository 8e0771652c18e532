"""Run events → AG-UI events (protocol 1.0), a pure translator.

Checked against ``@ag-ui/core`` 1.0's schemas and ``@ag-ui/client``'s event verifier (which
refuses, e.g., ``RUN_FINISHED`` while a text message or tool call is still open).

Contract of ``AgUiStream`` (one instance per AG-UI run, i.e. per segment of the engine's
run — see run_events.py):
- the first event opens with ``RUN_STARTED`` (the client's ``threadId`` and ``runId``;
  the engine's run id in ``metadata``);
- ``text`` → ``TEXT_MESSAGE_START`` (once per message) / ``TEXT_MESSAGE_CONTENT``, closed
  with ``TEXT_MESSAGE_END`` before any tool call and at the end;
- a tool call → ``TOOL_CALL_START`` / ``TOOL_CALL_ARGS`` / ``TOOL_CALL_END`` when it is
  announced (approval asked, or started), ``TOOL_CALL_RESULT`` with the output when done;
- ``tool_approval`` ends the AG-UI run: ``RUN_FINISHED`` with the interrupt outcome, one
  interrupt (``id`` = run_events.approval_id, ``reason`` ``tool_approval``,
  ``toolCallId``, a ``responseSchema`` for ``{approved, reason}``). The next run answers
  it in ``resume`` and continues the same engine run;
- ``result`` → ``RUN_FINISHED`` (success; ``result`` = answer, files, presented);
  ``error`` → ``RUN_ERROR`` (message, code), or ``RUN_FINISHED`` with the cancelled outcome
  for a cancelled run; ``status`` → ``CUSTOM`` ``sandbox.status``. After the terminal
  event the translator has ``ended``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .run_events import RunEvent, Translator, approval_id, json_string

INTERRUPT_REASON = "tool_approval"
RESPONSE_SCHEMA = {
    "type": "object",
    "properties": {"approved": {"type": "boolean"}, "reason": {"type": "string"}},
    "required": ["approved"],
}


class AgUiStream(Translator):
    def __init__(
        self, thread_id: str, run_id: str, engine_run_id: str, announced: Iterable[str] = ()
    ) -> None:
        super().__init__(announced)
        self.thread_id = thread_id
        self.run_id = run_id
        self.engine_run_id = engine_run_id

    def _ids(self) -> dict[str, str]:
        return {"threadId": self.thread_id, "runId": self.run_id}

    def opening(self) -> list[dict]:
        metadata = {"sandbox_run_id": self.engine_run_id}
        return [{"type": "RUN_STARTED", **self._ids(), "metadata": metadata}]

    def text_id(self, event: RunEvent) -> str:
        return f"msg-{self.engine_run_id}-{event.id}"

    def text_start(self, text_id: str) -> dict:
        return {"type": "TEXT_MESSAGE_START", "messageId": text_id, "role": "assistant"}

    def text_delta(self, text_id: str, delta: str) -> dict:
        return {"type": "TEXT_MESSAGE_CONTENT", "messageId": text_id, "delta": delta}

    def delta_prefix(self, text_id: str) -> bytes:
        head = b'data: {"type":"TEXT_MESSAGE_CONTENT","messageId":'
        return head + json_string(text_id) + b',"delta":'

    def text_end(self, text_id: str) -> dict:
        return {"type": "TEXT_MESSAGE_END", "messageId": text_id}

    def tool_call(self, call_id: str, name: str, arguments: str) -> list[dict]:
        out = [{"type": "TOOL_CALL_START", "toolCallId": call_id, "toolCallName": name}]
        if arguments:
            out.append({"type": "TOOL_CALL_ARGS", "toolCallId": call_id, "delta": arguments})
        out.append({"type": "TOOL_CALL_END", "toolCallId": call_id})
        return out

    def _finish(self, out: list[dict], **fields: Any) -> None:
        self._close_text(out)
        out.append({"type": "RUN_FINISHED", **self._ids(), **fields})
        self.ended = True

    def _on_status(self, event: RunEvent, out: list[dict]) -> None:
        out.append({"type": "CUSTOM", "name": "sandbox.status", "value": event.data})

    def _on_tool_approval(self, event: RunEvent, out: list[dict]) -> None:
        d = event.data
        call_id = d["tool_call_id"]
        self._announce(out, call_id, d["name"], d.get("arguments", ""))
        interrupt = {
            "id": approval_id(self.engine_run_id, call_id),
            "reason": INTERRUPT_REASON,
            "message": f"Approve the call of tool '{d['name']}'?",
            "toolCallId": call_id,
            "responseSchema": RESPONSE_SCHEMA,
            "metadata": {"timeout_seconds": d.get("timeout_seconds")},
        }
        self._finish(out, outcome={"type": "interrupt", "interrupts": [interrupt]})

    def _on_tool_end(self, event: RunEvent, out: list[dict]) -> None:
        d = event.data
        call_id = d["tool_call_id"]
        self._announce(out, call_id, d["name"], "")
        content = d.get("output", "")
        if d.get("decision"):
            content = f"{d['decision']}: {content}"
        out.append(
            {
                "type": "TOOL_CALL_RESULT",
                "messageId": f"result-{self.engine_run_id}-{event.id}",
                "toolCallId": call_id,
                "content": content,
                "role": "tool",
            }
        )

    def _on_result(self, event: RunEvent, out: list[dict]) -> None:
        d = event.data
        result = {k: d.get(k) for k in ("answer", "files", "presented")}
        self._finish(out, result=result, outcome={"type": "success"})

    def _on_error(self, event: RunEvent, out: list[dict]) -> None:
        d = event.data
        if d.get("code") == "cancelled":
            self._finish(out, outcome={"type": "cancelled"})
            return
        self._close_text(out)
        out.append({"type": "RUN_ERROR", "message": d.get("message", ""), "code": d.get("code")})
        self.ended = True

    def _on_done(self, event: RunEvent, out: list[dict]) -> None:
        self._close_text(out)
        out.append(
            {"type": "RUN_ERROR", "message": "the run ended without a result", "code": "no_result"}
        )
        self.ended = True
