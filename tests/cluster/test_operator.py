"""The operator against a real apiserver, run in-process, with the test node agent
running each sandbox pod as a real runtime process on a 127.x address.

Every test gets its own namespace and its own operator watching only that namespace;
at teardown the test's sessions and workspaces are deleted while the operator still
runs (their finalizers need it), then the operator stops.
"""

from __future__ import annotations

import signal
import time

import httpx
import pytest
from kubeenv import ApiError, KubeClient, NodeAgent, wait_until
from operator_env import (
    TIMEOUT,
    conversation_dir,
    cws_path,
    make_session,
    make_workspace,
    running_session,
    runtime_of,
    sbs_path,
    stats_count_as_activity,
    stop_when_idle,
    wait_event,
    wait_phase,
)
from ports import free_port

from sandbox_workspace.operator.naming import runtime_secret_name, workspace_claim_name

pytestmark = pytest.mark.cluster

# -- sessions ---------------------------------------------------------------------------


def test_session_gets_a_locked_down_pod_and_runs(kube_api: KubeClient, namespace: str, operator):
    session, runtime = running_session(kube_api, namespace)
    status = session["status"]
    assert status["podName"] == "sb-session-alice"
    assert status["podIP"].startswith("127.")
    assert status["endpoint"] == f"http://{status['podIP']}:8080"
    assert status["observedGeneration"] == session["metadata"]["generation"]
    ready = {c["type"]: c for c in status["conditions"]}["Ready"]
    assert (ready["status"], ready["reason"]) == ("True", "RuntimeReady")
    assert runtime.request("GET", "/v1/stats").status_code == 200
    assert runtime.request("GET", "/v1/stats", token="x").status_code == 401

    uid = session["metadata"]["uid"]
    pod = kube_api.get(f"/api/v1/namespaces/{namespace}/pods/sb-session-alice")
    for child in (
        pod,
        kube_api.get(
            f"/api/v1/namespaces/{namespace}/secrets/{runtime_secret_name('sb-session-alice')}"
        ),
        kube_api.get(
            f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/"
            f"{workspace_claim_name('sb-session-alice')}"
        ),
    ):
        assert [r["uid"] for r in child["metadata"]["ownerReferences"]] == [uid]
    container = pod["spec"]["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["spec"]["automountServiceAccountToken"] is False
    # kopf keeps its bookkeeping in our annotations, never in our status.
    assert "kopf" not in session["status"]
    annotations = kube_api.get(sbs_path(namespace, "sb-session-alice"))["metadata"]["annotations"]
    assert not any(k.startswith("kopf.zalando.org") for k in annotations)
    # kopf posts Events from a queue of its own, after the status it reports on: waited
    # for, never read once (the phase Running can be read before the Event is posted).
    wait_until(
        lambda: any(
            e["involvedObject"]["uid"] == uid and e["reason"] == "RuntimeReady"
            for e in kube_api.list(f"/api/v1/namespaces/{namespace}/events")
        ),
        timeout=TIMEOUT,
        message="the session's Event RuntimeReady",
    )


def test_killed_runtime_pod_is_recreated(
    kube_api: KubeClient, namespace: str, operator, node_agent: NodeAgent
):
    session, runtime = running_session(kube_api, namespace)
    runtime.upload("c1", "keep.csv", b"a,b\n")
    old_uid = kube_api.get(f"/api/v1/namespaces/{namespace}/pods/sb-session-alice")["metadata"][
        "uid"
    ]
    node_agent.kill(namespace, "sb-session-alice")

    def replaced() -> dict | None:
        pod = kube_api.get_or_none(f"/api/v1/namespaces/{namespace}/pods/sb-session-alice")
        s = kube_api.get(sbs_path(namespace, "sb-session-alice"))
        fresh = pod and pod["metadata"]["uid"] != old_uid
        return s if fresh and s["status"].get("phase") == "Running" else None

    session = wait_until(replaced, timeout=TIMEOUT, message="a new pod, Running")
    files = runtime_of(kube_api, namespace, session).request("GET", "/v1/conversations/c1/uploads")
    assert [f["name"] for f in files.json()["files"]] == ["keep.csv"]  # the PVC kept them


def test_invalid_specs_are_rejected_by_the_apiserver(kube_api: KubeClient, namespace: str):
    for spec in (
        {},
        {"userId": ""},
        {"userId": "u", "idleTimeoutSeconds": -1},
        {"userId": "u", "storage": {"size": "lots"}},
        {"userId": "u", "fileUploadConfig": {"maxFileSizeUnit": "PB"}},
    ):
        with pytest.raises(ApiError) as err:
            make_session(kube_api, namespace, name="sb-session-bad", **spec) if spec else (
                kube_api.create(
                    sbs_path(namespace),
                    {
                        "apiVersion": "sandboxworkspace.io/v1alpha1",
                        "kind": "SandboxSession",
                        "metadata": {"name": "x"},
                        "spec": {},
                    },
                )
            )
        assert err.value.status == 422, spec
    make_session(kube_api, namespace, name="sb-session-ok")
    with pytest.raises(ApiError) as err:
        kube_api.patch(sbs_path(namespace, "sb-session-ok"), {"spec": {"userId": "mallory"}})
    assert err.value.status == 422 and "immutable" in str(err.value)
    with pytest.raises(ApiError) as err:
        make_workspace(kube_api, namespace, "c", session="Not_A_Name")
    assert err.value.status == 422
    kube_api.delete(sbs_path(namespace, "sb-session-ok"))


def test_printer_columns(kube_api: KubeClient, namespace: str, operator):
    running_session(kube_api, namespace)
    make_workspace(kube_api, namespace, "conv-1")
    wait_phase(kube_api, cws_path(namespace, "cws-conv-1"), "Ready")
    table = "application/json;as=Table;v=v1;g=meta.k8s.io"
    for path, expected in (
        (
            sbs_path(namespace),
            ["Name", "User", "Phase", "Pod", "Age", "Idle-Since", "Expires", "Egress"],
        ),
        (cws_path(namespace), ["Name", "Conversation", "Session", "Phase", "Files", "Age"]),
    ):
        body = kube_api._http.get(path, headers={"Accept": table}).json()
        columns = [c["name"] for c in body["columnDefinitions"] if c["priority"] == 0]
        assert columns == expected
        row = dict(
            zip(
                [c["name"] for c in body["columnDefinitions"]],
                body["rows"][0]["cells"],
                strict=True,
            )
        )
        assert row["Phase"] in ("Running", "Ready")
    assert row["Files"] == 0 and row["Conversation"] == "conv-1"


# -- conversation workspaces ------------------------------------------------------------


def test_conversation_directory_is_created_and_deleted(
    kube_api: KubeClient, namespace: str, operator, node_agent: NodeAgent
):
    session, runtime = running_session(kube_api, namespace)
    make_workspace(kube_api, namespace, "conv-1")
    cws = wait_phase(kube_api, cws_path(namespace, "cws-conv-1"), "Ready")
    assert cws["metadata"]["finalizers"] == ["sandboxworkspace.io/files"]
    assert cws["metadata"]["ownerReferences"][0]["uid"] == session["metadata"]["uid"]
    directory = conversation_dir(node_agent, namespace, "conv-1")
    # The runtime's root ("/workspace" in a real pod; the agent's directory here).
    assert cws["status"]["path"] == str(directory)
    assert directory.is_dir()
    runtime.upload("conv-1", "data.csv", b"x,y\n1,2\n")
    assert (directory / "uploads" / "temparea" / "data.csv").exists()

    kube_api.delete(cws_path(namespace, "cws-conv-1"))
    kube_api.wait_gone(cws_path(namespace, "cws-conv-1"), timeout=TIMEOUT)
    assert not directory.exists()
    assert runtime.request("GET", "/v1/conversations/conv-1").json()["exists"] is False


def test_finalizer_holds_while_the_runtime_is_unreachable(
    kube_api: KubeClient, namespace: str, operator, node_agent: NodeAgent
):
    _, runtime = running_session(kube_api, namespace)
    make_workspace(kube_api, namespace, "conv-1")
    wait_phase(kube_api, cws_path(namespace, "cws-conv-1"), "Ready")
    runtime.upload("conv-1", "data.csv", b"1")
    directory = conversation_dir(node_agent, namespace, "conv-1")

    node_agent.kill(namespace, "sb-session-alice", signal.SIGSTOP)  # alive, not answering
    try:
        kube_api.delete(cws_path(namespace, "cws-conv-1"))
        kube_api.wait_for(
            cws_path(namespace, "cws-conv-1"),
            lambda o: (
                {c["type"]: c for c in o["status"].get("conditions", [])}.get("Ready", {}).get(
                    "reason"
                )
                == "RuntimeUnavailable"
            ),
            timeout=TIMEOUT,
            message="deletion to report the runtime unreachable",
        )
        # Several retries later the files and the finalizer are still there.
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            held = kube_api.get(cws_path(namespace, "cws-conv-1"))
            assert held["metadata"]["finalizers"] == ["sandboxworkspace.io/files"]
            assert held["status"]["phase"] == "Deleting"
            assert directory.exists()
            time.sleep(0.2)
    finally:
        node_agent.kill(namespace, "sb-session-alice", signal.SIGCONT)
    kube_api.wait_gone(cws_path(namespace, "cws-conv-1"), timeout=TIMEOUT)
    assert not directory.exists()


def test_deletion_completes_across_an_operator_restart(
    kube_api: KubeClient, namespace: str, start_operator, node_agent: NodeAgent
):
    first = start_operator()
    _, runtime = running_session(kube_api, namespace)
    make_workspace(kube_api, namespace, "conv-1")
    wait_phase(kube_api, cws_path(namespace, "cws-conv-1"), "Ready")
    runtime.upload("conv-1", "data.csv", b"1")
    node_agent.kill(namespace, "sb-session-alice", signal.SIGSTOP)
    try:
        kube_api.delete(cws_path(namespace, "cws-conv-1"))
        wait_phase(kube_api, cws_path(namespace, "cws-conv-1"), "Deleting")
        first.stop()
    finally:
        node_agent.kill(namespace, "sb-session-alice", signal.SIGCONT)
    assert kube_api.get(cws_path(namespace, "cws-conv-1"))["metadata"]["finalizers"]
    start_operator()
    kube_api.wait_gone(cws_path(namespace, "cws-conv-1"), timeout=TIMEOUT)
    assert not conversation_dir(node_agent, namespace, "conv-1").exists()


def test_finalizer_completes_after_the_runtime_crashed(
    kube_api: KubeClient, namespace: str, operator, node_agent: NodeAgent
):
    _, runtime = running_session(kube_api, namespace)
    make_workspace(kube_api, namespace, "conv-1")
    wait_phase(kube_api, cws_path(namespace, "cws-conv-1"), "Ready")
    runtime.upload("conv-1", "data.csv", b"1")
    claim = kube_api.get(
        f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/"
        f"{workspace_claim_name('sb-session-alice')}"
    )
    directory = node_agent.claim_dir(claim["metadata"]["uid"]) / "conv-1"
    assert directory.exists()
    node_agent.kill(namespace, "sb-session-alice")  # SIGKILL: the pod fails
    kube_api.delete(cws_path(namespace, "cws-conv-1"))
    kube_api.wait_gone(cws_path(namespace, "cws-conv-1"), timeout=TIMEOUT)
    assert not directory.exists()


# -- idle stop, resume, TTL, garbage collection -----------------------------------------


def test_idle_session_stops_and_resumes_with_its_files(
    kube_api: KubeClient, namespace: str, operator, node_agent: NodeAgent
):
    _, runtime = running_session(kube_api, namespace)
    if stats_count_as_activity(runtime):
        pytest.xfail("the runtime counts GET /v1/stats as activity, so no session is ever idle")
    runtime.upload("conv-1", "data.csv", b"kept")
    session = stop_when_idle(kube_api, sbs_path(namespace, "sb-session-alice"))
    stopped = {c["type"]: c for c in session["status"]["conditions"]}["Stopped"]
    assert (stopped["status"], stopped["reason"]) == ("True", "IdleTimeout")
    assert session["status"].get("endpoint") is None
    kube_api.wait_gone(f"/api/v1/namespaces/{namespace}/pods/sb-session-alice", timeout=TIMEOUT)
    assert kube_api.get_or_none(
        f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/"
        f"{workspace_claim_name('sb-session-alice')}"
    )

    kube_api.patch(
        sbs_path(namespace, "sb-session-alice"),
        {"metadata": {"annotations": {"sandboxworkspace.io/resume-requested": "now"}}},
    )
    session = wait_phase(kube_api, sbs_path(namespace, "sb-session-alice"), "Running")
    # Removed by a patch of its own after the status write that acted on it: waited for.
    resume = "sandboxworkspace.io/resume-requested"
    kube_api.wait_for(
        sbs_path(namespace, "sb-session-alice"),
        lambda o: resume not in o["metadata"].get("annotations", {}),
        timeout=TIMEOUT,
        message="the resume request removed",
    )
    resumed = runtime_of(kube_api, namespace, session)
    r = resumed.request("GET", "/v1/conversations/conv-1/uploads/data.csv")
    assert r.content == b"kept"


def test_deleting_a_stopped_sessions_conversation_resumes_it(
    kube_api: KubeClient, namespace: str, operator, node_agent: NodeAgent
):
    _, runtime = running_session(kube_api, namespace)
    if stats_count_as_activity(runtime):
        pytest.xfail("the runtime counts GET /v1/stats as activity, so no session is ever idle")
    make_workspace(kube_api, namespace, "conv-1")
    wait_phase(kube_api, cws_path(namespace, "cws-conv-1"), "Ready")
    stop_when_idle(kube_api, sbs_path(namespace, "sb-session-alice"))
    kube_api.delete(cws_path(namespace, "cws-conv-1"))
    kube_api.wait_gone(cws_path(namespace, "cws-conv-1"), timeout=TIMEOUT)
    session = kube_api.get(sbs_path(namespace, "sb-session-alice"))
    runtime = runtime_of(
        kube_api,
        namespace,
        wait_phase(kube_api, sbs_path(namespace, "sb-session-alice"), "Running"),
    )
    assert runtime.request("GET", "/v1/conversations/conv-1").json()["exists"] is False
    assert session is not None


def _children_gone(api: KubeClient, ns: str) -> bool:
    return not any(
        api.get_or_none(path)
        for path in (
            f"/api/v1/namespaces/{ns}/pods/sb-session-alice",
            f"/api/v1/namespaces/{ns}/secrets/{runtime_secret_name('sb-session-alice')}",
            f"/api/v1/namespaces/{ns}/persistentvolumeclaims/"
            f"{workspace_claim_name('sb-session-alice')}",
        )
    ) and not api.list(cws_path(ns))


def test_ttl_deletes_the_session_and_everything_in_it(
    kube_api: KubeClient, namespace: str, operator
):
    # The workspace may be adopted before the session expires (the garbage collector
    # deletes it) or find the session gone (the operator deletes it): either way it goes.
    make_session(kube_api, namespace, ttlSeconds=3)
    make_workspace(kube_api, namespace, "conv-1", as_the_api=True)
    kube_api.wait_gone(sbs_path(namespace, "sb-session-alice"), timeout=TIMEOUT)
    wait_event(kube_api, namespace, "Expired")  # deleted by its TTL, not otherwise
    wait_until(
        lambda: _children_gone(kube_api, namespace),
        # pod, then claim, then volume: the finalizer waits for the storage to be gone
        timeout=2 * TIMEOUT,
        message="pod, secret, PVC and workspaces to be collected",
    )


def test_deleting_a_session_collects_its_children(kube_api: KubeClient, namespace: str, operator):
    running_session(kube_api, namespace)
    make_workspace(kube_api, namespace, "conv-1")
    wait_phase(kube_api, cws_path(namespace, "cws-conv-1"), "Ready")
    kube_api.delete(sbs_path(namespace, "sb-session-alice"))
    kube_api.wait_gone(sbs_path(namespace, "sb-session-alice"), timeout=TIMEOUT)
    wait_until(
        lambda: _children_gone(kube_api, namespace),
        # pod, then claim, then volume: the finalizer waits for the storage to be gone
        timeout=2 * TIMEOUT,
        message="pod, secret, PVC and workspaces to be collected",
    )


def test_a_workspace_made_as_its_session_is_deleted_goes_with_it(
    kube_api: KubeClient, namespace: str, operator
):
    # The API's race: a conversation opened just as its session's deletion began. A
    # finalizer of the test's holds the session "being deleted"; its workspace is
    # deleted meanwhile, not adopted (the garbage collector would take it only once
    # the session is gone) nor given a directory in the dying session.
    hold, path = "test.sandboxworkspace.io/hold", sbs_path(namespace, "sb-session-alice")
    cws = cws_path(namespace, "cws-conv-1")
    make_session(kube_api, namespace)
    kube_api.patch(path, {"metadata": {"finalizers": [hold]}})
    kube_api.delete(path)
    try:
        # Held by the test too: without it the operator may delete the workspace and
        # drop its files finalizer between two polls, and the deletion is never seen.
        make_workspace(kube_api, namespace, "conv-1", as_the_api=True, held_by=hold)
        dying = kube_api.wait_for(
            cws,
            lambda o: (
                bool(o["metadata"].get("deletionTimestamp"))
                and o["metadata"].get("finalizers") == [hold]
            ),
            timeout=TIMEOUT,
            message="the workspace of a session being deleted to be deleted, files released",
        )
        assert not dying["metadata"].get("ownerReferences")
        assert kube_api.get(path)["metadata"]["deletionTimestamp"]  # still held
    finally:
        if kube_api.get_or_none(cws):
            kube_api.patch(cws, {"metadata": {"finalizers": None}})
        kube_api.patch(path, {"metadata": {"finalizers": None}})
    kube_api.wait_gone(cws, timeout=2 * TIMEOUT)


def test_liveness_and_metrics(kube_api: KubeClient, namespace: str, start_operator):
    metrics, live = free_port(), free_port()
    start_operator(
        metrics_port=metrics,
        metrics_host="127.0.0.1",
        liveness_endpoint=f"http://127.0.0.1:{live}/healthz",
    )
    running_session(kube_api, namespace)
    make_workspace(kube_api, namespace, "conv-1")
    wait_phase(kube_api, cws_path(namespace, "cws-conv-1"), "Ready")
    kube_api.delete(cws_path(namespace, "cws-conv-1"))
    kube_api.wait_gone(cws_path(namespace, "cws-conv-1"), timeout=TIMEOUT)

    def get(url: str) -> httpx.Response:
        return httpx.get(url, timeout=5, trust_env=False)

    assert get(f"http://127.0.0.1:{live}/healthz").status_code == 200
    text = get(f"http://127.0.0.1:{metrics}/metrics").text
    assert 'sandbox_operator_sessions{phase="Running"} 1.0' in text
    assert "sandbox_operator_workspace_deletion_seconds_count 1.0" in text
    assert 'sandbox_operator_reconciles_total{kind="ConversationWorkspace",outcome="ok"}' in text
