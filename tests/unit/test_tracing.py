"""The pure rules of tracing (sandbox_workspace/tracing.py, operator/handlers/traced.py):
when the environment turns it on, how runtime calls are named, which operator work
continues the API's trace. The spans themselves: tests/api/test_tracing.py."""

from __future__ import annotations

import pytest

from sandbox_workspace import tracing
from sandbox_workspace.contract.crd import ANNOTATION_TRACEPARENT
from sandbox_workspace.operator.handlers.traced import parent_of

TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.mark.parametrize(
    ("environ", "wanted"),
    [
        pytest.param({}, False, id="nothing-set"),
        pytest.param({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, True, id="endpoint"),
        pytest.param(
            {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"},
            True,
            id="traces-endpoint",
        ),
        pytest.param({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, False, id="blank"),
        pytest.param(
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "TRUE"},
            False,
            id="sdk-disabled",
        ),
        pytest.param({"OTEL_SERVICE_NAME": "x"}, False, id="other-otel-only"),
    ],
)
def test_wanted(environ, wanted):
    assert tracing.wanted(environ) is wanted


@pytest.mark.parametrize(
    ("path", "route"),
    [
        ("/healthz", "/healthz"),
        ("/v1/stats", "/v1/stats"),
        ("/v1/uploads", "/v1/uploads"),
        ("/v1/conversations", "/v1/conversations"),
        ("/v1/conversations/c%2E1", "/v1/conversations/{conversation_id}"),
        ("/v1/conversations/c1/execute", "/v1/conversations/{conversation_id}/execute"),
        ("/v1/conversations/c1/uploads", "/v1/conversations/{conversation_id}/uploads"),
        (
            "/v1/conversations/c1/uploads/a%2Etxt",
            "/v1/conversations/{conversation_id}/uploads/{name}",
        ),
        (
            "/v1/conversations/c1/outputs/d/e/f.png",
            "/v1/conversations/{conversation_id}/outputs/{path}",
        ),
        (
            "/v1/conversations/c1/kernel/restart",
            "/v1/conversations/{conversation_id}/kernel/restart",
        ),
        pytest.param(
            "/v1/conversations/uploads/uploads/execute",
            "/v1/conversations/{conversation_id}/uploads/{name}",
            id="ids-that-look-like-keywords",
        ),
    ],
)
def test_runtime_route_has_no_ids(path, route):
    assert tracing.runtime_route(path) == route


CRS = "/apis/sandboxworkspace.io/v1alpha1/namespaces/s"


@pytest.mark.parametrize(
    ("path", "watch", "route"),
    [
        (f"{CRS}/sandboxsessions", False, "sandboxsessions"),
        (f"{CRS}/sandboxsessions", True, "sandboxsessions watch"),
        (f"{CRS}/sandboxsessions/sb-u/status", False, "sandboxsessions/status"),
        ("/api/v1/namespaces/s/secrets/sb-u-runtime", False, "secrets"),
        ("/api/v1/namespaces/s/pods/p/eviction", False, "pods/eviction"),
        ("/api/v1/namespaces/s", False, "namespaces"),
        ("/apis/coordination.k8s.io/v1/namespaces/s/leases/op", False, "leases"),
        ("/api/v1/nodes", False, "nodes"),
    ],
)
def test_kube_route_names_the_resource_not_the_object(path, watch, route):
    assert tracing.kube_route(path, watch) == route


@pytest.mark.parametrize(
    ("trigger", "annotations", "parent"),
    [
        pytest.param("create", {ANNOTATION_TRACEPARENT: TP}, TP, id="the-apis-create"),
        pytest.param("resume-requested", {ANNOTATION_TRACEPARENT: TP}, TP, id="the-apis-resume"),
        pytest.param("create", {}, None, id="create-without-one"),
        pytest.param("create", None, None, id="no-annotations"),
        pytest.param("resume", {ANNOTATION_TRACEPARENT: TP}, None, id="operator-restart"),
        pytest.param("update", {ANNOTATION_TRACEPARENT: TP}, None, id="spec-update"),
        pytest.param("pod-event", {ANNOTATION_TRACEPARENT: TP}, None, id="pod-event"),
        pytest.param("deadline", {ANNOTATION_TRACEPARENT: TP}, None, id="deadline"),
        pytest.param("delete", {ANNOTATION_TRACEPARENT: TP}, None, id="finalizer"),
    ],
)
def test_only_the_apis_own_writes_continue_its_trace(trigger, annotations, parent):
    assert parent_of(trigger, annotations) == parent


def test_off_costs_nothing_and_writes_nothing():
    assert not tracing.enabled()  # no test process sets tracing up
    assert tracing.span("a") is tracing.span("b", {"k": 1}, parent=TP)
    assert tracing.traceparent() is None
    assert tracing.with_traceparent({"k": "v"}, ANNOTATION_TRACEPARENT) == {"k": "v"}
    assert tracing.fastapi_telemetry()["tracing"] is False


def test_a_protocol_other_than_http_protobuf_is_refused(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    with pytest.raises(tracing.TracingConfigError, match="http/protobuf"):
        tracing.configure("test")
    assert not tracing.enabled()
