"""Chat streaming: many concurrent runs against a scripted model; the latency the API adds
per event, against the same model streamed to the same client directly (same run).

Goal (issue 6): p99 added latency under 5 ms with 200 concurrent runs of 500 tokens.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from .harness import Figure, dev_server


def _stamps_latency(payload: str, now: int, sink: list[float]) -> None:
    for stamp in payload.split(";"):
        if stamp:
            sink.append((now - int(stamp)) / 1e6)


async def _direct(url: str, runs: int, sink: list[float]) -> float:
    async def one(client: httpx.AsyncClient) -> None:
        async with client.stream("POST", "/chat/completions", json={"stream": True}) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    now = time.monotonic_ns()
                    delta = json.loads(line[6:])["choices"][0]["delta"].get("content")
                    if delta:
                        _stamps_latency(delta, now, sink)

    limits = httpx.Limits(max_connections=runs + 10)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
        start = time.perf_counter()
        await asyncio.gather(*(one(client) for _ in range(runs)))
        return time.perf_counter() - start


async def _through_api(url: str, runs: int, sink: list[float]) -> tuple[float, int]:
    events = 0

    async def one(client: httpx.AsyncClient, i: int) -> None:
        nonlocal events
        body = {"query": "go", "conversation_id": f"bench-{i % 20}"}
        async with client.stream("POST", "/api/v1/chat", json=body) as r:
            kind = None
            async for line in r.aiter_lines():
                if line.startswith("event: "):
                    kind = line[7:]
                elif line.startswith("data: "):
                    events += 1
                    if kind == "text":
                        now = time.monotonic_ns()
                        _stamps_latency(json.loads(line[6:])["delta"], now, sink)
            assert kind == "done"

    limits = httpx.Limits(max_connections=runs + 10)
    async with httpx.AsyncClient(
        base_url=url, headers={"X-User-Id": "bench"}, timeout=600, limits=limits
    ) as client:
        await client.post("/api/v1/sessions", json={})
        await client.get(
            "/api/v1/sessions/sb-session-bench/files", params={"conversation_id": "bench-0"}
        )  # wait until running
        start = time.perf_counter()
        await asyncio.gather(*(one(client, i) for i in range(runs)))
        return time.perf_counter() - start, events


def run(quick: bool) -> list[Figure]:
    # 20 ms between tokens: 50 tokens/s per stream, the pace of a real model; 200 runs
    # make 10,000 events per second in all.
    runs, tokens, interval = (10, 50, 0.02) if quick else (200, 500, 0.02)
    with tempfile.TemporaryDirectory(prefix="sbw-bench-llm-") as tmp:
        port_file = Path(tmp) / "port"
        llm = subprocess.Popen(
            [sys.executable, "-m", "bench.llm_server", str(port_file), str(tokens), str(interval)],
            start_new_session=True,
            cwd=Path(__file__).resolve().parents[1],
        )
        try:
            deadline = time.monotonic() + 30
            while not port_file.exists():
                if llm.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("benchmark model server did not start")
                time.sleep(0.02)
            llm_url = f"http://127.0.0.1:{int(port_file.read_text())}/v1"
            direct: list[float] = []
            direct_seconds = asyncio.run(_direct(llm_url, runs, direct))
            via_api: list[float] = []
            env = {
                "SANDBOX_WORKSPACE_LLM_BASE_URL": llm_url,
                "SANDBOX_WORKSPACE_LLM_MODEL": "bench",
                "SANDBOX_WORKSPACE_SANDBOX_MOUNT": "none",
            }
            with dev_server(**env) as server:
                api_seconds, events = asyncio.run(_through_api(server.url, runs, via_api))
        finally:
            os.killpg(llm.pid, signal.SIGTERM)
            llm.wait(timeout=10)

    def quantile(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    return [
        Figure.of(
            f"chat: token → SSE event latency, {runs} runs × {tokens} tokens",
            "ms",
            via_api,
            "same model streamed directly",
            direct,
            goal="p99 added < 5 ms",
            events_per_second=round(events / api_seconds),
            api_seconds=round(api_seconds, 2),
            direct_seconds=round(direct_seconds, 2),
            added_p50_ms=round(quantile(via_api, 0.5) - quantile(direct, 0.5), 3),
            added_p99_ms=round(quantile(via_api, 0.99) - quantile(direct, 0.99), 3),
        ),
    ]
