"""Whose child is it: an object found by name, judged against a session incarnation.

Contract: names of a session's children are deterministic, so a Pod, Secret or PVC with
the right name may belong to an *earlier* incarnation of the session (deleted and
recreated under the same name), still terminating or left behind by
``kubectl delete --cascade=orphan``. ``judge`` says which, by owner uid — never by name
alone — so the reconciler awaits, replaces or adopts it instead of reusing it blindly.
Pure functions, no I/O.
"""

from __future__ import annotations

from typing import Any, Literal

ChildState = Literal["absent", "ours", "terminating", "orphaned", "foreign"]


def judge(obj: dict[str, Any] | None, owner_uid: str) -> ChildState:
    """``absent``; ``terminating`` (has a deletionTimestamp: await it, never reuse it);
    ``ours`` (owned by ``owner_uid``); ``orphaned`` (no owner at all: the garbage collector
    will never take it); ``foreign`` (owned by someone else, e.g. a dead incarnation the
    garbage collector has not reached yet)."""
    if obj is None:
        return "absent"
    meta = obj.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return "terminating"
    owners = meta.get("ownerReferences") or []
    if owner_uid and any(ref.get("uid") == owner_uid for ref in owners):
        return "ours"
    return "foreign" if owners else "orphaned"


def uid_of(obj: dict[str, Any]) -> str:
    return (obj.get("metadata") or {}).get("uid", "")


def owner_reference(owner: dict[str, Any], *, controller: bool = True) -> dict[str, Any]:
    """An owner reference to ``owner`` (a body read from the API)."""
    meta = owner["metadata"]
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": controller,
        "blockOwnerDeletion": controller,
    }


def claim_of_pod(pod: dict[str, Any] | None) -> str | None:
    """Name of the PersistentVolumeClaim a pod mounts, if any."""
    for volume in ((pod or {}).get("spec") or {}).get("volumes") or []:
        claim = volume.get("persistentVolumeClaim")
        if claim:
            return claim.get("claimName")
    return None
