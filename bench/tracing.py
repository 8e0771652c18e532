"""What tracing costs: ``bench chat --quick`` and ``bench execution --quick``, each run
with tracing off (no ``OTEL_EXPORTER_OTLP_ENDPOINT``: nothing set up) and on (exporting
every span over OTLP/HTTP to a receiver on loopback that decodes and counts them), in
the same run, rounds alternating off/on and on/off so drift on a shared machine hits
both alike. Opt-in: ``python -m bench tracing`` (it runs two suites twice per round).

Each figure is a measure of those suites with tracing on beside the same measure off;
``ratio`` is on/off. Results in ``bench/results/tracing.json`` (``tracing-quick.json``
with --quick: one round instead of three)."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from . import chat, execution
from .harness import Figure

RESULTS = Path(__file__).resolve().parent / "results"
ROUNDS = 3
# The measures compared: (suite figure name prefix, how to read it, unit, label).
MEASURES: list[tuple[str, Callable[[Figure], float], str, str]] = [
    ("chat: token → SSE event latency", lambda f: f.p50, "ms", "chat: token → SSE event p50"),
    ("chat: token → SSE event latency", lambda f: f.p99, "ms", "chat: token → SSE event p99"),
    (
        "chat: token → SSE event latency",
        lambda f: f.extra["api_cpu_us_per_event"],
        "µs",
        "chat: API CPU per event",
    ),
    ("execute python `1 + 1` (warm, confined)", lambda f: f.p50, "ms", "execute (warm) p50"),
    ("first call of a conversation (python)", lambda f: f.p50, "ms", "first execute p50"),
    ("execute bash `true` (fresh process)", lambda f: f.p50, "ms", "execute bash p50"),
]


class SpanCounter:
    """An OTLP/HTTP receiver on loopback that decodes each export and counts its spans."""

    def __init__(self) -> None:
        self.spans = 0
        lock = threading.Lock()
        counter = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                request = ExportTraceServiceRequest.FromString(body)
                found = sum(
                    len(scope.spans) for rs in request.resource_spans for scope in rs.scope_spans
                )
                with lock:
                    counter.spans += found
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextlib.contextmanager
def _endpoint(url: str | None) -> Iterator[None]:
    """The suites' API servers inherit this process's OTEL_* variables (harness.dev_server)."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("OTEL_")}
    for name in saved:
        del os.environ[name]
    if url:
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = url
    try:
        yield
    finally:
        os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
        os.environ.update(saved)


def _suites() -> list[Figure]:
    return chat.run(True) + execution.run(True)


def run(quick: bool) -> list[Figure]:
    rounds = 1 if quick else ROUNDS
    counter = SpanCounter()
    seen: dict[str, dict[str, list[float]]] = {
        label: {"on": [], "off": []} for *_, label in MEASURES
    }
    try:
        for i in range(rounds):
            for mode in ("off", "on") if i % 2 == 0 else ("on", "off"):
                with _endpoint(counter.url if mode == "on" else None):
                    figures = _suites()
                for prefix, read, _, label in MEASURES:
                    (figure,) = [f for f in figures if f.name.startswith(prefix)]
                    seen[label][mode].append(read(figure))
        # Spans leave every 5 s (the SDK's default): the last servers exported at their exit.
        spans = counter.spans
    finally:
        counter.close()
    assert spans > 0, "tracing on, yet no span reached the receiver"
    out = [
        Figure.of(
            f"{label}, traced",
            unit,
            seen[label]["on"],
            "not traced (same run)",
            seen[label]["off"],
            goal="ratio ≈ 1 (within the machine's noise)",
        )
        for _, _, unit, label in MEASURES
    ]
    RESULTS.mkdir(exist_ok=True)
    result = {
        "quick": quick,
        "rounds": rounds,
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "load_average": os.getloadavg(),
        "spans_received": spans,
        "figures": {
            f.name: {
                "on": seen[label]["on"],
                "off": seen[label]["off"],
                "ratio_of_medians": round(
                    statistics.median(seen[label]["on"]) / statistics.median(seen[label]["off"]),
                    3,
                ),
            }
            for f, (*_, label) in zip(out, MEASURES, strict=True)
        },
    }
    name = "tracing-quick.json" if quick else "tracing.json"
    (RESULTS / name).write_text(json.dumps(result, indent=2) + "\n")
    return out
