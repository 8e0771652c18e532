"""Forks and snapshots on a real apiserver and operator (store mode ``s3``, the API as a
process, a real SeaweedFS): a fork is a conversation of its own — its own
ConversationWorkspace with the files finalizer, its own objects — so deleting the origin
leaves the fork's files and deleting the fork leaves the origin's; deleting a
conversation deletes its snapshots (issue 38, items 2 and 4); a fork the API died in
right after its ConversationWorkspace was created completes when asked again."""

from __future__ import annotations

import threading

import httpx
import pytest
from api_calls import execute
from hold_proxy import HoldProxy
from kubeenv import KubeClient, wait_until
from kubeenv.stack import Stack
from operator_env import TIMEOUT, cws_path

from sandbox_workspace.api.backends.base import ForkOrigin
from sandbox_workspace.contract import crd
from sandbox_workspace.operator import naming

pytestmark = pytest.mark.cluster

USER = "fern"
SID = naming.session_name_for(USER)
BASE = f"/api/v1/sessions/{SID}"
CONV = f"{BASE}/conversations"
READ_BOTH = "print(open('uploads/temparea/in.csv').read() + open('outputs/o.txt').read())"


def _keys(seaweedfs, bucket: str, cid: str = "") -> list[str]:
    """Every key under the conversation's prefix (the session's, without ``cid``)."""
    prefix = f"workspaces/default/{SID}/" + (f"{cid}/" if cid else "")
    return [i.key for i in seaweedfs.list_keys(bucket, prefix)]


def _delete(api: httpx.Client, kube_api: KubeClient, namespace: str, cid: str) -> None:
    r = api.delete(f"{CONV}/{cid}")
    assert r.status_code in (200, 202), r.text
    kube_api.wait_gone(cws_path(namespace, naming.workspace_name(SID, cid)), timeout=TIMEOUT)


def test_a_fork_is_its_own_conversation_and_outlives_its_origin_and_the_reverse(
    store_stack: str, kube_api: KubeClient, namespace: str, seaweedfs, s3_bucket
):
    with httpx.Client(base_url=store_stack, headers={"X-User-Id": USER}, timeout=120) as api:
        r = api.post(
            f"{BASE}/files/upload", files={"file": ("in.csv", b"a,b\n1,2\n")},
            data={"conversation_id": "c1"},
        )  # fmt: skip
        assert r.status_code == 201, r.text
        code = "open('outputs/o.txt', 'w').write('made in c1')"
        assert execute(api, BASE, code, cid="c1")["exit_code"] == 0
        r = api.post(f"{CONV}/c1/snapshots", json={"name": "before the fork"})
        assert r.status_code == 201 and r.json()["file_count"] == 2, r.text
        r = api.post(f"{CONV}/c1/fork", json={"conversation_id": "f1"})
        assert r.status_code == 201 and r.json()["file_count"] == 2, r.text

        # Its own ConversationWorkspace, with the finalizer that proves its deletion.
        cws = kube_api.get(cws_path(namespace, naming.workspace_name(SID, "f1")))
        assert cws is not None and crd.FINALIZER_FILES in cws["metadata"]["finalizers"]
        assert cws["spec"]["conversationId"] == "f1"
        origin_keys = _keys(seaweedfs, s3_bucket, "c1")
        assert any("/.sbw/snapshots/" in k for k in origin_keys), origin_keys
        assert len(_keys(seaweedfs, s3_bucket, "f1")) >= 2

        # The origin (and its snapshot) deleted: the fork keeps its files.
        _delete(api, kube_api, namespace, "c1")
        assert _keys(seaweedfs, s3_bucket, "c1") == []
        out = execute(api, BASE, READ_BOTH, cid="f1")
        assert out["stdout"] == "a,b\n1,2\nmade in c1\n", out

        # The reverse: a fork of the fork, then the fork (with a snapshot) deleted.
        assert api.post(f"{CONV}/f1/snapshots", json={}).status_code == 201
        r = api.post(f"{CONV}/f1/fork", json={"conversation_id": "f2"})
        assert r.status_code == 201, r.text
        _delete(api, kube_api, namespace, "f1")
        assert _keys(seaweedfs, s3_bucket, "f1") == []
        out = execute(api, BASE, READ_BOTH, cid="f2")
        assert out["stdout"] == "a,b\n1,2\nmade in c1\n", out
        _delete(api, kube_api, namespace, "f2")
    assert _keys(seaweedfs, s3_bucket) == []


