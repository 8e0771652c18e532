"""What a start from the warm pool leaves to kopf and to later writes (issue 25's burst):
kopf writes no diff base for a new session the short path started, and still sees no
change in its later events; the start's Events wait until the claims settle; a claim
counts as settled from its status write."""

from __future__ import annotations

import asyncio
import copy
import json
import time
from typing import Any

import kopf
import pytest
from kopf._cogs.structs import diffs
from kopf._core.intents import causes
from prometheus_client import CollectorRegistry

from sandbox_workspace.contract.crd import PREFIX
from sandbox_workspace.operator.context import OperatorContext
from sandbox_workspace.operator.diffbase import (
    KEY,
    SessionDiffBaseStorage,
    SessionProgressStorage,
)
from sandbox_workspace.operator.handlers import pool_start
from sandbox_workspace.operator.pool import PoolMetrics, PoolState
from sandbox_workspace.operator.pool.refill import REFILL_SETTLE, settle
from sandbox_workspace.operator.settings import OperatorSettings

ANNOTATION = f"{PREFIX}/{KEY}"


def session(uid: str = "u-1", generation: int = 1, **status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "sandboxworkspace.io/v1alpha1",
        "kind": "SandboxSession",
        "metadata": {"name": "sb-a", "namespace": "s", "uid": uid, "generation": generation},
        "spec": {"userId": "a"},
        **({"status": status} if status else {}),
    }


def pool() -> PoolState:
    return PoolState(("s",), 3, PoolMetrics(CollectorRegistry()))


PROGRESS = kopf.AnnotationsProgressStorage(prefix=PREFIX)


def storage(state: PoolState) -> SessionDiffBaseStorage:
    return SessionDiffBaseStorage(prefix=PREFIX, skip=state.unrecorded, progress=PROGRESS)


def stored(store: SessionDiffBaseStorage, body: dict[str, Any]) -> dict[str, Any]:
    kbody = kopf.Body(body)
    patch = kopf.Patch()
    store.store(body=kbody, patch=patch, essence=store.build(body=kbody))
    return dict(patch)


def test_no_diff_base_is_written_for_a_session_the_short_path_started() -> None:
    state = pool()
    state.started_new.add("u-1")
    store = storage(state)
    assert stored(store, session("u-1")) == {}
    # Once: a later store of the same session (a spec update) writes it as kopf does.
    assert ANNOTATION in stored(store, session("u-1"))["metadata"]["annotations"]
    assert ANNOTATION in stored(store, session("u-2"))["metadata"]["annotations"]


def handled(state: PoolState, body: dict[str, Any]) -> dict[str, Any]:
    """kopf's writes after a creation handler succeeded at once (process_changing_cause:
    the handler's progress stored, then purged, then the diff base stored)."""
    progress = SessionProgressStorage(prefix=PREFIX, started=state.started)
    store = SessionDiffBaseStorage(prefix=PREFIX, skip=state.unrecorded, progress=progress)
    kbody, patch, key = kopf.Body(body), kopf.Patch(), kopf.HandlerId("reconcile")
    record = {"started": "2026-11-27T00:00:00Z", "success": True, "retries": 1}
    progress.store(key=key, record=record, body=kbody, patch=patch)
    progress.purge(key=key, body=kbody, patch=patch)
    store.store(body=kbody, patch=patch, essence=store.build(body=kbody))
    return dict(patch)


def test_kopf_writes_nothing_after_a_short_path_start() -> None:
    state = pool()
    state.started_new.add("u-1")
    assert handled(state, session("u-1")) == {}  # no PATCH at all
    annotations = handled(state, session("u-2"))["metadata"]["annotations"]
    assert set(annotations) == {ANNOTATION, f"{PREFIX}/kopf-managed"}


def test_a_workspace_always_gets_its_diff_base() -> None:
    state = pool()
    state.started_new.add("u-1")
    workspace = {**session("u-1"), "kind": "ConversationWorkspace"}
    assert ANNOTATION in stored(storage(state), workspace)["metadata"]["annotations"]


def cause_of(store: SessionDiffBaseStorage, body: dict[str, Any]) -> causes.Reason:
    """The change kopf detects in ``body`` (as kopf's processing computes it)."""
    kbody = kopf.Body(body)
    old, new = store.fetch(body=kbody), store.build(body=kbody)
    diff = diffs.diff(old, new)
    raw = {"type": "MODIFIED", "object": body}
    context = {"logger": None, "indices": None, "memo": None, "resource": None, "patch": None}
    return causes.detect_changing_cause(
        finalizer="f", raw_event=raw, body=kbody, old=old, new=new, diff=diff, **context
    ).reason


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        pytest.param(session(), causes.Reason.CREATE, id="new"),
        pytest.param(
            session(phase="Running", observedGeneration=1), causes.Reason.NOOP, id="handled"
        ),
        pytest.param(
            session(generation=2, phase="Running", observedGeneration=1),
            causes.Reason.CREATE,
            id="spec-changed-since",
        ),
    ],
)
def test_a_session_without_a_diff_base_is_judged_by_its_status(
    body: dict[str, Any], reason: causes.Reason
) -> None:
    assert cause_of(storage(pool()), body) == reason


