"""Chat streaming: many concurrent runs against a scripted model; the latency the API adds
per event, against the same model streamed to the same client directly (same run).

Goal (issue 6): p99 added latency under 5 ms with 200 concurrent runs of 500 tokens.

Both model providers are measured: the OpenAI-compatible client (the first figure, and the
one the Redis store is compared with) and Anthropic's Messages client (the last figure:
the same load through an API with ``LLM_PROVIDER=anthropic`` against the same model
server speaking Messages, beside that stream read directly; each round's OpenAI and
Anthropic phases run back to back, and the figure says how far apart they came out).

Every front door of the engine is measured the same way, in every round: after /chat's
phases, the load goes through ``/api/v1/ui/chat`` (the AI SDK's UI message stream),
``/api/v1/ag-ui`` and ``/api/v1/agents`` (seed 002's sidebar, the file tools' flow, no
table), on both providers — a figure per route and provider with its added latency over
the provider's direct stream and its difference from /chat's phases of the same rounds
on the same provider ("no regression on /chat"). The full run gives each route's phase
an API process of its own, as /chat's, and rotates their order from round to round (no
route is always the last of a round); --quick runs the three routes through one per
provider (a few seconds per route).

To look at a few routes quickly: ``python -m bench.chat --routes ag-ui,agents
--providers anthropic --rounds 3`` runs only those (beside /chat's phases on the same
providers, no Redis) and writes ``chat-selected.json``, never the full run's figures.

Set-up: the model streams 50 tokens/s per run (a real model's pace); the runs arrive
spread over 5 s (0.2 s in --quick), as users do, so all 200 stream at once for the last
5 s of the arrivals — 10,000 events/s. Model server and client are lean asyncio code
(bench/llm_server.py, bench/stamp_client.py) with their collectors off while measuring:
the apparatus must neither steal the API's CPU nor book its own pauses as the API's.
The API's garbage-collector pauses (from its /metrics) are reported beside the figures.

Where a Redis-protocol server is installed, the same load also runs through an API on
the Redis run store (chat.runStore=redis, a local redis-server over TCP), alternating
with the in-process store, three rounds of each (one in --quick): the per-event latency
the Redis store adds is the median of the rounds' differences, every round reported in
``bench/results/chat.json`` (``chat-quick.json`` with --quick: the full run's figures are
the ones kept). Issue 16's goal: Redis adds at most 1 ms at p50 and 10 ms at p99.
Alternating matters on a shared two-core machine, where the API's one core is nearly
full at the peak: one disturbed phase moved a single-round p99 by tens of milliseconds
either way.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from .harness import Figure, cpu_seconds, dev_server, percentile, wait_for_port
from .stamp_client import post_and_measure

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "tests" / "support")]
from redis_server import missing_reason, start_redis  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
ROUNDS = 3
PROVIDERS = ("openai", "anthropic")


async def _direct(
    url: str, runs: int, sink: list[float], ramp: float = 0.0, provider: str = "openai"
) -> float:
    address = httpx.URL(url)
    body = json.dumps({"model": "bench", "stream": True, "messages": []}).encode()
    path, last = (
        ("/messages", b"message_stop")
        if provider == "anthropic"
        else (
            "/chat/completions",
            b"[DONE]",
        )
    )

    async def one(i: int) -> None:
        await asyncio.sleep(i * ramp / runs)
        await post_and_measure(
            address.host,
            address.port,
            address.path.rstrip("/") + path,
            body,
            sink,
            expected_last=last,
        )

    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(runs)))
    return time.perf_counter() - start


@dataclass(frozen=True)
class Route:
    """One chat route under the load: its path, the body of run ``i`` and how its
    stream's last frame begins."""

    path: str
    body: Callable[[int], dict]
    last: bytes


def _conversation(i: int) -> str:
    return f"bench-{i % 20}"


