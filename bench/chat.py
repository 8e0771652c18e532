"""Chat streaming: many concurrent runs against a scripted model; the latency the API adds
per event, against the same model streamed to the same client directly (same run).

Goal (issue 6): p99 added latency under 5 ms with 200 concurrent runs of 500 tokens.

Set-up: the model streams 50 tokens/s per run (a real model's pace); the runs arrive
spread over 5 s (0.2 s in --quick), as users do, so all 200 stream at once for the last
5 s of the arrivals — 10,000 events/s. Model server and client are lean asyncio code
(bench/llm_server.py, bench/stamp_client.py) with their collectors off while measuring:
the apparatus must neither steal the API's CPU nor book its own pauses as the API's.
The API's garbage-collector pauses (from its /metrics) are reported beside the figures.

Where a Redis-protocol server is installed, the same load runs a third time through an
API on the Redis run store (chat.runStore=redis, a local redis-server over TCP): its
per-event latency against the in-process store's, same run (issue 16 goal: Redis adds
at most 1 ms at p50 and 10 ms at p99).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from .harness import Figure, cpu_seconds, dev_server, wait_for_port
from .stamp_client import post_and_measure


async def _direct(url: str, runs: int, sink: list[float], ramp: float = 0.0) -> float:
    address = httpx.URL(url)
    body = json.dumps({"model": "bench", "stream": True, "messages": []}).encode()

    async def one(i: int) -> None:
        await asyncio.sleep(i * ramp / runs)
        await post_and_measure(
            address.host,
            address.port,
            address.path.rstrip("/") + "/chat/completions",
            body,
            sink,
            expected_last=b"[DONE]",
        )

    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(runs)))
    return time.perf_counter() - start


async def _through_api(
    url: str, runs: int, sink: list[float], ramp: float = 0.0
) -> tuple[float, int]:
    address = httpx.URL(url)
    headers = {"X-User-Id": "bench"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=600) as client:
        await client.post("/api/v1/sessions", json={})
        await client.get(
            "/api/v1/sessions/sb-session-bench/files", params={"conversation_id": "bench-0"}
        )  # wait until running

    async def one(i: int) -> int:
        await asyncio.sleep(i * ramp / runs)  # arrivals spread over the ramp, as users come
        body = json.dumps({"query": "go", "conversation_id": f"bench-{i % 20}"}).encode()
        return await post_and_measure(
            address.host,
            address.port,
            "/api/v1/chat",
            body,
            sink,
            headers=headers,
            expected_last=b"event: done",
        )

    start = time.perf_counter()
    events = await asyncio.gather(*(one(i) for i in range(runs)))
    return time.perf_counter() - start, sum(events)


def _gc_pauses(metrics: str, before: str = "") -> dict[str, dict[str, float]]:
    """The API's garbage-collector pauses while it was measured (its /metrics after,
    less ``before``: start-up's full collections are no stream's pause), by generation:
    how many and how long in all — the usual suspect when p99 jumps."""
    if before:
        earlier = _gc_pauses(before)
        return {
            gen: {k: round(v - earlier.get(gen, {}).get(k, 0), 1) for k, v in entry.items()}
            for gen, entry in _gc_pauses(metrics).items()
        }
    pauses: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(metrics):
        if family.name != "sandbox_api_gc_pause_seconds":
            continue
        for sample in family.samples:
            entry = pauses.setdefault(f"gen{sample.labels['generation']}", {})
            if sample.name.endswith("_count"):
                entry["count"] = sample.value
            elif sample.name.endswith("_sum"):
                entry["total_ms"] = round(sample.value * 1000, 1)
    return pauses


def _store_flushes(metrics: str) -> dict[str, float]:
    """The Redis store's writes over the API's life (its /metrics): how many flushes,
    events per flush, and the mean round trip of one (sent → reply handled)."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.name in (
                "sandbox_chat_run_store_flush_seconds_count",
                "sandbox_chat_run_store_flush_seconds_sum",
                "sandbox_chat_run_store_events_stored_total",
            ):
                found[sample.name.rsplit("_", 1)[-1]] = sample.value
    flushes = found.get("count", 0) or 1
    return {
        "flushes": found.get("count", 0),
        "events_per_flush": round(found.get("total", 0) / flushes, 1),
        "mean_flush_round_trip_ms": round(found.get("sum", 0) / flushes * 1000, 3),
    }