@pytest.mark.parametrize("handler", ["reconcile", "reconcile/spec"])
def test_a_handler_in_flight_is_kopfs_to_finish(handler: str) -> None:
    """A reconcile that wrote the status, then asked for a retry (an old incarnation's
    child to wait for): its next events must still call it."""
    body = session(phase="Pending", observedGeneration=1)
    patch = kopf.Patch()
    record = {"started": "2026-11-27T00:00:00Z", "retries": 1, "success": False}
    PROGRESS.store(key=kopf.HandlerId(handler), record=record, body=kopf.Body(body), patch=patch)
    body["metadata"]["annotations"] = dict(patch["metadata"]["annotations"])
    assert cause_of(storage(pool()), body) == causes.Reason.CREATE


def test_a_stored_diff_base_wins() -> None:
    store = storage(pool())
    body = session(phase="Running", observedGeneration=1)
    old = {"spec": {"userId": "someone else"}}
    body["metadata"]["annotations"] = {ANNOTATION: json.dumps(old)}
    assert cause_of(store, body) == causes.Reason.UPDATE


async def test_a_written_status_counts_as_a_claim_for_settling() -> None:
    state = pool()
    state.note_written()
    began = time.monotonic()
    await asyncio.wait_for(settle(state), 5)
    assert time.monotonic() - began >= REFILL_SETTLE * 0.9


async def test_a_starts_events_wait_until_the_claims_settle(monkeypatch) -> None:
    posted: list[tuple[float, str]] = []
    monkeypatch.setattr(
        kopf, "event", lambda *_, reason, **__: posted.append((time.monotonic(), reason))
    )
    ctx = OperatorContext(OperatorSettings(_env_file=None))
    ctx.pool = pool()
    ctx.pool.note_written()
    began = time.monotonic()
    pool_start._post_when_settled(ctx)(session(), type="Normal", reason="RuntimeReady", message="")
    assert posted == []
    await asyncio.wait_for(asyncio.gather(*ctx.pool.posting), 5)
    assert [r for _, r in posted] == ["RuntimeReady"]
    assert posted[0][0] - began >= REFILL_SETTLE * 0.9
    assert not ctx.pool.posting


def test_without_a_pool_events_are_posted_at_once() -> None:
    ctx = OperatorContext(OperatorSettings(_env_file=None))
    assert pool_start._post_when_settled(ctx) is kopf.event


def pod() -> dict[str, Any]:
    """A sandbox pod as a watch event carries it: owners, managed fields, a status."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "sbx-pool-1",
            "namespace": "s",
            "uid": "p-1",
            "resourceVersion": "9",
            "labels": {"sandboxworkspace.io/pool": "claimed"},
            "annotations": {f"{PREFIX}/kopf-managed": "yes", "x/y": "1", ANNOTATION: "{}"},
            "ownerReferences": [{"kind": "SandboxSession", "name": "sb-a", "uid": "u-1"}],
            "managedFields": [{"manager": "operator", "fieldsV1": {"f:metadata": {}}}],
        },
        "spec": {"containers": [{"name": "runtime", "image": "i"}], "nodeName": "n"},
        "status": {"phase": "Running", "podIP": "10.0.0.2"},
    }


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(pod(), id="pod"),
        pytest.param(session(phase="Running", observedGeneration=1), id="session"),
        pytest.param(session(), id="new-session"),
    ],
)
def test_the_essence_is_kopfs_own(body: dict[str, Any]) -> None:
    kopfs = kopf.AnnotationsDiffBaseStorage(prefix=PREFIX, key=KEY)
    assert storage(pool()).build(body=kopf.Body(body)) == kopfs.build(body=kopf.Body(body))
    fields = ["status.phase"]
    ours = storage(pool()).build(body=kopf.Body(body), extra_fields=fields)
    assert ours == kopfs.build(body=kopf.Body(body), extra_fields=fields)


def test_the_essence_copies_no_managed_fields(monkeypatch) -> None:
    copied: list[Any] = []
    real = copy.deepcopy
    monkeypatch.setattr(copy, "deepcopy", lambda x, *a: copied.append(x) or real(x, *a))
    storage(pool()).build(body=kopf.Body(pod()))
    assert not any("managedFields" in str(x) or "podIP" in str(x) for x in copied)