CHAT = Route(
    "/api/v1/chat",
    lambda i: {"query": "go", "conversation_id": _conversation(i)},
    b"event: done",
)
# The other front doors of the same engine, each with its own client's request shape
# (a chat id per run: a new message on a chat id supersedes the chat's open run).
ROUTES = [
    Route(
        "/api/v1/ui/chat",
        lambda i: {
            "id": f"bench-ui-{i}",
            "messages": [{"id": "m1", "role": "user", "parts": [{"type": "text", "text": "go"}]}],
            "conversation_id": _conversation(i),
        },
        b"data: [DONE]",
    ),
    Route(
        "/api/v1/ag-ui",
        lambda i: {
            "threadId": _conversation(i),
            "runId": f"bench-{i}",
            "messages": [{"id": "m1", "role": "user", "content": "go"}],
        },
        b'data: {"type":"RUN_FINISHED"',
    ),
    # seed 002's sidebar without a table: the file tools' flow.
    Route(
        "/api/v1/agents",
        lambda i: {"prompt": "go", "conversation_id": _conversation(i)},
        b"event: result",
    ),
]


async def _through_api(
    url: str, runs: int, sink: list[float], ramp: float = 0.0, route: Route = CHAT
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
        return await post_and_measure(
            address.host,
            address.port,
            route.path,
            json.dumps(route.body(i)).encode(),
            sink,
            headers=headers,
            expected_last=route.last,
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


def run(
    quick: bool,
    routes: list[Route] | None = None,
    providers: tuple[str, ...] = PROVIDERS,
    rounds: int | None = None,
) -> list[Figure]:
    """The whole suite; or, with ``routes`` (and ``providers``, ``rounds``) given, those
    routes beside /chat's phases on those providers — no Redis store, results in
    ``chat-selected.json``."""
    selected = routes is not None
    routes = ROUTES if routes is None else routes
    # 20 ms between tokens: 50 tokens/s per stream, the pace of a real model; 200 runs
    # make 10,000 events per second in all.
    runs, tokens, interval = (10, 50, 0.02) if quick else (200, 500, 0.02)
    ramp = 0.2 if quick else 5.0
    # In-process and Redis phases alternate, ROUNDS pairs: a disturbance of this shared
    # machine during one phase moves one round's difference, not the median of three.
    rounds = rounds or (1 if quick else ROUNDS)
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
            direct = {"openai": [], "anthropic": []}
            with _no_collector_pauses():
                direct_seconds = _measure(_direct(llm_url, runs, direct["openai"], ramp))
                _measure(_direct(llm_url, runs, direct["anthropic"], ramp, "anthropic"))
            env = {
                "SANDBOX_WORKSPACE_LLM_BASE_URL": llm_url,
                "SANDBOX_WORKSPACE_LLM_MODEL": "bench",
                "SANDBOX_WORKSPACE_SANDBOX_MOUNT": "none",
                # One user ("bench") makes every run: its per-user cap must not throttle.
                "SANDBOX_WORKSPACE_QUOTAS__RUNS_PER_USER": str(max(runs, 1)),
            }
            envs = {
                "openai": env,
                "anthropic": {**env, "SANDBOX_WORKSPACE_LLM_PROVIDER": "anthropic"},
            }
            on_chat: dict[str, list[Phase]] = {provider: [] for provider in providers}
            on_redis: list[Phase] = []
            # (route, provider) → that route's phase of every round
            on_routes: dict[tuple[str, str], list[Phase]] = {}
            pairs = [(route, provider) for provider in providers for route in routes]
            redis_missing = selected
            for i in range(rounds):
                for provider in providers:
                    on_chat[provider].append(_phase(envs[provider], runs, ramp))
                phase = None if redis_missing else _on_redis_store(env, runs, ramp, Path(tmp))
                redis_missing = phase is None
                if phase is not None:
                    on_redis.append(phase)
                if quick:  # one API process per provider for its routes (a few seconds each)
                    batches = [[p for p in pairs if p[1] == provider] for provider in providers]
                else:  # an API each, in an order rotated from round to round
                    shift = (2 * i) % len(pairs)
                    batches = [[p] for p in pairs[shift:] + pairs[:shift]]
                for batch in batches:
                    measured = _phases(envs[batch[0][1]], runs, ramp, [r for r, _ in batch])
                    for (route, provider), phase in zip(batch, measured, strict=True):
                        on_routes.setdefault((route.path, provider), []).append(phase)
        finally:
            os.killpg(llm.pid, signal.SIGTERM)
            llm.wait(timeout=10)

    figures = []
    if "openai" in providers:
        first = on_chat["openai"][0]
        figures.append(
            Figure.of(
                f"chat: token → SSE event latency, {runs} runs × {tokens} tokens",
                "ms",
                first.samples,
                "same model streamed directly",
                direct["openai"],
                goal="p99 added < 5 ms",
                events_per_second=round(first.events / first.seconds),
                api_seconds=round(first.seconds, 2),
                direct_seconds=round(direct_seconds, 2),
                added_p50_ms=round(
                    percentile(first.samples, 50) - percentile(direct["openai"], 50), 3
                ),
                added_p99_ms=round(
                    percentile(first.samples, 99) - percentile(direct["openai"], 99), 3
                ),
                api_gc_pauses=first.gc_pauses,
                api_cpu_us_per_event=round(first.api_cpu_us, 1),
                rounds=_chat_rounds(on_chat["openai"], direct["openai"]),
            )
        )
    if on_redis:
        figures.append(_redis_figure(on_redis, on_chat["openai"], runs, tokens))
    if "anthropic" in providers:
        figures.append(
            _anthropic_figure(
                on_chat["anthropic"], on_chat.get("openai", []), direct["anthropic"], runs, tokens
            )
        )
    figures += [
        _route_figure(
            route.path,
            provider,
            on_routes[(route.path, provider)],
            on_chat[provider],
            direct[provider],
            runs,
            tokens,
        )
        for route in routes
        for provider in providers
    ]
    # Quick mode (the test command's) and a selection never overwrite the full run's
    # committed figures.
    RESULTS.mkdir(exist_ok=True)
    result = {
        "quick": quick,
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "load_average": os.getloadavg(),
        "figures": [{**asdict(f), "ratio": f.ratio} for f in figures],
    }
    name = "chat-selected.json" if selected else "chat-quick.json" if quick else "chat.json"
    (RESULTS / name).write_text(json.dumps(result, indent=2) + "\n")
    return figures


def _chat_rounds(phases: list[Phase], direct: list[float]) -> list[dict]:
    """/chat's added latency in each round (the figure above is the first round's)."""
    return [
        {
            "added_p50_ms": round(percentile(p.samples, 50) - percentile(direct, 50), 3),
            "added_p99_ms": round(percentile(p.samples, 99) - percentile(direct, 99), 3),
            "api_cpu_us_per_event": round(p.api_cpu_us, 1),
        }
        for p in phases
    ]


@dataclass
class Phase:
    """One pass of the load through one API process."""

    samples: list[float]
    seconds: float
    events: int
    api_cpu_us: float  # the API's CPU per event
    gc_pauses: dict
    store_cpu_us: float = 0.0  # the Redis server's CPU per event
    store_writes: dict | None = None


def _phase(env: dict, runs: int, ramp: float, store_pid: int | None = None) -> Phase:
    return _phases(env, runs, ramp, [CHAT], store_pid)[0]


def _phases(
    env: dict, runs: int, ramp: float, routes: list[Route], store_pid: int | None = None
) -> list[Phase]:
    """The load through each route in turn, one API process for them all (the full run
    gives every route a fresh one; --quick shares one to stay short)."""
    phases = []
    with dev_server(**env) as server, _no_collector_pauses():
        for route in routes:
            samples: list[float] = []
            before = httpx.get(server.url + "/metrics").text
            cpu = cpu_seconds(server.pid)
            store_cpu = cpu_seconds(store_pid) if store_pid else 0.0
            seconds, events = _measure(_through_api(server.url, runs, samples, ramp, route))
            api_cpu_us = (cpu_seconds(server.pid) - cpu) / events * 1e6
            store_cpu_us = (cpu_seconds(store_pid) - store_cpu) / events * 1e6 if store_pid else 0.0
            metrics = httpx.get(server.url + "/metrics").text
            phases.append(
                Phase(
                    samples,
                    seconds,
                    events,
                    api_cpu_us,
                    _gc_pauses(metrics, before),
                    store_cpu_us,
                    _store_flushes(metrics) if store_pid else None,
                )
            )
    return phases


def _on_redis_store(env: dict, runs: int, ramp: float, tmp: Path) -> Phase | None:
    """The same load through an API whose runs live on a local Redis-protocol server."""
    if missing_reason():
        print(f"chat: Redis run store not measured — {missing_reason()}", flush=True)
        return None
    store = start_redis(tmp / "redis")
    try:
        redis_env = {
            **env,
            "SANDBOX_WORKSPACE_CHAT_RUN_STORE": "redis",
            "SANDBOX_WORKSPACE_CHAT_REDIS_URL": store.url,
        }
        return _phase(redis_env, runs, ramp, store.proc.pid)
    finally:
        store.stop()


def _compared(samples: list[float], direct: list[float], baseline: list[float], name: str):
    """p50 and p99 added over the direct stream; ``name``'s (the same rounds' phases the
    figure is held against) and how far from them."""
    figures = {}
    for q in (50, 99):
        figures[f"added_p{q}_ms"] = round(percentile(samples, q) - percentile(direct, q), 3)
        figures[f"{name}_p{q}_ms"] = round(percentile(baseline, q), 3)
        figures[f"vs_{name}_p{q}_ms"] = round(percentile(samples, q) - percentile(baseline, q), 3)
    return figures


def _anthropic_figure(
    phases: list[Phase], openai: list[Phase], direct: list[float], runs: int, tokens: int
) -> Figure:
    """The Messages provider's figures (every round pooled) against its stream read
    directly, and — the comparison that matters — against the OpenAI-compatible phases of
    the same rounds."""
    samples = [x for p in phases for x in p.samples]
    baseline = [x for p in openai for x in p.samples] or samples  # a selection without it
    return Figure.of(
        f"chat on the Anthropic Messages provider: token → SSE event latency, "
        f"{runs} runs × {tokens} tokens",
        "ms",
        samples,
        "same model's Messages stream read directly",
        direct,
        goal="p99 added < 5 ms, as the OpenAI-compatible provider",
        events_per_second=round(phases[0].events / phases[0].seconds),
        **_compared(samples, direct, baseline, "openai"),
        api_cpu_us_per_event=round(statistics.mean(p.api_cpu_us for p in phases), 1),
        openai_api_cpu_us_per_event=round(
            statistics.mean(p.api_cpu_us for p in openai or phases), 1
        ),
        api_gc_pauses=phases[0].gc_pauses,
        rounds=_chat_rounds(phases, direct),
    )


def _redis_figure(on_redis: list[Phase], in_process: list[Phase], runs: int, tokens: int):
    """Pooled samples of every round; the added latency is the median of the rounds'."""
    per_round = [
        {
            "added_p50_ms": round(percentile(r.samples, 50) - percentile(m.samples, 50), 3),
            "added_p99_ms": round(percentile(r.samples, 99) - percentile(m.samples, 99), 3),
            "api_cpu_us_per_event": round(r.api_cpu_us, 1),
            "in_process_api_cpu_us_per_event": round(m.api_cpu_us, 1),
            "redis_cpu_us_per_event": round(r.store_cpu_us, 1),
            "store_writes": r.store_writes,
            "api_gc_pauses": r.gc_pauses,
        }
        for r, m in zip(on_redis, in_process, strict=False)
    ]
    return Figure.of(
        f"chat on the Redis run store: token → SSE event latency, {runs} runs × {tokens} tokens",
        "ms",
        [x for r in on_redis for x in r.samples],
        f"in-process run store (same run, {len(on_redis)} alternating rounds)",
        [x for m in in_process[: len(on_redis)] for x in m.samples],
        goal="added p50 ≤ 1 ms, p99 ≤ 10 ms (median of the rounds)",
        events_per_second=round(on_redis[0].events / on_redis[0].seconds),
        added_p50_ms=statistics.median(r["added_p50_ms"] for r in per_round),
        added_p99_ms=statistics.median(r["added_p99_ms"] for r in per_round),
        rounds=per_round,
    )


def _route_figure(
    path: str,
    provider: str,
    phases: list[Phase],
    chat: list[Phase],
    direct: list[float],
    runs: int,
    tokens: int,
) -> Figure:
    """One route on one provider (every round pooled) against that provider's stream
    read directly and — "no regression on /chat" — against /chat's phases of the same
    rounds on the same provider (each round's difference listed too)."""
    samples = [x for p in phases for x in p.samples]
    baseline = [x for p in chat for x in p.samples]
    label = "Anthropic Messages" if provider == "anthropic" else "OpenAI-compatible"
    rounds = [
        {
            "p50_ms": round(percentile(r.samples, 50) - percentile(c.samples, 50), 3),
            "p99_ms": round(percentile(r.samples, 99) - percentile(c.samples, 99), 3),
        }
        for r, c in zip(phases, chat, strict=False)
    ]
    return Figure.of(
        f"chat via {path} ({label} provider): token → SSE event latency, "
        f"{runs} runs × {tokens} tokens",
        "ms",
        samples,
        f"same model's {label} stream read directly",
        direct,
        goal="p99 added < 5 ms, no regression on /api/v1/chat",
        route=path,
        provider=provider,
        events_per_second=round(phases[0].events / phases[0].seconds),
        **_compared(samples, direct, baseline, "chat"),
        vs_chat_rounds=rounds,
        # As the Redis store's figure: the median of the rounds' differences, which one
        # phase disturbed by the shared machine does not move (the pooled p99 above is).
        vs_chat_median_of_rounds_p50_ms=statistics.median(r["p50_ms"] for r in rounds),
        vs_chat_median_of_rounds_p99_ms=statistics.median(r["p99_ms"] for r in rounds),
        api_cpu_us_per_event=round(statistics.mean(p.api_cpu_us for p in phases), 1),
        chat_api_cpu_us_per_event=round(statistics.mean(p.api_cpu_us for p in chat), 1),
        api_gc_pauses=phases[0].gc_pauses,
    )


def main(argv: list[str] | None = None) -> None:
    by_name = {route.path.removeprefix("/api/v1/"): route for route in ROUTES}
    parser = argparse.ArgumentParser(
        prog="python -m bench.chat", description="Some chat routes beside /chat's phases."
    )
    parser.add_argument("--quick", action="store_true", help="10 runs × 50 tokens")
    parser.add_argument(
        "--routes", default=",".join(by_name), help=f"comma-separated: {', '.join(by_name)}"
    )
    parser.add_argument("--providers", default=",".join(PROVIDERS), help="openai, anthropic")
    parser.add_argument("--rounds", type=int, default=None, help="default: as the full run")
    args = parser.parse_args(argv)
    names = [n for n in args.routes.split(",") if n]
    providers = tuple(p for p in args.providers.split(",") if p)
    if unknown := set(names) - set(by_name):
        parser.error(f"unknown route(s) {sorted(unknown)}; choose from {sorted(by_name)}")
    if unknown := set(providers) - set(PROVIDERS):
        parser.error(f"unknown provider(s) {sorted(unknown)}; choose from {PROVIDERS}")
    figures = run(args.quick, [by_name[n] for n in names], providers, args.rounds)
    for f in figures:
        extra = f.extra
        line = f"{f.name}: p50 {f.p50:.2f} ms, p99 {f.p99:.2f} ms"
        if "vs_chat_p99_ms" in extra:
            each = ", ".join(f"{r['p99_ms']:+.1f}" for r in extra["vs_chat_rounds"])
            line += (
                f"; vs /chat p50 {extra['vs_chat_p50_ms']:+.2f} ms, p99 "
                f"{extra['vs_chat_p99_ms']:+.2f} ms (each round's p99: {each}; median "
                f"{extra['vs_chat_median_of_rounds_p99_ms']:+.2f})"
            )
        print(f"{line}; API CPU per event {extra.get('api_cpu_us_per_event')} µs", flush=True)


if __name__ == "__main__":
    main()
