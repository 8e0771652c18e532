"""Where a conversation's files live, and whether they are provably gone. No I/O.

Contract: the deletion finalizer of a ConversationWorkspace asks ``decide(facts)`` what
to do; ``facts`` are what the API holds about the storage of the session the workspace
names — the session (if any), the PVC named after it, the pod named after it, and every
PersistentVolume whose ``claimRef`` names that PVC. The decision is made by the storage,
never by the session object alone:

- ``SessionRuntime``: the claim belongs to the live session incarnation (owner uid), or
  the session has no claim and its own pod holds an emptyDir: its runtime deletes the
  directory and confirms (a stopped session is asked to resume: real demand).
- ``CleanupRuntime``: the claim has no owner at all (``--cascade=orphan``): a short-lived
  cleanup pod mounts it and its runtime deletes and confirms.
- ``DeletePod``: no claim, but a pod left without owner (``--cascade=orphan``) holds an
  emptyDir: deleting the pod deletes the files; then ``Release`` once it is gone.
- ``Wait``: the storage exists but cannot be reached yet — the claim or a pod is
  terminating, the garbage collector has still to take the claim of a dead incarnation,
  a released volume is being reclaimed — or it is kept on purpose (``VolumeRetained``: a
  PersistentVolume with reclaim policy Retain holds the files; only an administrator can
  release them). Retried; never a release.
- ``Release``: no claim, no volume that was bound to it, and no pod that could hold an
  emptyDir: nothing that could hold the files exists.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sandbox_workspace.contract.conditions import Reason

from .children import judge


@dataclass(frozen=True)
class StorageFacts:
    session: dict[str, Any] | None
    claim: dict[str, Any] | None
    pod: dict[str, Any] | None
    volumes: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Release:
    why: str


@dataclass(frozen=True)
class SessionRuntime:
    why: str


@dataclass(frozen=True)
class CleanupRuntime:
    claim: dict[str, Any]


@dataclass(frozen=True)
class DeletePod:
    pod: dict[str, Any]


@dataclass(frozen=True)
class Wait:
    reason: str
    message: str


Decision = Release | SessionRuntime | CleanupRuntime | DeletePod | Wait


def _live_uid(session: dict[str, Any] | None) -> str:
    """The uid of a session that exists and is not being deleted ("" otherwise)."""
    if session is None or session["metadata"].get("deletionTimestamp"):
        return ""
    return session["metadata"].get("uid", "")


def _claim(facts: StorageFacts, live: str) -> Decision:
    assert facts.claim is not None
    name = facts.claim["metadata"]["name"]
    state = judge(facts.claim, live)
    if state == "ours":
        return SessionRuntime(f"claim {name} belongs to the session")
    if state == "orphaned":
        return CleanupRuntime(facts.claim)
    if state == "terminating":
        return Wait(
            Reason.CLAIM_TERMINATING, f"claim {name} is being deleted; then its volume decides"
        )
    return Wait(
        Reason.CLAIM_OF_OLD_SESSION,
        f"claim {name} belongs to a session incarnation that is deleted or being deleted; "
        "waiting for the garbage collector to delete it (then its volume decides)",
    )


def _volume(pv: dict[str, Any]) -> Wait:
    name = pv["metadata"]["name"]
    spec, phase = pv.get("spec") or {}, (pv.get("status") or {}).get("phase", "")
    if spec.get("persistentVolumeReclaimPolicy") == "Retain" and phase != "Bound":
        return Wait(
            Reason.VOLUME_RETAINED,
            f"PersistentVolume {name} (reclaim policy Retain, {phase or 'no phase'}) still "
            "holds the files; bind it to the session's claim again (then the runtime deletes "
            "the directory) or wipe and delete the volume to release this finalizer",
        )
    return Wait(Reason.VOLUME_RECLAIMING, f"PersistentVolume {name} ({phase}) is being reclaimed")


def decide(facts: StorageFacts) -> Decision:
    """What the finalizer does next (see the module contract)."""
    live = _live_uid(facts.session)
    if facts.claim is not None:
        return _claim(facts, live)
    for pv in facts.volumes:
        return _volume(pv)
    if facts.pod is not None:
        name = facts.pod["metadata"]["name"]
        state = judge(facts.pod, live)
        if state == "ours":
            return SessionRuntime(f"pod {name} holds the session's emptyDir workspace")
        if state == "orphaned" and not live:
            return DeletePod(facts.pod)
        return Wait(Reason.POD_TERMINATING, f"pod {name} still exists; its emptyDir goes with it")
    return Release("no claim, volume or pod of the session exists: its storage is gone")
