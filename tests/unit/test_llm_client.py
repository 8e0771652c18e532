"""The model client's transport (api/chat/llm.py ``LlmClient``, here as ``OpenAiClient``)
against a raw HTTP/1.1 server on loopback whose every byte and pause the test scripts
(tests/support/raw_http.py): retries before the first byte, the stall watchdog, streams
cut short."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import pytest
from raw_http import LAST_CHUNK, OK_HEAD, Script, chunk, collect, serve, stream_until_error

from sandbox_workspace.api.chat.llm import Completion, LlmClient, LlmConfig, LlmError
from sandbox_workspace.api.chat.openai_chat import OpenAiClient


def _chunk(text: str) -> bytes:
    return chunk(b'data: {"choices":[{"delta":{"content":%s}}]}\n\n' % json.dumps(text).encode())


_END = b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
_FINISH = chunk(_END) + LAST_CHUNK


async def _collect(client: LlmClient) -> tuple[list[str], Completion]:
    return await collect(client, [{"role": "user", "content": "hi"}])


def _client(url: str, read_timeout: float = 5.0, retries: int = 2) -> LlmClient:
    return OpenAiClient(
        LlmConfig(
            base_url=url,
            model="m",
            read_timeout=read_timeout,
            connect_timeout=2.0,
            max_retries=retries,
            backoff_seconds=0.01,
        )
    )


def test_a_slow_stream_that_never_stalls_is_read_to_the_end():
    # 8 pieces 0.15 s apart: 1.2 s in all, four times the read timeout, never silent
    # for as long as the timeout. The watchdog must re-arm, not cut at 0.3 s.
    steps: list[bytes | float] = [OK_HEAD]
    for i in range(8):
        steps += [_chunk(f"t{i}"), 0.15]
    steps.append(_FINISH)

    async def go():
        server, url = await serve(Script(steps))
        async with server:
            return await _collect(_client(url, read_timeout=0.3))

    texts, completion = asyncio.run(go())
    assert texts == [f"t{i}" for i in range(8)]
    assert completion.content == "t0t1t2t3t4t5t6t7" and completion.finish_reason == "stop"


def test_a_stall_mid_stream_ends_it_with_llm_timeout_after_the_timeout():
    steps: list[bytes | float] = [OK_HEAD, _chunk("before"), 30.0, _chunk("never")]

    script = Script(steps)
    texts, error, took = stream_until_error(script, lambda url: _client(url, 0.4), [])
    assert texts == ["before"]
    assert error.code == "llm_timeout" and "0.4s" in str(error)
    assert 0.4 <= took < 5, took


def test_a_stream_cut_short_is_llm_stream_broken():
    # The connection closes inside a chunk: the body is incomplete.
    steps: list[bytes | float] = [OK_HEAD, _chunk("partial"), b"40\r\ndata: {"]

    async def go():
        server, url = await serve(Script(steps))
        async with server:
            with pytest.raises(LlmError) as caught:
                await _collect(_client(url))
            return caught.value

    assert asyncio.run(go()).code == "llm_stream_broken"


def test_429_is_retried_after_retry_after_then_streams():
    busy = b"HTTP/1.1 429 Too Many Requests\r\nretry-after: 0.3\r\ncontent-length: 4\r\n\r\nbusy"
    script = Script([busy], [OK_HEAD, _chunk("ok"), _FINISH])

    async def go():
        server, url = await serve(script)
        async with server:
            started = time.monotonic()
            result = await _collect(_client(url))
            return result, time.monotonic() - started

    (texts, completion), took = asyncio.run(go())
    assert texts == ["ok"] and completion.content == "ok" and script.requests == 2
    assert took >= 0.3, "Retry-After was not honoured"


def test_a_4xx_is_not_retried_and_says_what_the_endpoint_answered():
    bad = b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 11\r\n\r\nbad api key"
    script = Script([bad])

    async def go():
        server, url = await serve(script)
        async with server:
            with pytest.raises(LlmError) as caught:
                await _collect(_client(url))
            return caught.value

    error = asyncio.run(go())
    assert error.code == "llm_http_error" and "401" in str(error) and "bad api key" in str(error)
    assert script.requests == 1


def test_an_endpoint_nobody_listens_on_is_llm_unreachable_after_the_retries():
    with socket.socket() as s:  # a port that was free a moment ago: connections refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def go():
        with pytest.raises(LlmError) as caught:
            await _collect(_client(f"http://127.0.0.1:{port}/v1", retries=1))
        return caught.value

    error = asyncio.run(go())
    assert error.code == "llm_unreachable" and "unreachable" in str(error)


def test_a_response_head_that_never_comes_is_llm_timeout():
    script = Script([30.0])

    async def go():
        server, url = await serve(script)
        async with server:
            with pytest.raises(LlmError) as caught:
                await _collect(_client(url, read_timeout=0.3, retries=0))
            return caught.value

    assert asyncio.run(go()).code == "llm_timeout"
