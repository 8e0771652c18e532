"""A real OTLP/HTTP trace receiver on loopback: it decodes what the exporters send
(``ExportTraceServiceRequest``, protobuf, optionally gzip) and keeps the spans.

What a collector's ``otlp`` receiver does on port 4318 for ``POST /v1/traces``, and
nothing more; tests read ``spans`` (or wait for them with ``wait_for``).
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict = field(hash=False)


def _value(any_value) -> object:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def decode(body: bytes) -> list[ReceivedSpan]:
    request = ExportTraceServiceRequest.FromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for s in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        service=str(resource.get("service.name", "")),
                        name=s.name,
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_span_id=s.parent_span_id.hex(),
                        kind=s.kind,
                        attributes={a.key: _value(a.value) for a in s.attributes},
                    )
                )
    return spans


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                spans = decode(body)
                with receiver._lock:
                    receiver.spans.extend(spans)
                    receiver.requests += 1
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def snapshot(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self.spans)

    def wait_for(
        self, found: Callable[[list[ReceivedSpan]], bool], timeout: float = 20.0
    ) -> list[ReceivedSpan]:
        """The spans once ``found`` says they are all there (AssertionError after
        ``timeout`` seconds, with what did arrive)."""
        deadline = time.monotonic() + timeout
        while True:
            spans = self.snapshot()
            if found(spans):
                return spans
            if time.monotonic() > deadline:
                names = sorted({(s.service, s.name) for s in spans})
                raise AssertionError(f"spans not received in {timeout}s; got {names}")
            time.sleep(0.05)


def ancestors(span: ReceivedSpan, spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
    """The span's parents up to its trace's root, nearest first (within ``spans``)."""
    by_id = {s.span_id: s for s in spans}
    chain = []
    while span.parent_span_id and span.parent_span_id in by_id:
        span = by_id[span.parent_span_id]
        chain.append(span)
    return chain
