"""The model interface the agent loop uses, and the HTTP streaming both providers share.

Contract: ``LlmClient.stream(messages, tools)`` posts one streaming request and yields each
piece of text (``str``) as it arrives, then one ``Completion`` with the assistant message
— tool calls reassembled from their fragments. ``messages`` and ``tools`` are always in
the Chat Completions shape (the loop's one vocabulary: a ``system`` message first, ``tool``
messages for tool results, assistant ``tool_calls``); a provider translates them to its
own wire format, so the loop never branches on the provider. A retryable status or a
connection failure *before the first byte* is retried with exponential backoff
(``retry-after`` honoured, bounded); anything else — a 4xx, an error reported in the
stream, a malformed or truncated stream, a stall longer than the read timeout — raises
``LlmError`` with a message fit to show a user.

Providers: ``openai_chat.OpenAiClient`` (OpenAI-compatible Chat Completions) and
``anthropic_messages.AnthropicClient`` (Anthropic's Messages API); ``build_llm`` in
``api/app.py`` picks one from the settings, once.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

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
    # Chat Completions' vocabulary whatever the provider: stop, length, tool_calls,
    # content_filter.
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
    max_tokens: int = 4096  # Anthropic requires it; Chat Completions requests omit it
    anthropic_version: str = "2023-06-01"


class Reply(Protocol):
    """One streamed reply being assembled, one ``feed`` per line of the body."""

    done: bool  # the provider's end marker came: nothing after it is read

    def feed(self, line: bytes) -> str | None:
        """Take one line; the text it adds to the reply, if any."""

    def completion(self) -> Completion:
        """The whole reply; raises ``LlmError`` when the stream ended unfinished."""


class LlmClient:
    """Streams replies over its own aiohttp session (created on first use, in the running
    loop; ``aclose`` closes it). Proxies come from the environment (``HTTP(S)_PROXY``,
    ``NO_PROXY``). A provider supplies ``_request`` (URL, body, headers of one call) and
    ``_reply`` (the parser of its stream).

    Why aiohttp directly, not the API's httpx client: a model sends one token per chunk
    to hundreds of runs at once, and httpx's layers over aiohttp (four async generators,
    a chunker, a decoder and a request context per chunk) cost 8–16 µs on top of the
    23 µs reading one chunk takes through aiohttp alone (bench/chat.py). For the same
    reason a stall is watched by one timer per stream (``_Watchdog``), not aiohttp's read
    timeout, which re-arms a timer on every chunk."""

    retry_statuses: frozenset[int] = frozenset({429, 500, 502, 503, 504})

    def __init__(self, config: LlmConfig) -> None:
        self.config = config
        self._session: aiohttp.ClientSession | None = None

    def _request(
        self, messages: list[dict], tools: list[dict]
    ) -> tuple[str, dict[str, Any], dict[str, str]]:
        raise NotImplementedError

    def _reply(self) -> Reply:
        raise NotImplementedError

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
        response = await self._open(*self._request(messages, tools))
        reply = self._reply()
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

    async def _open(
        self, url: str, body: dict[str, Any], headers: dict[str, str]
    ) -> aiohttp.ClientResponse:
        cfg = self.config
        # Connecting, then the response's head, each within its timeout; the body is
        # watched by ``_Watchdog``.
        timeout = aiohttp.ClientTimeout(total=None, connect=cfg.connect_timeout, sock_read=None)
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
                if response.status not in self.retry_statuses or last:
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
