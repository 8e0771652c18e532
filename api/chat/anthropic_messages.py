"""Anthropic Messages API client (``POST /v1/messages``, ``stream: true``).

Contract (``llm.LlmClient``'s): the loop's Chat Completions-shaped conversation goes out in
the Messages shape — ``system`` messages as the top-level ``system``, assistant
``tool_calls`` as ``tool_use`` blocks, ``tool`` messages as ``tool_result`` blocks of a
``user`` turn, consecutive turns of one role merged (the API wants them alternating,
opening with the user's) — and the stream comes back as events: ``message_start``,
``content_block_start`` / ``_delta`` / ``_stop`` (``text_delta`` is text,
``input_json_delta`` is a tool call's input in pieces), ``message_delta`` (the
``stop_reason``), ``message_stop`` (the end), ``ping``, and ``error`` (the API failing
mid-stream: ``LlmError`` ``llm_stream_error`` with the API's error type). Stop reasons are
mapped to the loop's vocabulary (``end_turn`` → ``stop``, ``tool_use`` → ``tool_calls``,
``max_tokens`` → ``length``, ``refusal`` → ``content_filter``). 429 and 529 (overloaded)
are retried as 5xx are, honouring ``retry-after``. Authentication: ``x-api-key`` and
``anthropic-version``.
"""

from __future__ import annotations

import json
from typing import Any

from .llm import Completion, LlmClient, LlmError, ToolCall

DEFAULT_BASE_URL = "https://api.anthropic.com/v1"
_EARLIER = "(The conversation so far, from an earlier part of it.)"

_STOP_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "refusal": "content_filter",
}


class AnthropicClient(LlmClient):
    """``POST {base_url}/messages``; ``base_url`` is ``https://api.anthropic.com/v1`` or a
    proxy speaking the same API."""

    retry_statuses = frozenset({429, 500, 502, 503, 504, 529})

    def _request(
        self, messages: list[dict], tools: list[dict]
    ) -> tuple[str, dict[str, Any], dict[str, str]]:
        cfg = self.config
        system, turns = to_messages(messages)
        body: dict[str, Any] = {
            "model": cfg.model,
            "max_tokens": cfg.max_tokens,
            "messages": turns,
            "stream": True,
        }
        if system:
            body["system"] = system
        if tools:
            body["tools"] = [to_tool(t) for t in tools]
        headers = {"Accept": "text/event-stream", "anthropic-version": cfg.anthropic_version}
        if cfg.api_key:
            headers["x-api-key"] = cfg.api_key
        return cfg.base_url.rstrip("/") + "/messages", body, headers

    def _reply(self) -> _Reply:
        return _Reply()


def to_tool(spec: dict) -> dict:
    """A Chat Completions function tool as a Messages tool."""
    function = spec["function"]
    return {
        "name": function["name"],
        "description": function.get("description", ""),
        "input_schema": function.get("parameters") or {"type": "object", "properties": {}},
    }


def to_messages(messages: list[dict]) -> tuple[str, list[dict]]:
    """The loop's conversation as (``system``, ``messages``) of a Messages request."""
    system: list[str] = []
    turns: list[dict] = []

    def add(role: str, blocks: list[dict]) -> None:
        if not blocks:
            return  # an empty turn is refused; its neighbours merge instead
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})

    for message in messages:
        role, content = message["role"], message.get("content")
        if role == "system":
            if content:
                system.append(content)
        elif role == "tool":
            result = {
                "type": "tool_result",
                "tool_use_id": message["tool_call_id"],
                "content": content or "(no output)",
            }
            add("user", [result])
        else:
            # Blank text blocks are refused by the API: they carry nothing anyway.
            blocks = [{"type": "text", "text": content}] if content and content.strip() else []
            for call in message.get("tool_calls") or ():
                function = call["function"]
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": call["id"],
                        "name": function["name"],
                        "input": _tool_input(function.get("arguments") or ""),
                    }
                )
            add(role, blocks)
    if turns and turns[0]["role"] == "assistant":
        # A history that opens with the assistant (the client trimmed it): the API has
        # refused a first turn that is not the user's, so one says what precedes it.
        turns.insert(0, {"role": "user", "content": [{"type": "text", "text": _EARLIER}]})
    return "\n\n".join(system), turns


def _tool_input(arguments: str) -> dict:
    """A tool call's input object. Arguments that are not a JSON object (a reply cut short)
    go back as ``{}``: the tool's result, which follows, already told the model why the
    call was refused."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class _Reply:
    """The streamed message assembled from its ``data:`` lines (each event's JSON carries
    its ``type``, so the ``event:`` lines are not needed), one ``feed`` per line."""

    __slots__ = ("calls", "content", "done", "finish")

    def __init__(self) -> None:
        self.content: list[str] = []
        self.calls: dict[int, ToolCall] = {}  # tool_use blocks by their index
        self.finish: str | None = None
        self.done = False  # message_stop came: nothing after it is read

    def feed(self, line: bytes) -> str | None:
        if not line.startswith(b"data:"):
            return None  # event names, comments, blank separators
        payload = line[5:].strip()
        try:
            event = json.loads(payload)
            kind = event["type"]
            if kind == "content_block_delta":  # nearly every event: checked first
                delta = event["delta"]
                if delta["type"] == "text_delta":
                    text = delta["text"]
                    if type(text) is not str:
                        raise TypeError("text is not a string")
                    self.content.append(text)
                    return text
                if delta["type"] == "input_json_delta":
                    self.calls[event["index"]].arguments += delta["partial_json"]
                # thinking, signature and citation deltas are not shown
            elif kind == "content_block_start":
                block = event["content_block"]
                if block["type"] == "tool_use":
                    self.calls[event["index"]] = ToolCall(block["id"], block["name"], "")
                elif block["type"] == "text" and block.get("text"):
                    self.content.append(block["text"])
                    return block["text"]
            elif kind == "message_delta":
                reason = (event.get("delta") or {}).get("stop_reason")
                if reason:
                    self.finish = _STOP_REASONS.get(reason, reason)
            elif kind == "message_stop":
                self.done = True
            elif kind == "error":
                error = event.get("error") or {}
                raise LlmError(
                    f"the model reported an error mid-stream: {error.get('type', 'error')}: "
                    f"{error.get('message', '')}".rstrip(": "),
                    "llm_stream_error",
                )
            # message_start, content_block_stop, ping: nothing to take
        except LlmError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise LlmError(
                f"the model sent a malformed stream event: {payload[:200]!r}", "llm_malformed"
            ) from e
        return None

    def completion(self) -> Completion:
        if not self.done:
            raise LlmError("the model's stream ended before it finished", "llm_stream_broken")
        calls = [self.calls[i] for i in sorted(self.calls)]
        for call in calls:
            call.arguments = call.arguments or "{}"  # a tool without input streams none
        return Completion("".join(self.content), calls, self.finish)
