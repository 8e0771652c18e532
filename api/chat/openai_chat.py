"""OpenAI-compatible Chat Completions client (OpenAI, vLLM, Ollama, LiteLLM proxies).

Contract (``llm.LlmClient``'s): ``data:`` lines of ``chat.completion.chunk`` objects until
``[DONE]``; text from ``delta.content``, tool calls reassembled from their fragments (ids
and names arrive once, arguments in pieces, keyed by ``index``). The loop's messages are
this API's own shape, so they are sent as they are.
"""

from __future__ import annotations

import json
from typing import Any

from .llm import Completion, LlmClient, LlmError, ToolCall


class OpenAiClient(LlmClient):
    """``POST {base_url}/chat/completions`` with ``stream: true``, bearer key."""

    def _request(
        self, messages: list[dict], tools: list[dict]
    ) -> tuple[str, dict[str, Any], dict[str, str]]:
        cfg = self.config
        body: dict[str, Any] = {"model": cfg.model, "messages": messages, "stream": True}
        if tools:
            body["tools"] = tools
            body["tool_choice"] = "auto"
        headers = {"Accept": "text/event-stream"}
        if cfg.api_key:
            headers["Authorization"] = f"Bearer {cfg.api_key}"
        return cfg.base_url.rstrip("/") + "/chat/completions", body, headers

    def _reply(self) -> _Reply:
        return _Reply()


class _Reply:
    """The streamed reply assembled from its ``data:`` lines, one ``feed`` per line.

    A line's tool-call fragments are folded in when the next line comes (or at
    ``completion``): after its text has gone out, so a malformed tool call still fails
    the stream only once the text that came with it is shown."""

    __slots__ = ("calls", "content", "done", "finish", "fragments")

    def __init__(self) -> None:
        self.content: list[str] = []
        self.calls: dict[int, ToolCall] = {}
        self.fragments: Any = None  # the last line's tool-call fragments, not folded yet
        self.finish: str | None = None
        self.done = False  # "[DONE]" came: nothing after it is read

    def feed(self, line: bytes) -> str | None:
        """Take one line of the body; the text it adds to the reply, if any."""
        if self.fragments:
            self._fold()
        if not line.startswith(b"data:"):
            return None  # comments, event names, blank separators
        payload = line[5:].strip()  # also drops the "\r" of a CRLF line end
        if payload == b"[DONE]":
            self.done = True
            return None
        try:
            chunk = json.loads(payload)
            choice = (chunk.get("choices") or [{}])[0]
            delta = choice.get("delta") or {}
        except (ValueError, AttributeError, TypeError, IndexError) as e:
            raise LlmError(
                f"the model sent a malformed stream chunk: {payload[:200]!r}", "llm_malformed"
            ) from e
        if choice.get("finish_reason"):
            self.finish = choice["finish_reason"]
        text = delta.get("content")
        if text:
            if type(text) is not str:
                raise LlmError(
                    f"the model sent content that is not text: {payload[:200]!r}", "llm_malformed"
                )
            self.content.append(text)
        self.fragments = delta.get("tool_calls")
        return text

    def _fold(self) -> None:
        fragments, self.fragments = self.fragments, None
        for fragment in fragments:
            try:
                index = int(fragment.get("index", 0))
                call = self.calls.setdefault(index, ToolCall(id="", name="", arguments=""))
                function = fragment.get("function") or {}
                call.id = fragment.get("id") or call.id
                call.name = function.get("name") or call.name
                call.arguments += function.get("arguments") or ""
            except (TypeError, ValueError, AttributeError) as e:
                raise LlmError("the model sent a malformed tool call", "llm_malformed") from e

    def completion(self) -> Completion:
        if self.fragments:
            self._fold()
        if not self.done and self.finish is None:
            raise LlmError("the model's stream ended before it finished", "llm_stream_broken")
        tool_calls = [self.calls[i] for i in sorted(self.calls)]
        for i, call in enumerate(tool_calls):
            if not call.name:
                raise LlmError("the model sent a tool call without a name", "llm_malformed")
            call.id = call.id or f"call_{i}"
        return Completion(
            content="".join(self.content), tool_calls=tool_calls, finish_reason=self.finish
        )
