"""Traces over OTLP (sandbox_workspace/tracing.py): a real API process exporting to a real
OTLP/HTTP receiver on loopback; an upload and a chat run each arrive as one trace, from
the API's request span down to the runtime call. And with no endpoint set, nothing is
set up at all."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest
from otlp_receiver import OtlpReceiver, ReceivedSpan, ancestors
from scripted_llm import Reply, text_reply, tool_reply, tool_results
from sse_stream import Stream, kinds

pytestmark = pytest.mark.local_backend

UPLOAD = "POST /api/v1/sessions/{session_id}/files/upload"
EXECUTE = "runtime POST /v1/conversations/{conversation_id}/execute"


@pytest.fixture(scope="module")
def otlp() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver().start()
    yield receiver
    receiver.stop()


@pytest.fixture(scope="module")
def traced_server(start_server, scripted_llm_server, chat_env_factory, otlp):
    return start_server(
        "dev",
        "--data-dir",
        "data",
        **chat_env_factory(
            scripted_llm_server,
            OTEL_EXPORTER_OTLP_ENDPOINT=otlp.url,
            OTEL_BSP_SCHEDULE_DELAY="50",  # ms: export promptly, the test waits for it
        ),
    )


@pytest.fixture
def client(traced_server, user) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=traced_server.url, headers={"X-User-Id": user}, timeout=60
    ) as client:
        yield client


def in_trace(spans: list[ReceivedSpan], trace_id: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.trace_id == trace_id]


def named(spans: list[ReceivedSpan], name: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.name == name]


def test_an_upload_is_one_trace_from_the_callers_span_to_the_runtime(client, user, otlp):
    trace_id, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    r = client.post(
        f"/api/v1/sessions/sb-session-{user}/files/upload",
        files={"file": ("a.txt", b"hello")},
        data={"conversation_id": "c1"},
        headers={"traceparent": f"00-{trace_id}-{caller_span}-01"},
    )
    assert r.status_code == 201, r.text

    def complete(spans: list[ReceivedSpan]) -> bool:
        mine = in_trace(spans, trace_id)
        return bool(named(mine, UPLOAD) and named(mine, "runtime POST /v1/uploads"))

    spans = in_trace(otlp.wait_for(complete), trace_id)
    (request,) = named(spans, UPLOAD)
    assert request.parent_span_id == caller_span  # the caller's trace goes on
    assert request.service == "sandbox-workspace-api"
    assert request.attributes["http.response.status_code"] == 201
    assert request.attributes["http.route"] == "/api/v1/sessions/{session_id}/files/upload"
    (runtime_call,) = named(spans, "runtime POST /v1/uploads")
    assert request in ancestors(runtime_call, spans)
    assert runtime_call.attributes["http.response.status_code"] == 201
    # The seed's EnsureSandboxSession span (000 §8.3), in the same trace.
    ensure = named(spans, "session.ensure")
    assert ensure and ensure[0].attributes["user_id"] == user
    assert request in ancestors(ensure[0], spans)


def code_then_answer(body: dict) -> Reply:
    if not tool_results(body):
        return tool_reply("execute_code", {"code": "print(6 * 7)"})
    return text_reply("42")


def test_a_chat_run_is_one_trace_run_tool_runtime_execute(client, user, otlp, scripted_llm):
    scripted_llm.responder = code_then_answer
    body = {"conversation_id": "c2", "query": "six times seven?"}
    with client.stream("POST", "/api/v1/chat", json=body) as r:
        assert r.status_code == 200
        run_id = r.headers["x-run-id"]
        events = Stream(r).rest()
    assert kinds(events)[-1] == "done" and "tool_end" in kinds(events)

    def complete(spans: list[ReceivedSpan]) -> bool:
        runs = [s for s in named(spans, "chat.run") if s.attributes.get("run_id") == run_id]
        return bool(runs and named(in_trace(spans, runs[0].trace_id), EXECUTE))

    spans = otlp.wait_for(complete)
    (run,) = [s for s in named(spans, "chat.run") if s.attributes.get("run_id") == run_id]
    spans = in_trace(spans, run.trace_id)
    (request,) = named(spans, "POST /api/v1/chat")
    assert request in ancestors(run, spans)
    assert run.attributes["conversation_id"] == "c2"
    (tool,) = named(spans, "chat.tool")
    assert tool.parent_span_id == run.span_id
    assert tool.attributes["gen_ai.tool.name"] == "execute_code"
    (execute,) = named(spans, EXECUTE)
    assert execute.parent_span_id == tool.span_id


def test_without_an_endpoint_nothing_is_set_up(tmp_path):
    """No OTEL_EXPORTER_OTLP_ENDPOINT: no SDK loaded, no provider, FastAPI's request spans
    off, no tracing transport wrapper (the Unix-socket routing of local runtimes wraps
    the plain pool), and ``span()`` is one shared null context."""
    probe = f"""
import json, sys
from opentelemetry import trace
from sandbox_workspace import tracing
from sandbox_workspace.api.app import create_app
from sandbox_workspace.api.settings import ApiSettings

app = create_app(ApiSettings(backend="local", auth_mode="dev", data_dir={str(tmp_path)!r}))
http = app.state.services.http
print(json.dumps({{
    "enabled": tracing.enabled(),
    "sdk_loaded": any(m.startswith("opentelemetry.sdk") for m in sys.modules),
    "provider": type(trace.get_tracer_provider()).__name__,
    "fastapi_tracing": app._native_telemetry.enabled(),
    "transport": type(getattr(http._transport, "default", http._transport)).__name__,
    "same_null_context": tracing.span("a") is tracing.span("b", {{"k": "v"}}),
    "traceparent": tracing.traceparent(),
}}))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "SANDBOX_"))}
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {
        "enabled": False,
        "sdk_loaded": False,
        "provider": "ProxyTracerProvider",
        "fastapi_tracing": False,
        "transport": "AiohttpTransport",
        "same_null_context": True,
        "traceparent": None,
    }
