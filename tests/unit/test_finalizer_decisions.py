"""operator/storage.py: the finalizer's decision is made by the storage, never by the
session object alone — one row per situation a deleted conversation can be in."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox_workspace.operator.storage import (
    CleanupRuntime,
    DeletePod,
    Release,
    SessionRuntime,
    StorageFacts,
    Wait,
    decide,
)

SESSION_UID = "session-2"
OLD_UID = "session-1"


def obj(name: str, *, owner: str | None = None, terminating: bool = False, **extra: Any) -> dict:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"uid-{name}"}
    if owner:
        meta["ownerReferences"] = [{"uid": owner, "kind": "SandboxSession", "name": "s"}]
    if terminating:
        meta["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    return {"metadata": meta, **extra}


def session(*, deleting: bool = False) -> dict:
    body = obj("sb-session-alice", terminating=deleting)
    body["metadata"]["uid"] = SESSION_UID
    return body


def claim(**kw: Any) -> dict:
    return obj("sb-session-alice-workspace", **kw)


def pod(**kw: Any) -> dict:
    return obj("sb-session-alice", **kw)


def pv(policy: str, phase: str) -> dict:
    return obj(
        "pvc-123",
        spec={"persistentVolumeReclaimPolicy": policy, "claimRef": {"name": "x"}},
        status={"phase": phase},
    )


@pytest.mark.parametrize(
    ("facts", "expected", "reason"),
    [
        pytest.param(
            StorageFacts(session(), claim(owner=SESSION_UID), pod(owner=SESSION_UID)),
            SessionRuntime,
            None,
            id="live-session-owns-the-claim",
        ),
        pytest.param(
            StorageFacts(session(), claim(owner=SESSION_UID), None),
            SessionRuntime,  # stopped: its runtime is resumed to delete
            None,
            id="stopped-session-owns-the-claim",
        ),
        pytest.param(
            StorageFacts(None, claim(), None),
            CleanupRuntime,
            None,
            id="session-deleted-with-cascade-orphan",
        ),
        pytest.param(
            StorageFacts(session(), claim(), pod(owner=SESSION_UID)),
            CleanupRuntime,  # not yet adopted by the new incarnation
            None,
            id="orphaned-claim-beside-a-new-session",
        ),
        pytest.param(
            StorageFacts(None, claim(owner=OLD_UID), None),
            Wait,
            "ClaimOfOldSession",
            id="session-gone-claim-awaits-garbage-collection",
        ),
        pytest.param(
            StorageFacts(session(deleting=True), claim(owner=SESSION_UID), None),
            Wait,
            "ClaimOfOldSession",
            id="session-being-deleted-claim-still-there",
        ),
        pytest.param(
            StorageFacts(session(), claim(owner=OLD_UID), None),
            Wait,
            "ClaimOfOldSession",
            id="recreated-session-old-claim",
        ),
        pytest.param(
            StorageFacts(None, claim(owner=OLD_UID, terminating=True), pod(owner=OLD_UID)),
            Wait,
            "ClaimTerminating",
            id="claim-terminating-while-a-pod-uses-it",
        ),
        pytest.param(
            StorageFacts(None, None, None, [pv("Retain", "Released")]),
            Wait,
            "VolumeRetained",
            id="retained-volume-holds-the-files",
        ),
        pytest.param(
            StorageFacts(None, None, None, [pv("Delete", "Released")]),
            Wait,
            "VolumeReclaiming",
            id="volume-being-reclaimed",
        ),
        pytest.param(
            StorageFacts(session(), None, pod(owner=SESSION_UID)),
            SessionRuntime,
            None,
            id="emptydir-session-running",
        ),
        pytest.param(
            StorageFacts(session(), None, None),
            Release,
            None,
            id="emptydir-session-stopped-pod-gone",
        ),
        pytest.param(
            StorageFacts(None, None, pod(owner=OLD_UID, terminating=True)),
            Wait,
            "PodTerminating",
            id="emptydir-pod-still-terminating",
        ),
        pytest.param(
            StorageFacts(None, None, pod()),
            DeletePod,
            None,
            id="emptydir-pod-orphaned",
        ),
        pytest.param(StorageFacts(None, None, None), Release, None, id="nothing-left"),
    ],
)
def test_decision(facts: StorageFacts, expected: type, reason: str | None) -> None:
    decision = decide(facts)
    assert isinstance(decision, expected), decision
    if reason is not None:
        assert decision.reason == reason  # type: ignore[union-attr]


def test_a_session_object_alone_never_releases() -> None:
    """The session is gone, but its claim (any owner, any state) or a volume is not."""
    for facts in (
        StorageFacts(None, claim(owner=OLD_UID), None),
        StorageFacts(None, claim(), None),
        StorageFacts(None, claim(terminating=True), None),
        StorageFacts(None, None, None, [pv("Retain", "Released")]),
        StorageFacts(None, None, pod(owner=OLD_UID)),
    ):
        assert not isinstance(decide(facts), Release), facts
