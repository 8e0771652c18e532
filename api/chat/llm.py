"""OpenAI-compatible Chat Completions client (OpenAI, vLLM, Ollama, LiteLLM proxies).

Contract: ``stream`` posts one streaming completion and yields each piece of content
(``str``) as it arrives, then one ``Completion`` with the assistant message — tool calls
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

import aiohttp

_RETRY_STATUSES = {429, 500, 502, 503, 504}
_MAX_RETRY_AFTER = 30.0


class LlmError(Exception):
    """The model endpoint failed; ``code`` classifies it for the ``error`` event."""

    def __init__(self, message: str, code: str = "llm_error") -> None:
        super().__init__(message)
        self.code = code


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
    """Streams completions over its own aiohttp session (created on first use, in the
    running loop; ``aclose`` closes it). Proxies come from the environment
    (``HTTP(S)_PROXY``, ``NO_PROXY``), as httpx's did.

    Why aiohttp directly, not the API's httpx client: a model sends one token per chunk
    to hundreds of runs at once, and httpx's layers over aiohttp (four async generators,
    a chunker, a decoder and a request context per chunk) cost 8–16 µs on top of the
    23 µs reading one chunk takes through aiohttp alone (bench/chat.py). For the same
    reason a stall is watched by one timer per stream (``_Watchdog``), not aiohttp's read
    timeout, which re-arms a timer on every chunk."""

    def __init__(self, config: LlmConfig) -> None:
        self.config = config
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=512, limit_per_host=0),
                trust_env=True,
                json_serialize=_compact_json,
            )
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def stream(
        self, messages: list[dict], tools: list[dict]
    ) -> AsyncIterator[str | Completion]:
        body: dict[str, Any] = {"model": self.config.model, "messages": messages, "stream": True}
        if tools:
            body["tools"] = tools
            body["tool_choice"] = "auto"
        response = await self._open(body)
        reply = _Reply()
        content = response.content
        watchdog = _Watchdog(content, self.config.read_timeout)
        # One generator from the body's bytes to the caller, lines split here: every
        # async-generator layer a token passes through costs about as much as parsing it.
        try:
            pending = b""
            while chunk := await content.readany():
                watchdog.fed()
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    text = reply.feed(line)
                    if text:
                        yield text  # a plain str: a wrapper object per token costs ~1 µs
                    elif reply.done:
                        break
                if reply.done:
                    break
            else:  # the body ended: a last line without a newline is a line all the same
                text = reply.feed(pending)
                if text:
                    yield text
        except aiohttp.ClientError as e:  # payload cut short, connection reset, ...
            raise LlmError(
                f"the model's stream broke: {e.__class__.__name__}", "llm_stream_broken"
            ) from e
        finally:
            watchdog.stop()
            if reply.done:
                response.release()  # the connection goes back to the pool
            else:
                response.close()
        yield reply.completion()

    async def _open(self, body: dict[str, Any]) -> aiohttp.ClientResponse:
        cfg = self.config
        headers = {"Accept": "text/event-stream"}
        if cfg.api_key:
            headers["Authorization"] = f"Bearer {cfg.api_key}"
        # Connecting, then the response's head, each within its timeout; the body is
        # watched by ``_Watchdog``.
        timeout = aiohttp.ClientTimeout(total=None, connect=cfg.connect_timeout, sock_read=None)
        url = cfg.base_url.rstrip("/") + "/chat/completions"
        session = self._client()
        for attempt in range(cfg.max_retries + 1):
            last = attempt == cfg.max_retries
            delay = cfg.backoff_seconds * 2**attempt
            try:
                async with asyncio.timeout(cfg.connect_timeout + cfg.read_timeout):
                    response = await session.post(url, json=body, headers=headers, timeout=timeout)
            except (TimeoutError, aiohttp.ServerTimeoutError) as e:
                if last:
                    raise LlmError("the model did not answer in time", "llm_timeout") from e
            except aiohttp.ClientError as e:
                if last:
                    raise LlmError(
                        f"the model endpoint is unreachable ({e.__class__.__name__})",
                        "llm_unreachable",
                    ) from e
            else:
                if response.status < 400:
                    return response
                try:
                    text = (await response.read()).decode(errors="replace")[:500]
                except aiohttp.ClientError:
                    text = ""
                response.release()
                if response.status not in _RETRY_STATUSES or last:
                    raise LlmError(
                        f"the model endpoint answered {response.status}: {text}",
                        "llm_http_error",
                    )
                delay = max(delay, _retry_after(response))
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")


def _compact_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class _Watchdog:
    """Ends a model stream that has sent nothing for ``timeout`` seconds: its reader
    then raises ``LlmError`` (``llm_timeout``). One timer per stream, re-armed only when
    it fires (for the last chunk's time plus ``timeout``) — feeding it costs one clock
    read per chunk."""

    __slots__ = ("_content", "_handle", "_last", "_loop", "_timeout")

    def __init__(self, content: aiohttp.StreamReader, timeout: float) -> None:
        self._content, self._timeout = content, timeout
        self._loop = asyncio.get_running_loop()
        self._last = self._loop.time()
        self._handle = self._loop.call_at(self._last + timeout, self._check)

    def fed(self) -> None:
        self._last = self._loop.time()

    def _check(self) -> None:
        due = self._last + self._timeout
        if self._loop.time() < due:
            self._handle = self._loop.call_at(due, self._check)
            return
        self._content.set_exception(
            LlmError(f"the model stopped sending for {self._timeout:g}s", "llm_timeout")
        )

    def stop(self) -> None:
        self._handle.cancel()


def _retry_after(response: aiohttp.ClientResponse) -> float:
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
