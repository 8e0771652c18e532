"""Traces across the API → operator boundary, on the real control plane: the API and the
operator as subprocesses exporting to one OTLP/HTTP receiver on loopback. The first
upload of a user creates the SandboxSession and the ConversationWorkspace; the operator's
reconciles of both creations are spans of the upload's own trace, carried there on the
custom resources (annotation ``sandboxworkspace.io/traceparent``)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import httpx
import pytest
from kubeenv.stack import Stack
from otlp_receiver import OtlpReceiver, ReceivedSpan

pytestmark = pytest.mark.cluster

UPLOAD = "POST /api/v1/sessions/{session_id}/files/upload"


@pytest.fixture
def otlp() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver().start()
    yield receiver
    receiver.stop()


@pytest.fixture
def traced_stack(kube_control_plane, kube_api, node_agent, namespace, tmp_path, otlp):
    otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url, "OTEL_BSP_SCHEDULE_DELAY": "50"}
    stack = Stack(
        kube_control_plane.kubeconfig, namespace, tmp_path, operator_env=otel, api_env=otel
    )
    with stack.running(kube_api) as url:
        yield url


def test_the_operators_reconciles_of_an_uploads_resources_are_in_its_trace(
    traced_stack, kube_api, namespace, otlp
):
    trace_id = secrets.token_hex(16)
    r = httpx.post(
        f"{traced_stack}/api/v1/sessions/sb-session-tina/files/upload",
        headers={"X-User-Id": "tina", "traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"},
        files={"file": ("a.txt", b"hello")},
        data={"conversation_id": "c1"},
        timeout=120,
    )
    assert r.status_code == 201, r.text

    def operator_spans(spans: list[ReceivedSpan]) -> dict[str, ReceivedSpan]:
        return {
            s.name: s
            for s in spans
            if s.trace_id == trace_id
            and s.service == "sandbox-workspace-operator"
            and s.attributes.get("sandboxworkspace.trigger") == "create"
        }

    def whole(spans: list[ReceivedSpan]) -> bool:
        # Each process exports on its own clock, and the API's request span ends only after
        # its answer was sent: the operator's spans can arrive before the API's own. Wait
        # for every span the assertions read: the operator's two, the request, and the
        # parents the operator's spans name.
        mine = operator_spans(spans)
        ids = {s.span_id for s in spans if s.trace_id == trace_id}
        return (
            {"operator.reconcile", "operator.workspace"} <= set(mine)
            and any(s.trace_id == trace_id and s.name == UPLOAD for s in spans)
            and all(s.parent_span_id in ids for s in mine.values())
        )

    spans = otlp.wait_for(whole)
    mine = operator_spans(spans)
    by_id = {s.span_id: s for s in spans if s.trace_id == trace_id}
    (request,) = [s for s in by_id.values() if s.name == UPLOAD]
    assert request.service == "sandbox-workspace-api"
    session = mine["operator.reconcile"]
    assert session.attributes["sandboxworkspace.name"] == "sb-session-tina"
    # Its parent is the API's span that created the resource (session.ensure).
    assert by_id[session.parent_span_id].name == "session.ensure"
    workspace = mine["operator.workspace"]
    assert workspace.attributes["sandboxworkspace.kind"] == "ConversationWorkspace"
    assert by_id[workspace.parent_span_id].service == "sandbox-workspace-api"
    # ... and the operator's runtime calls are in it too.
    calls = otlp.wait_for(
        lambda spans: any(
            s.parent_span_id == workspace.span_id and s.name.startswith("runtime ") for s in spans
        )
    )
    assert {s.trace_id for s in calls if s.parent_span_id == workspace.span_id} == {trace_id}
    # What carried it: the annotation on the custom resource.
    cr = kube_api.get(
        f"/apis/sandboxworkspace.io/v1alpha1/namespaces/{namespace}/sandboxsessions/sb-session-tina"
    )
    carried = cr["metadata"]["annotations"]["sandboxworkspace.io/traceparent"]
    assert carried.split("-")[1] == trace_id
    # The operator's own later work (the pod's events) starts traces of its own.
    later = [
        s
        for s in otlp.snapshot()
        if s.service == "sandbox-workspace-operator"
        and s.attributes.get("sandboxworkspace.trigger") == "pod-event"
    ]
    assert all(s.trace_id != trace_id for s in later)
