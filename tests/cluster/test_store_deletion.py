"""The deletion guarantee against writes in flight (store mode ``s3``, a real apiserver,
operator and SeaweedFS): an object whose write began before a conversation's DELETE
lands before its finalizer looks for the prefix to be empty — never after it let go.

The API announces each write on the ConversationWorkspace (``writers.…`` annotation
with a lease) and the finalizer waits for it; an announcement whose lease ended (its API
process died mid-write) is removed, and the prefix cleared after it."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest
from hold_proxy import HoldProxy
from kubeenv import KubeClient, wait_until
from kubeenv.stack import Stack
from operator_env import TIMEOUT, cws_path, make_workspace, running_session, sbs_path, wait_phase

from sandbox_workspace.contract import crd
from sandbox_workspace.operator import naming

pytestmark = pytest.mark.cluster

USER = "alice"
SID = naming.session_name_for(USER)
PREFIX = f"workspaces/default/{SID}/c1/"


def _reason(kube_api: KubeClient, path: str) -> str | None:
    cws = kube_api.get(path) or {}
    conditions = (cws.get("status") or {}).get("conditions") or []
    return next((c.get("reason") for c in conditions if c["type"] == "Ready"), None)


def test_an_upload_in_flight_through_the_delete_leaves_no_object(
    kube_control_plane, kube_api: KubeClient, namespace: str, start_operator, node_agent,
    seaweedfs, s3_bucket, tmp_path,
):  # fmt: skip
    """The API's write-back of an output is held at the store (a proxy in front of it)
    after the conversation's DELETE arrived: the finalizer waits for the write, and
    clears its object after it landed."""
    start_operator(store="s3", s3=seaweedfs.settings(s3_bucket))
    proxy = HoldProxy(seaweedfs.endpoint)
    env = {**seaweedfs.env(s3_bucket), "SANDBOX_WORKSPACE_S3__ENDPOINT_URL": proxy.url}
    stack = Stack(kube_control_plane.kubeconfig, namespace, tmp_path, api_env=env)
    path = cws_path(namespace, naming.workspace_name(SID, "c1"))
    base = f"/api/v1/sessions/{SID}"
    try:
        url = stack.start_api()
        with httpx.Client(base_url=url, headers={"X-User-Id": USER}, timeout=120) as api:
            r = api.post(
                f"{base}/files/upload", files={"file": ("in.csv", b"a,b\n")},
                data={"conversation_id": "c1"},
            )  # fmt: skip
            assert r.status_code == 201, r.text
            proxy.hold("late.txt")
            answers: list[httpx.Response] = []
            code = {
                "conversation_id": "c1",
                "language": "bash",
                "code": "echo x > outputs/late.txt",
            }
            writer = threading.Thread(
                target=lambda: answers.append(api.post(f"{base}/execute", json=code))
            )
            writer.start()
            wait_until(lambda: proxy.held, timeout=TIMEOUT, message="the write-back held")
            r = api.delete(f"{base}/conversations/c1")
            assert r.status_code in (200, 202), r.text
            # The finalizer waits for the writer it can see, instead of finding the
            # prefix empty now and letting go before the object lands.
            wait_until(
                lambda: _reason(kube_api, path) == "WritersInFlight",
                timeout=TIMEOUT,
                message="the finalizer waiting for the write in flight",
            )
            assert kube_api.get(path) is not None
            proxy.release()
            writer.join(TIMEOUT)
            assert answers and answers[0].status_code == 200, answers and answers[0].text
            kube_api.wait_gone(path, timeout=TIMEOUT)
        assert seaweedfs.list_keys(s3_bucket, PREFIX) == []
    finally:
        proxy.close()
        stack.stop_api()


def test_a_dead_writers_announcement_is_outwaited_and_its_object_cleared(
    kube_api: KubeClient, namespace: str, start_operator, node_agent, seaweedfs, s3_bucket,
):  # fmt: skip
    """What an API process killed mid-write leaves: its announcement (lease running,
    then ended) and an object that lands after the DELETE. The finalizer holds while
    the lease runs, removes the announcement once it ended, and clears the object."""
    from sandbox_workspace.store import S3Store

    start_operator(store="s3", s3=seaweedfs.settings(s3_bucket))
    running_session(kube_api, namespace)
    make_workspace(kube_api, namespace, "c1")
    path = cws_path(namespace, "cws-c1")
    wait_phase(kube_api, path, "Ready")  # the operator's finalizer is on
    writer = f"{crd.ANNOTATION_WRITER_PREFIX}w-dead"
    # A lease long enough for any machine while the test lands the late object (a fixed
    # 8 s could end first under load: the finalizer then never waited, or the object
    # landed after the lease); cut short once it landed, to be outwaited from there.
    lease_end = time.time() + 4 * TIMEOUT
    kube_api.patch(path, {"metadata": {"annotations": {writer: str(int(lease_end))}}})
    kube_api.delete(path)
    wait_until(
        lambda: _reason(kube_api, path) == "WritersInFlight",
        timeout=TIMEOUT,
        message="the finalizer waiting for the announced writer",
    )

    async def land() -> None:  # the dead writer's request, reaching the store late
        store = S3Store(seaweedfs.settings(s3_bucket))
        await store.put(PREFIX + "outputs/late.txt", b"late")
        await store.aclose()

    asyncio.run(land())
    assert kube_api.get(path) is not None and time.time() < lease_end, "the lease ran out"
    assert _reason(kube_api, path) == "WritersInFlight"  # held all along
    lease_end = time.time() + 2
    kube_api.patch(path, {"metadata": {"annotations": {writer: str(int(lease_end))}}})
    kube_api.wait_gone(path, timeout=TIMEOUT)
    assert time.time() >= int(lease_end), "let go before the lease ended"
    assert seaweedfs.list_keys(s3_bucket, PREFIX) == []


def test_a_tenants_conversation_is_cleared_from_its_own_keys(
    kube_control_plane, kube_api: KubeClient, namespace: str, start_operator, node_agent,
    seaweedfs, s3_bucket, tmp_path,
):  # fmt: skip
    """A caller of tenant acme has a session of its own (annotated with the tenant), its
    files under the tenant's keys, and the finalizer clears those keys."""
    start_operator(store="s3", s3=seaweedfs.settings(s3_bucket))
    stack = Stack(
        kube_control_plane.kubeconfig, namespace, tmp_path, api_env=seaweedfs.env(s3_bucket)
    )
    sid = naming.session_id_for(USER, "acme")
    prefix = f"workspaces/acme/{sid}/c1/"
    headers = {"X-User-Id": USER, "X-Tenant-Id": "acme"}
    try:
        url = stack.start_api()
        with httpx.Client(base_url=url, headers=headers, timeout=120) as api:
            r = api.post(
                f"/api/v1/sessions/{sid}/files/upload", files={"file": ("in.csv", b"a,b\n")},
                data={"conversation_id": "c1"},
            )  # fmt: skip
            assert r.status_code == 201, r.text
            session = kube_api.get(f"{sbs_path(namespace)}/{naming.session_name(sid)}")
            assert session["metadata"]["annotations"][crd.ANNOTATION_TENANT_ID] == "acme"
            assert kube_api.get_or_none(f"{sbs_path(namespace)}/{SID}") is None  # not the default's
            keys = [i.key for i in seaweedfs.list_keys(s3_bucket, prefix)]
            assert [k for k in keys if not k.startswith(prefix + ".sbw/shards/")] == [
                prefix + ".sbw/files.json",
                prefix + "uploads/temparea/in.csv",
            ]
            assert api.delete(f"/api/v1/sessions/{sid}/conversations/c1").status_code in (200, 202)
            path = cws_path(namespace, naming.workspace_name(naming.session_name(sid), "c1"))
            kube_api.wait_gone(path, timeout=TIMEOUT)
        assert seaweedfs.list_keys(s3_bucket, prefix) == []
    finally:
        stack.stop_api()