def _measure(coroutine):
    """Run the measuring client on uvloop where it is installed (the API's own loop): the
    client is apparatus, and on the default loop it took a third of a core at 10,000
    events/s — CPU the API under test competes for on a small machine."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


@contextlib.contextmanager
def _no_collector_pauses():
    """The measuring client is apparatus: a collector pause in it would be booked as
    latency of whatever it measures, so its GC is off while it measures."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def run(quick: bool) -> list[Figure]:
    # 20 ms between tokens: 50 tokens/s per stream, the pace of a real model; 200 runs
    # make 10,000 events per second in all.
    runs, tokens, interval = (10, 50, 0.02) if quick else (200, 500, 0.02)
    ramp = 0.2 if quick else 5.0
    with tempfile.TemporaryDirectory(prefix="sbw-bench-llm-") as tmp:
        port_file = Path(tmp) / "port"
        llm = subprocess.Popen(
            [sys.executable, "-m", "bench.llm_server", str(port_file), str(tokens), str(interval)],
            start_new_session=True,
            cwd=Path(__file__).resolve().parents[1],
        )
        try:
            port = wait_for_port(llm, port_file, "benchmark model server")
            llm_url = f"http://127.0.0.1:{port}/v1"
            direct: list[float] = []
            with _no_collector_pauses():
                direct_seconds = _measure(_direct(llm_url, runs, direct, ramp))
            via_api: list[float] = []
            env = {
                "SANDBOX_WORKSPACE_LLM_BASE_URL": llm_url,
                "SANDBOX_WORKSPACE_LLM_MODEL": "bench",
                "SANDBOX_WORKSPACE_SANDBOX_MOUNT": "none",
            }
            with dev_server(**env) as server, _no_collector_pauses():
                cpu, before = cpu_seconds(server.pid), httpx.get(server.url + "/metrics").text
                api_seconds, events = _measure(_through_api(server.url, runs, via_api, ramp))
                cpu_per_event = (cpu_seconds(server.pid) - cpu) / events * 1e6
                gc_pauses = _gc_pauses(httpx.get(server.url + "/metrics").text, before)
            on_redis = _on_redis_store(env, runs, ramp, Path(tmp))
        finally:
            os.killpg(llm.pid, signal.SIGTERM)
            llm.wait(timeout=10)

    def quantile(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    figures = [] if on_redis is None else [_redis_figure(on_redis, via_api, runs, tokens, quantile)]
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
            api_gc_pauses=gc_pauses,
            api_cpu_us_per_event=round(cpu_per_event, 1),
        ),
        *figures,
    ]


def _on_redis_store(env: dict, runs: int, ramp: float, tmp: Path) -> tuple | None:
    """The same load through an API whose runs live on a local Redis-protocol server."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
    from redis_server import missing_reason, start_redis

    if missing_reason():
        print(f"chat: Redis run store not measured — {missing_reason()}", flush=True)
        return None
    store = start_redis(tmp / "redis")
    try:
        samples: list[float] = []
        redis_env = {
            **env,
            "SANDBOX_WORKSPACE_CHAT_RUN_STORE": "redis",
            "SANDBOX_WORKSPACE_CHAT_REDIS_URL": store.url,
        }
        with dev_server(**redis_env) as server, _no_collector_pauses():
            before = httpx.get(server.url + "/metrics").text
            cpu, store_cpu = cpu_seconds(server.pid), cpu_seconds(store.proc.pid)
            seconds, events = _measure(_through_api(server.url, runs, samples, ramp))
            cpu_us = {
                "api_cpu_us_per_event": (cpu_seconds(server.pid) - cpu) / events * 1e6,
                "redis_cpu_us_per_event": (cpu_seconds(store.proc.pid) - store_cpu) / events * 1e6,
            }
            metrics = httpx.get(server.url + "/metrics").text
        pauses = _gc_pauses(metrics, before)
        return samples, seconds, events, pauses, cpu_us, _store_flushes(metrics)
    finally:
        store.stop()


def _redis_figure(on_redis: tuple, in_process: list[float], runs: int, tokens: int, quantile):
    samples, seconds, events, gc_pauses, cpu_us, flushes = on_redis
    return Figure.of(
        f"chat on the Redis run store: token → SSE event latency, {runs} runs × {tokens} tokens",
        "ms",
        samples,
        "in-process run store (same run)",
        in_process,
        goal="added p50 ≤ 1 ms, p99 ≤ 10 ms",
        events_per_second=round(events / seconds),
        **{k: round(v, 1) for k, v in cpu_us.items()},
        added_p50_ms=round(quantile(samples, 0.5) - quantile(in_process, 0.5), 3),
        added_p99_ms=round(quantile(samples, 0.99) - quantile(in_process, 0.99), 3),
        api_gc_pauses=gc_pauses,
        store_writes=flushes,
    )
