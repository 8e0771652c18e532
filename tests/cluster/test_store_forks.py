"""Forks and snapshots on a real apiserver and operator (store mode ``s3``, the API as a
process, a real SeaweedFS): a fork is a conversation of its own — its own
ConversationWorkspace with the files finalizer, its own objects — so deleting the origin
leaves the fork's files and deleting the fork leaves the origin's; deleting a
conversation deletes its snapshots (issue 38, items 2 and 4)."""

from __future__ import annotations

import httpx
import pytest
from api_calls import execute
from kubeenv import KubeClient
from operator_env import TIMEOUT, cws_path

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
