"""OpenAI-compatible Chat Completions client (OpenAI, vLLM, Ollama, LiteLLM proxies).

Contract: ``stream`` posts one streaming completion and yields ``TextDelta`` for content
as it arrives, then one ``Completion`` with the assistant message — tool calls
reassembled from their fragments (ids and names arrive once, arguments in pieces, keyed
by ``index``). A 429/5xx or a connection failure *before the first byte* is retried with
exponential backoff (``Retry-After`` honoured, bounded); anything else — a 4xx, a
malformed or truncated stream, a stall longer than the read timeout — raises ``LlmError``
with a message fit to show a user.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

_RETRY_STATUSES = {429, 500, 502, 503, 504}
_MAX_RETRY_AFTER = 30.0


class LlmError(Exception):
    """The model endpoint failed; ``code`` classifies it for the ``error`` event."""

    def __init__(self, message: str, code: str = "llm_error") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as the model wrote it


@dataclass
class Completion:
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None

    def as_message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.content or None}
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in self.tool_calls
            ]
        return message


@dataclass(frozen=True)
class LlmConfig:
    base_url: str
    model: str
    api_key: str | None = None
    connect_timeout: float = 10.0
    read_timeout: float = 60.0
    max_retries: int = 2
    backoff_seconds: float = 0.5


class LlmClient:
    def __init__(self, config: LlmConfig, http: httpx.AsyncClient) -> None:
        self.config = config
        self.http = http

    async def stream(
        self, messages: list[dict], tools: list[dict]
    ) -> AsyncIterator[TextDelta | Completion]:
        body: dict[str, Any] = {"model": self.config.model, "messages": messages, "stream": True}
        if tools:
            body["tools"] = tools
            body["tool_choice"] = "auto"
        response = await self._open(body)
        reply = _Reply()
        # One generator from the body's bytes to the caller, lines split here: every
        # async-generator layer a token passes through costs about as much as parsing it.
        # Splitting bytes ourselves also skips httpx's text decoding (JSON parses bytes).
        try:
            pending = b""
            async for chunk in response.aiter_bytes():
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    text = reply.feed(line)
                    if text:
                        yield TextDelta(text)
                    elif reply.done:
                        break
                if reply.done:
                    break
            else:  # the body ended: a last line without a newline is a line all the same
                text = reply.feed(pending)
                if text:
                    yield TextDelta(text)
        except httpx.ReadTimeout as e:
            raise LlmError(
                f"the model stopped sending for {self.config.read_timeout:g}s", "llm_timeout"
            ) from e
        except httpx.TransportError as e:
            raise LlmError(
                f"the model's stream broke: {e.__class__.__name__}", "llm_stream_broken"
            ) from e
        finally:
            await response.aclose()
        yield reply.completion()

    async def _open(self, body: dict[str, Any]) -> httpx.Response:
        cfg = self.config
        headers = {"Accept": "text/event-stream"}
        if cfg.api_key:
            headers["Authorization"] = f"Bearer {cfg.api_key}"
        timeout = httpx.Timeout(
            connect=cfg.connect_timeout,
            read=cfg.read_timeout,
            write=cfg.read_timeout,
            pool=cfg.connect_timeout,
        )
        url = cfg.base_url.rstrip("/") + "/chat/completions"
        for attempt in range(cfg.max_retries + 1):
            last = attempt == cfg.max_retries
            delay = cfg.backoff_seconds * 2**attempt
            try:
                request = self.http.build_request(
                    "POST", url, json=body, headers=headers, timeout=timeout
                )
                response = await self.http.send(request, stream=True)
            except httpx.TimeoutException as e:
                if last:
                    raise LlmError("the model did not answer in time", "llm_timeout") from e
            except httpx.TransportError as e:
                if last:
                    raise LlmError(
                        f"the model endpoint is unreachable ({e.__class__.__name__})",
                        "llm_unreachable",
                    ) from e
            else:
                if response.status_code < 400:
                    return response
                text = (await response.aread()).decode(errors="replace")[:500]
                await response.aclose()
                if response.status_code not in _RETRY_STATUSES or last:
                    raise LlmError(
                        f"the model endpoint answered {response.status_code}: {text}",
                        "llm_http_error",
                    )
                delay = max(delay, _retry_after(response))
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")


def _retry_after(response: httpx.Response) -> float:
    try:
        return min(float(response.headers.get("retry-after", "0")), _MAX_RETRY_AFTER)
    except ValueError:
        return 0.0


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
