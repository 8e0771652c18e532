"""The deletion guarantee and session incarnations on a real apiserver: what admission
refuses, what the finalizer waits for (orphaned claims, retained volumes), that an
operator restart starts no pod, and that a session deleted and recreated is not wedged.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from kubeenv import ApiError, KubeClient, NodeAgent, wait_until
from operator_env import (
    TIMEOUT,
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

from sandbox_workspace.operator.naming import (
    cleanup_pod_name,
    runtime_secret_name,
    workspace_claim_name,
)

pytestmark = pytest.mark.cluster

SESSION = "sb-session-alice"
CLAIM = workspace_claim_name(SESSION)


def claim_path(ns: str) -> str:
    return f"/api/v1/namespaces/{ns}/persistentvolumeclaims/{CLAIM}"


def pod_path(ns: str, name: str = SESSION) -> str:
    return f"/api/v1/namespaces/{ns}/pods/{name}"


def owners(obj: dict) -> list[str]:
    return [r["uid"] for r in obj["metadata"].get("ownerReferences") or []]


def claim_dir(api: KubeClient, agent: NodeAgent, ns: str) -> Path:
    return agent.claim_dir(api.get(claim_path(ns))["metadata"]["uid"])


def ready_reason(obj: dict) -> str | None:
    conds = {c["type"]: c for c in (obj.get("status") or {}).get("conditions", [])}
    return conds.get("Ready", {}).get("reason")


def create_workspace(api: KubeClient, ns: str, name: str, cid: str) -> dict:
    body = {
        "apiVersion": "sandboxworkspace.io/v1alpha1",
        "kind": "ConversationWorkspace",
        "metadata": {"name": name},
        "spec": {"conversationId": cid, "sessionRef": SESSION},
    }
    return api.create(cws_path(ns), body)


@pytest.mark.parametrize(
    "cid",
    [
        pytest.param("c1/uploads/x.csv", id="slash"),
        pytest.param("..", id="dot-dot"),
        pytest.param(".", id="dot"),
        pytest.param(".runtime", id="leading-dot"),
        pytest.param("a\\b", id="backslash"),
        pytest.param("a\nb", id="control"),
        pytest.param(" c1", id="leading-space"),
        pytest.param("é" * 128, id="256-bytes"),
    ],
)
def test_conversation_ids_the_runtime_refuses_are_refused_at_admission(
    kube_api: KubeClient, namespace: str, cid: str
):
    with pytest.raises(ApiError) as err:
        create_workspace(kube_api, namespace, "cws-bad", cid)
    assert err.value.status == 422, cid


def test_valid_ids_pass_admission_and_user_ids_are_checked(kube_api: KubeClient, namespace: str):
    for i, cid in enumerate(["c1", "conv 1.csv", "é" * 127, "ünï-côdé"]):
        create_workspace(kube_api, namespace, f"cws-{i}", cid)
    for user in ("a/b", "..", "x\ty"):
        with pytest.raises(ApiError) as err:
            make_session(kube_api, namespace, name="sb-session-bad", userId=user)
        assert err.value.status == 422, user


def test_orphaned_claim_keeps_the_finalizer_until_a_runtime_deleted_the_files(
    kube_api: KubeClient, namespace: str, operator, node_agent: NodeAgent
):
    session, runtime = running_session(kube_api, namespace)
    for cid in ("c1", "c2"):
        make_workspace(kube_api, namespace, cid)
        wait_phase(kube_api, cws_path(namespace, f"cws-{cid}"), "Ready")
        runtime.upload(cid, "data.csv", b"x,y\n")
    root = claim_dir(kube_api, node_agent, namespace)
    assert (root / "c1" / "uploads" / "temparea" / "data.csv").exists()

    # An administrator removes the session but keeps its children.
    kube_api.delete(
        sbs_path(namespace, SESSION),
        body={"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Orphan"},
    )
    kube_api.wait_gone(sbs_path(namespace, SESSION), timeout=TIMEOUT)
    # The garbage collector strips the owner references (it removes its orphan finalizer
    # only after that, but wait for what the rest depends on rather than assume it).
    for path in (
        claim_path(namespace),
        cws_path(namespace, "cws-c1"),
        cws_path(namespace, "cws-c2"),
    ):
        wait_until(
            lambda path=path: not owners(kube_api.get(path)),
            timeout=TIMEOUT,
            message=f"{path} to be orphaned",
        )
    assert (root / "c1").exists()  # the session object is gone; the files are not

    kube_api.delete(cws_path(namespace, "cws-c1"))
    kube_api.wait_gone(cws_path(namespace, "cws-c1"), timeout=TIMEOUT)
    assert not (root / "c1").exists()  # released only once a runtime deleted them
    assert (root / "c2" / "uploads" / "temparea" / "data.csv").exists()  # only c1's
    wait_event(kube_api, namespace, "CleanupPod")
    kube_api.wait_gone(pod_path(namespace, cleanup_pod_name(CLAIM)), timeout=TIMEOUT)

    # The same user's session again: the old pod is replaced, the orphaned claim adopted.
    make_session(kube_api, namespace)
    again = wait_phase(kube_api, sbs_path(namespace, SESSION), "Running")
    uid = again["metadata"]["uid"]
    assert owners(kube_api.get(claim_path(namespace))) == [uid]
    assert owners(kube_api.get(pod_path(namespace))) == [uid]
    r = runtime_of(kube_api, namespace, again).request("GET", "/v1/conversations/c2/uploads")
    assert [f["name"] for f in r.json()["files"]] == ["data.csv"]
    assert session["metadata"]["uid"] != uid


def test_retained_volume_keeps_the_finalizer(
    kube_api: KubeClient, namespace: str, operator, node_agent: NodeAgent
):
    _, runtime = running_session(kube_api, namespace)
    make_workspace(kube_api, namespace, "c1")
    wait_phase(kube_api, cws_path(namespace, "cws-c1"), "Ready")
    runtime.upload("c1", "data.csv", b"1")
    root = claim_dir(kube_api, node_agent, namespace)
    # The volume controller binds the claim on its own schedule (the pod may already run
    # on the claim's directory): wait for the binding, never read it once.
    bound = kube_api.wait_for(
        claim_path(namespace),
        lambda o: (
            bool(o["spec"].get("volumeName")) and (o.get("status") or {}).get("phase") == "Bound"
        ),
        timeout=TIMEOUT,
        message="the volume controller to bind the claim",
    )
    volume = bound["spec"]["volumeName"]
    kube_api.patch(
        f"/api/v1/persistentvolumes/{volume}",
        {"spec": {"persistentVolumeReclaimPolicy": "Retain"}},
    )
    # The session goes (and with it, by owner references, the claim and the workspace);
    # the volume stays with the files on it.
    kube_api.delete(sbs_path(namespace, SESSION))
    held = kube_api.wait_for(
        cws_path(namespace, "cws-c1"),
        lambda o: ready_reason(o) == "VolumeRetained",
        timeout=2 * TIMEOUT,  # pod, claim and volume go one after the other
        message="the finalizer to wait for the retained volume",
    )
    assert held["metadata"]["finalizers"] == ["sandboxworkspace.io/files"]
    assert (root / "c1" / "uploads" / "temparea" / "data.csv").exists()
    # The administrator's way out: wipe the volume and delete it.
    kube_api.delete(f"/api/v1/persistentvolumes/{volume}")
    kube_api.wait_gone(cws_path(namespace, "cws-c1"), timeout=TIMEOUT)


def test_operator_restart_with_stopped_sessions_starts_no_pod(
    kube_api: KubeClient, namespace: str, start_operator, node_agent: NodeAgent
):
    first = start_operator()
    _, runtime = running_session(kube_api, namespace)
    if stats_count_as_activity(runtime):
        pytest.xfail("the runtime counts GET /v1/stats as activity, so no session is ever idle")
    make_workspace(kube_api, namespace, "c1")
    wait_phase(kube_api, cws_path(namespace, "cws-c1"), "Ready")
    # Stopped with its short timeout kept: nothing but a resume request may start it.
    stop_when_idle(kube_api, sbs_path(namespace, SESSION), then=None)
    kube_api.wait_gone(pod_path(namespace), timeout=TIMEOUT)
    first.stop()

    start_operator()
    # Several check intervals (0.5 s) of the new operator: still no pod, no resume asked.
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        assert kube_api.get_or_none(pod_path(namespace)) is None
        session = kube_api.get(sbs_path(namespace, SESSION))
        assert session["status"]["phase"] == "Stopped"
        assert "sandboxworkspace.io/resume-requested" not in session["metadata"].get(
            "annotations", {}
        )
        time.sleep(0.2)


def test_delete_and_recreate_a_session_is_not_wedged(
    kube_api: KubeClient, namespace: str, operator, node_agent: NodeAgent
):
    old, runtime = running_session(kube_api, namespace)
    runtime.upload("c1", "old.csv", b"1")
    kube_api.delete(sbs_path(namespace, SESSION))
    kube_api.wait_gone(sbs_path(namespace, SESSION), timeout=TIMEOUT)
    make_session(kube_api, namespace)  # at once: the old children may still be there

    new = wait_phase(kube_api, sbs_path(namespace, SESSION), "Running", timeout=60)
    uid = new["metadata"]["uid"]
    assert uid != old["metadata"]["uid"]
    for path in (
        pod_path(namespace),
        claim_path(namespace),
        f"/api/v1/namespaces/{namespace}/secrets/{runtime_secret_name(SESSION)}",
    ):
        assert owners(kube_api.get(path)) == [uid], path
    # A fresh claim: the deleted session's files are not there.
    r = runtime_of(kube_api, namespace, new).request("GET", "/v1/conversations/c1/uploads")
    assert r.status_code == 404 or r.json()["files"] == []


def test_storage_cannot_change_under_the_files(kube_api: KubeClient, namespace: str):
    make_session(kube_api, namespace)
    with pytest.raises(ApiError) as err:
        kube_api.patch(sbs_path(namespace, SESSION), {"spec": {"storage": {"persistent": False}}})
    assert err.value.status == 422 and "storage is immutable" in str(err.value)
    kube_api.delete(sbs_path(namespace, SESSION))