def test_a_fork_the_api_died_in_after_its_resource_was_created_completes_when_asked_again(
    kube_control_plane, kube_api: KubeClient, namespace: str, start_operator, node_agent,
    seaweedfs, s3_bucket, tmp_path,
):  # fmt: skip
    """The kill window on kubernetes: the API SIGKILLed once the fork's
    ConversationWorkspace exists (its origin annotated in the create) and its store
    mark's write is held at the store (dropped, as a dead process's). Started again, the
    API completes the same fork asked again; another origin, and a conversation made by an
    execution, are 409 ``conversation_exists``; deleted, they leave nothing. Two API
    starts, one session pod and four deletions: ~10 s (its teardown ~8 s)."""
    start_operator(store="s3", s3=seaweedfs.settings(s3_bucket))
    proxy = HoldProxy(seaweedfs.endpoint)
    env = {**seaweedfs.env(s3_bucket), "SANDBOX_WORKSPACE_S3__ENDPOINT_URL": proxy.url}
    stack = Stack(kube_control_plane.kubeconfig, namespace, tmp_path, api_env=env)
    answers: list[object] = []
    try:
        url = stack.start_api()
        with httpx.Client(base_url=url, headers={"X-User-Id": USER}, timeout=120) as api:
            for cid, name in (("c1", "in.csv"), ("c2", "other.csv")):
                r = api.post(
                    f"{BASE}/files/upload", files={"file": (name, b"a,b\n")},
                    data={"conversation_id": cid},
                )  # fmt: skip
                assert r.status_code == 201, r.text

            def fork() -> None:
                try:
                    answers.append(api.post(f"{CONV}/c1/fork", json={"conversation_id": "f1"}))
                except httpx.HTTPError as e:
                    answers.append(e)

            proxy.hold("/f1/.sbw/fork.json")
            forker = threading.Thread(target=fork, daemon=True)
            forker.start()
            wait_until(lambda: proxy.held, timeout=TIMEOUT, message="the mark's write held")
            stack.stop_api(kill=True)
            proxy.drop()
            forker.join(TIMEOUT)
        assert answers and isinstance(answers[0], httpx.HTTPError), answers
        cws = kube_api.get(cws_path(namespace, naming.workspace_name(SID, "f1")))
        assert cws is not None
        annotations = cws["metadata"]["annotations"]
        assert annotations[crd.ANNOTATION_FORK_ORIGIN] == ForkOrigin("c1", None).to_json()
        assert not [k for k in _keys(seaweedfs, s3_bucket, "f1") if k.endswith("fork.json")]
        # The dead API's writer announcement would hold f1's finalizer for its 30 s lease
        # (test_store_deletion.py proves that wait); withdrawn here to keep the test short.
        dead = {k: None for k in annotations if k.startswith(crd.ANNOTATION_WRITER_PREFIX)}
        assert dead  # the fork was inside its write fence when the API died
        path = cws_path(namespace, naming.workspace_name(SID, "f1"))
        kube_api.patch(path, {"metadata": {"annotations": dead}})

        stack.api_env = seaweedfs.env(s3_bucket)
        url = stack.start_api()
        with httpx.Client(base_url=url, headers={"X-User-Id": USER}, timeout=120) as api:
            other = api.post(f"{CONV}/c2/fork", json={"conversation_id": "f1"})
            assert other.status_code == 409, other.text  # another origin
            done = api.post(f"{CONV}/c1/fork", json={"conversation_id": "f1"})
            assert done.status_code == 201 and done.json()["file_count"] == 1, done.text
            code = "print(open('uploads/temparea/in.csv').read())"
            assert execute(api, BASE, code, cid="f1")["stdout"] == "a,b\n\n"
            assert execute(api, BASE, "pass", cid="e1")["exit_code"] == 0  # made otherwise
            taken = api.post(f"{CONV}/c1/fork", json={"conversation_id": "e1"})
            assert taken.status_code == 409, taken.text
            assert taken.json()["error"]["code"] == "conversation_exists"
            for cid in ("f1", "e1", "c2", "c1"):
                _delete(api, kube_api, namespace, cid)
        assert _keys(seaweedfs, s3_bucket) == []
    finally:
        proxy.close()
        stack.stop_api()
