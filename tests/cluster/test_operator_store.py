"""The deletion guarantee in store mode on a real apiserver, with a real SeaweedFS: a
ConversationWorkspace's finalizer lets go only once the runtime confirmed the cache
directory gone and no object is left under the conversation's store prefix — also for
a workspace whose session was gone before the operator looked (the operator deletes it)."""

from __future__ import annotations

import pytest
from kubeenv import KubeClient, NodeAgent
from operator_env import (
    TIMEOUT,
    cws_path,
    make_workspace,
    running_session,
    wait_event,
    wait_phase,
)

pytestmark = pytest.mark.cluster

PREFIX = "workspaces/default/sb-session-alice/"


def test_the_finalizer_empties_the_store_prefix(
    kube_api: KubeClient, namespace: str, start_operator, node_agent: NodeAgent, seaweedfs,
    s3_bucket,
):  # fmt: skip
    import asyncio

    from sandbox_workspace.store import S3Store

    start_operator(store="s3", s3=seaweedfs.settings(s3_bucket))
    _, runtime = running_session(kube_api, namespace)
    make_workspace(kube_api, namespace, "c1")
    wait_phase(kube_api, cws_path(namespace, "cws-c1"), "Ready")
    runtime.upload("c1", "data.csv", b"1")
    store = S3Store(seaweedfs.settings(s3_bucket))

    async def put(*keys: str) -> None:
        for key in keys:
            await store.put(key, b"x")

    asyncio.run(
        put(
            PREFIX + "c1/uploads/temparea/data.csv",
            PREFIX + "c1/.sbw/files.json",
            PREFIX + "c10/outputs/neighbour.txt",  # another conversation, same id start
        )
    )
    kube_api.delete(cws_path(namespace, "cws-c1"))
    kube_api.wait_gone(cws_path(namespace, "cws-c1"), timeout=TIMEOUT)
    keys = [i.key for i in seaweedfs.list_keys(s3_bucket, PREFIX)]
    assert keys == [PREFIX + "c10/outputs/neighbour.txt"]


def test_a_workspace_whose_session_is_gone_is_deleted_with_its_store_objects(
    kube_api: KubeClient, namespace: str, start_operator, node_agent: NodeAgent, seaweedfs,
    s3_bucket,
):  # fmt: skip
    # The session went before the operator looked (deleted, expired, or never made):
    # "ensure" once waited for it forever, keeping the conversation's objects.
    import asyncio

    from sandbox_workspace.store import S3Store

    store = S3Store(seaweedfs.settings(s3_bucket))

    async def put(*keys: str) -> None:
        for key in keys:
            await store.put(key, b"x")

    asyncio.run(put(PREFIX + "c1/uploads/temparea/data.csv", PREFIX + "c1/.sbw/files.json"))
    make_workspace(kube_api, namespace, "c1", as_the_api=True)
    start_operator(store="s3", s3=seaweedfs.settings(s3_bucket))
    kube_api.wait_gone(cws_path(namespace, "cws-c1"), timeout=TIMEOUT)
    assert list(seaweedfs.list_keys(s3_bucket, PREFIX)) == []
    wait_event(kube_api, namespace, "SessionGone")
