"""OpenTelemetry traces across the boundaries: API requests, the runtime calls they make,
chat runs and tool calls, and the operator's reconciles (seed 000 §8.3).

Contract:
- Off unless ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is
  set — and off when ``OTEL_SDK_DISABLED=true``. Off means nothing at all: no SDK
  provider, ``span()`` hands back one shared null context, ``traceparent()`` is None,
  FastAPI's request spans are off and the HTTP clients get no transport wrapper.
- On, ``configure(service)`` (idempotent, once per process) sets up the SDK with a batch
  processor and the OTLP/HTTP protobuf exporter, which read the standard ``OTEL_*``
  variables themselves (endpoint, headers, timeout, compression, ``OTEL_SERVICE_NAME``,
  ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``, ``OTEL_BSP_*``). Any
  ``OTEL_EXPORTER_OTLP_PROTOCOL`` but ``http/protobuf`` is refused at start: it would
  otherwise export nothing, silently.
- Span names (docs/operations.md lists them): ``{METHOD} {route}`` for an API request
  (FastAPI's own, kind server; a caller's ``traceparent`` header is its parent),
  ``runtime {METHOD}
  {route}`` for a call to a sandbox runtime (kind client; the ``traceparent`` header goes
  with it), ``session.ensure``, ``chat.run``, ``chat.tool``, and the operator's
  ``operator.reconcile``, ``operator.workspace``, ``operator.delete_files`` and
  ``operator.deadline``.
- The operator is reached through the custom resource: the API writes the W3C
  traceparent of its current span into the annotation ``sandboxworkspace.io/traceparent``
  with the create or resume it asks for (``with_traceparent``), and the operator's
  handler of that very change starts its span as a child (``span(..., parent=...)``);
  its other work (pod events, deadlines) starts traces of its own.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Mapping
from typing import Any

import httpx
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
_PROTOCOLS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
_NOTHING = contextlib.nullcontext()
_W3C = TraceContextTextMapPropagator()
# The process's tracer once configured (None: tracing off). Set once at start, read on
# every hook: the one piece of process state tracing needs.
_tracer: Tracer | None = None


class TracingConfigError(ValueError):
    """The OTEL_* settings ask for something this process cannot do."""


def wanted(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the environment asks for traces (see the module contract)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(environ.get(name, "").strip() for name in _ENDPOINTS)


def configure(service: str) -> bool:
    """Set up export over OTLP/HTTP when the environment asks for it; whether it is on.
    ``service`` is ``service.name`` unless ``OTEL_SERVICE_NAME`` says otherwise."""
    global _tracer
    if _tracer is not None:
        return True
    if not wanted():
        return False
    protocol = next((os.environ[p] for p in _PROTOCOLS if os.environ.get(p)), "http/protobuf")
    if protocol.strip() != "http/protobuf":
        raise TracingConfigError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol} is not supported: traces are exported "
            "over OTLP/HTTP (http/protobuf, the collector's port 4318)"
        )
    # Imported only here: a process without tracing never loads the SDK.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({SERVICE_NAME: os.environ.get("OTEL_SERVICE_NAME") or service})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    _tracer = provider.get_tracer("sandbox_workspace")
    return True


def enabled() -> bool:
    return _tracer is not None


def span(
    name: str,
    attributes: Mapping[str, Any] | None = None,
    *,
    parent: str | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
) -> contextlib.AbstractContextManager[Span | None]:
    """A span around the block, current inside it; with ``parent`` (a W3C traceparent),
    its child. Off: a shared null context (yields None)."""
    if _tracer is None:
        return _NOTHING
    context = _W3C.extract({"traceparent": parent}) if parent else None
    return _tracer.start_as_current_span(name, context, kind, attributes=attributes)


def traceparent() -> str | None:
    """The current span as a W3C traceparent, or None (off, or no span)."""
    if _tracer is None:
        return None
    carrier: dict[str, str] = {}
    _W3C.inject(carrier)
    return carrier.get("traceparent")


def with_traceparent(annotations: dict[str, str], key: str) -> dict[str, str]:
    """``annotations`` with the current traceparent under ``key`` when there is one."""
    current = traceparent()
    if current is not None:
        annotations[key] = current
    return annotations


# -- the API's requests -----------------------------------------------------------------


def fastapi_telemetry() -> dict[str, Any]:
    """FastAPI's own request spans (``FastAPI(telemetry=...)``): a server span per request
    named ``{METHOD} {route}``, a caller's ``traceparent`` as its parent — only when
    tracing is on. Not its spans of dependencies, endpoint and serialization (three more
    spans to build and export per request, for little), nor its metrics, logs or
    exporters (ours are Prometheus and the one exporter)."""
    return {
        "tracing": enabled(),
        "operation_spans": False,
        "metrics": False,
        "logs": False,
        "auto_configure": False,
    }


def _status(current: Span, status: int) -> None:
    current.set_attribute("http.response.status_code", status)
    if status >= 400:  # a client span: any error answer (semantic conventions)
        current.set_status(Status(StatusCode.ERROR))


# -- calls to sandbox runtimes -----------------------------------------------------------

_ID = {"conversations": "{conversation_id}", "uploads": "{name}", "outputs": "{path}"}
_RUNTIME_PATH = re.compile(r"^/(v1/|healthz$)")


def runtime_route(path: str) -> str:
    """The runtime route template of a request path: ids and file names become
    placeholders (``/v1/conversations/{conversation_id}/uploads/{name}``)."""
    parts = path.split("/")
    out: list[str] = []
    for part in parts:
        previous = out[-1] if out else ""  # a keyword only where it was taken as one
        if previous in _ID and len(out) >= 2:
            out.append(_ID[previous])
            if previous != "conversations":
                break  # a file name or an output path: the rest is part of it
        else:
            out.append(part)
    return "/".join(out)


_KUBE_PATH = re.compile(r"^/apis?/")


def kube_route(path: str, watch: bool = False) -> str:
    """What an apiserver request is about, without names: ``{resource}`` or
    ``{resource}/{subresource}`` (``sandboxsessions/status``), `` watch`` for a watch."""
    parts = [p for p in path.split("/") if p]
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:]  # past the group and version
    if rest[:1] == ["namespaces"] and len(rest) >= 3:
        rest = rest[2:]
    route = "/".join(rest[0:1] + rest[2:3]) or "?"
    return f"{route} watch" if watch else route


class TracedTransport(httpx.AsyncBaseTransport):
    """An httpx transport around another: a client span per request to a runtime (named
    by its route template) or to the apiserver (``kube {METHOD} {resource}``: where a
    session's start spends its writes), with the ``traceparent`` header sent along."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if _tracer is None:
            return await self.inner.handle_async_request(request)
        path = request.url.path
        if _RUNTIME_PATH.match(path):
            name = f"runtime {request.method} {runtime_route(path)}"
        elif _KUBE_PATH.match(path):
            watch = request.url.params.get("watch") in ("true", "1")
            name = f"kube {request.method} {kube_route(path, watch)}"
        else:
            name = f"HTTP {request.method}"
        attributes = {
            "http.request.method": request.method,
            "server.address": request.url.host,
            "server.port": request.url.port or 0,
        }
        with _tracer.start_as_current_span(name, kind=SpanKind.CLIENT, attributes=attributes) as s:
            carrier: dict[str, str] = {}
            _W3C.inject(carrier)
            request.headers.update(carrier)
            response = await self.inner.handle_async_request(request)
            _status(s, response.status_code)
            return response

    async def aclose(self) -> None:
        await self.inner.aclose()


def transport(inner: httpx.AsyncBaseTransport) -> httpx.AsyncBaseTransport:
    """``inner`` traced when tracing is on, ``inner`` itself when it is off."""
    return TracedTransport(inner) if _tracer is not None else inner
