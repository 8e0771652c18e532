"""operator/pool/spec.py and the pool's part of status.py: pure rules and builders."""

from __future__ import annotations

import copy
import json

import pytest

from sandbox_workspace.operator.builders import build_sandbox_pod, spec_hash
from sandbox_workspace.operator.models import SandboxSession, SandboxSessionSpec
from sandbox_workspace.operator.pool.spec import (
    CLAIM_ENV,
    POOL_SECRET,
    build_pool_pod,
    claim_patch,
    is_free,
    key_id,
    misfits,
    template_hash,
)
from sandbox_workspace.operator.settings import OperatorSettings
from sandbox_workspace.operator.status import observe_pod, session_pod_name

BODY = {
    "apiVersion": "sandboxworkspace.io/v1alpha1",
    "kind": "SandboxSession",
    "metadata": {"name": "sb-session-alice", "uid": "u-1"},
}


def make_session(**spec: object) -> SandboxSession:
    return SandboxSession(
        name="sb-session-alice",
        namespace="ns",
        uid="u-1",
        spec=SandboxSessionSpec.model_validate({"userId": "alice", **spec}),
    )


@pytest.fixture
def settings() -> OperatorSettings:
    return OperatorSettings(_env_file=None, image="registry.example/sandbox:1.2.3")


def test_a_pool_pod_is_a_session_pod_of_nobody(settings):
    pool = build_pool_pod("ns", settings, "the-claim-key")
    cold = build_sandbox_pod(make_session(storage={"persistent": False}), settings)
    assert pool["metadata"] == {
        "generateName": "sbx-pool-",
        "labels": {
            "app.kubernetes.io/name": "sandbox-workspace",
            "app.kubernetes.io/managed-by": "sandbox-workspace-operator",
            "sandboxworkspace.io/component": "runtime",
            "app.kubernetes.io/component": "runtime",
            "sandboxworkspace.io/pool": "free",
        },
        "annotations": {
            "sandboxworkspace.io/pod-spec": spec_hash(pool),
            # Which key its runtime takes claims with: a digest, never the key.
            "sandboxworkspace.io/claim-key-id": key_id("the-claim-key"),
        },
    }
    assert "the-claim-key" not in json.dumps(pool)
    # The same hardened spec; only the token's source differs: the claim key.
    env = pool["spec"]["containers"][0]["env"]
    assert env[0] == {
        "name": CLAIM_ENV,
        "valueFrom": {"secretKeyRef": {"name": POOL_SECRET, "key": "key"}},
    }
    expected = copy.deepcopy(cold["spec"])
    expected["containers"][0]["env"][0] = env[0]
    assert pool["spec"] == expected
    assert template_hash("ns", settings) == spec_hash(pool)


def test_a_default_session_fits_and_each_field_a_pool_cannot_give_is_named(settings):
    assert misfits(make_session(storage={"persistent": False}).spec, settings) == []
    assert (
        misfits(make_session(storage={"persistent": False}, image=settings.image).spec, settings)
        == []
    )
    asks = {
        "storage.persistent": {"storage": {"persistent": True}},
        "storage.size": {"storage": {"persistent": False, "size": "5Gi"}},
        "image": {"storage": {"persistent": False}, "image": "other:1"},
        "resources": {"storage": {"persistent": False}, "resources": {"limits": {"cpu": "2"}}},
        "network": {"storage": {"persistent": False}, "network": {"enabled": True}},
        "fileUploadConfig": {
            "storage": {"persistent": False},
            "fileUploadConfig": {"maxFileCount": 3},
        },
        "limits": {"storage": {"persistent": False}, "limits": {"memory": "256Mi"}},
    }
    for field, spec in asks.items():
        assert misfits(make_session(**spec).spec, settings) == [field], field


def test_in_store_mode_s3_a_persistent_session_fits(settings):
    # No session has a claim in store mode s3 (the bucket keeps the files): the pool's
    # emptyDir is what a cold pod of that session would get too.
    s3 = settings.model_copy(update={"store": "s3"})
    persistent = make_session(storage={"persistent": True}).spec
    assert misfits(persistent, s3) == []
    assert misfits(persistent, settings) == ["storage.persistent"]


def test_the_claim_is_one_compare_and_swap(settings):
    pod = build_pool_pod("ns", settings)
    pod["metadata"].update(name="sbx-pool-abc", resourceVersion="42", uid="p-1")
    session = make_session(storage={"persistent": False})
    patch = claim_patch(pod, session, BODY, settings)
    own = build_sandbox_pod(session, settings)["metadata"]["annotations"]
    assert patch == {
        "metadata": {
            "resourceVersion": "42",
            "labels": {
                "sandboxworkspace.io/pool": "claimed",
                "sandboxworkspace.io/session": "sb-session-alice",
                "sandboxworkspace.io/user": "alice",
            },
            "annotations": {
                "sandboxworkspace.io/user-id": "alice",
                # the session's own digest: a later spec change rolls the pod as usual
                "sandboxworkspace.io/pod-spec": own["sandboxworkspace.io/pod-spec"],
            },
            "ownerReferences": [
                {
                    "apiVersion": "sandboxworkspace.io/v1alpha1",
                    "kind": "SandboxSession",
                    "name": "sb-session-alice",
                    "uid": "u-1",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        }
    }


def test_free_means_unclaimed_current_and_not_terminating(settings):
    template = template_hash("ns", settings)
    pod = build_pool_pod("ns", settings, "key-1")
    assert is_free(pod, template, "key-1")
    assert not is_free(pod, "older", "key-1")
    # Started with a key since rotated (the Secret deleted or changed): stale.
    assert not is_free(pod, template, "key-2")
    unmarked = copy.deepcopy(pod)
    del unmarked["metadata"]["annotations"]["sandboxworkspace.io/claim-key-id"]
    assert not is_free(unmarked, template, "key-1")  # made before pods carried the digest
    claimed = copy.deepcopy(pod)
    claimed["metadata"]["labels"]["sandboxworkspace.io/pool"] = "claimed"
    assert not is_free(claimed, template, "key-1")
    going = copy.deepcopy(pod)
    going["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert not is_free(going, template, "key-1")


def test_status_says_how_the_pod_started_and_finds_a_claimed_pod(settings):
    pool = build_pool_pod("ns", settings)
    pool["metadata"]["name"] = "sbx-pool-abc"
    cold = build_sandbox_pod(make_session(), settings)
    assert observe_pod(pool).started_from == "pool"
    assert observe_pod(cold).started_from == "cold"
    assert observe_pod(None).started_from is None
    session = make_session()
    assert session_pod_name(session) == "sb-session-alice"
    claimed = session.model_copy(
        update={"status": session.status.model_copy(update={"pod_name": "sbx-pool-abc"})}
    )
    assert session_pod_name(claimed) == "sbx-pool-abc"
