"""The session reconciler's and periodic check's decisions against a fake Kubernetes
client (``OperatorContext(kube=FakeKube())``): session incarnations judged by owner
uid, pods that cannot start, outdated pods, the Confined condition; a due session looked
at from its last watch event (an idle stop reads nothing and writes only onto the version
the event showed; a session changed since is looked at afresh) and the pod events of a
stopped session's departing pod (no reconcile)."""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import kopf
import pytest
from fake_kube import FakeKube
from kopf._core.engines import posting

from sandbox_workspace.contract.crd import ANNOTATION_LAST_ACTIVITY, ANNOTATION_RESUME
from sandbox_workspace.kube import core_path, custom_path
from sandbox_workspace.operator import naming
from sandbox_workspace.operator.activity import start_marker
from sandbox_workspace.operator.builders import build_sandbox_pod
from sandbox_workspace.operator.context import OperatorContext
from sandbox_workspace.operator.handlers.checks import check_session
from sandbox_workspace.operator.handlers.sessions import (
    on_runtime_pod_event,
    reconcile_session,
    stamps_names,
)
from sandbox_workspace.operator.models import SandboxSession
from sandbox_workspace.operator.settings import OperatorSettings

NS, NAME = "ns", "sb-session-alice"
SESSION_PATH = custom_path(NS, "sandboxsessions", NAME)
POD = core_path(NS, "pods", NAME)
SECRET = core_path(NS, "secrets", f"{NAME}-token")
CLAIM = core_path(NS, "persistentvolumeclaims", f"{NAME}-workspace")


@pytest.fixture(autouse=True)
async def events() -> list:
    queue: asyncio.Queue = asyncio.Queue()
    posting.settings_var.set(kopf.OperatorSettings())
    posting.event_queue_loop_var.set(asyncio.get_running_loop())
    posting.event_queue_var.set(queue)

    class Reader(list):
        def reasons(self) -> list[str]:
            while not queue.empty():
                self.append(queue.get_nowait())
            return [e.reason for e in self]

    return Reader()


class Stats:
    """A runtime answering /v1/stats with a given report."""

    def __init__(self) -> None:
        self.active = 0
        self.idle_seconds = 600.0
        self.confinement: dict[str, Any] | None = None
        self.workspace_path: Any = "/srv/node/ws"  # not the pod's usual /workspace
        self.down = False  # answers 503

    def handle(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            return httpx.Response(503, json={"error": {"code": "unavailable"}})
        at = (datetime.now(UTC) - timedelta(seconds=self.idle_seconds)).isoformat()
        body = {
            "workspace_path": self.workspace_path,
            "started_at": at,
            "last_activity_at": at,
            "active_operations": self.active,
            "conversations": 0,
            "confinement": self.confinement,
        }
        return httpx.Response(200, json=body)


@pytest.fixture
async def world() -> AsyncIterator[tuple[OperatorContext, FakeKube, Stats]]:
    kube, stats = FakeKube(), Stats()
    http = httpx.AsyncClient(transport=httpx.MockTransport(stats.handle))
    settings = OperatorSettings(_env_file=None, check_interval_seconds=1)
    yield OperatorContext(settings, kube=kube, http=http), kube, stats  # type: ignore[arg-type]
    await http.aclose()


def put_session(kube: FakeKube, generation: int = 1, **spec: Any) -> dict:
    return kube.put(
        SESSION_PATH,
        {
            "apiVersion": "sandboxworkspace.io/v1alpha1",
            "kind": "SandboxSession",
            "metadata": {"generation": generation},
            "spec": {"userId": "alice", **spec},
        },
    )


def mark_running(kube: FakeKube, path: str = POD) -> None:
    kube.objects[path]["status"] = {
        "phase": "Running",
        "podIP": "10.0.0.7",
        "conditions": [{"type": "Ready", "status": "True"}],
    }


def owner(obj: dict) -> list[str]:
    return [r["uid"] for r in obj["metadata"].get("ownerReferences") or []]


async def test_new_session_gets_secret_claim_and_pod_of_its_incarnation(world) -> None:
    ctx, kube, _ = world
    uid = put_session(kube)["metadata"]["uid"]
    result = await reconcile_session(ctx, NS, NAME)
    assert result is not None and not result.waiting
    for path in (SECRET, CLAIM, POD):
        assert owner(kube.objects[path]) == [uid], path
    assert kube.objects[SESSION_PATH]["status"]["phase"] == "Pending"


async def test_children_of_an_old_incarnation_are_awaited_never_reused(world, events) -> None:
    ctx, kube, _ = world
    kube.put(POD, {"metadata": {"ownerReferences": [{"uid": "old"}]}})
    kube.put(SECRET, {"metadata": {"ownerReferences": [{"uid": "old"}]}, "data": {}})
    kube.put(CLAIM, {"metadata": {"ownerReferences": [{"uid": "old"}]}})
    uid = put_session(kube)["metadata"]["uid"]

    result = await reconcile_session(ctx, NS, NAME)
    assert result is not None and result.waiting
    assert kube.objects[POD]["metadata"].get("deletionTimestamp")  # old pod deleted
    assert SECRET not in kube.objects  # old token deleted, not reused
    assert owner(kube.objects[CLAIM]) == ["old"]  # left to the garbage collector
    status = kube.objects[SESSION_PATH]["status"]
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (status["phase"], ready["reason"]) == ("Pending", "OldIncarnation")
    assert "OldIncarnation" in events.reasons()

    kube.finish(POD)
    kube.finish(CLAIM)  # the garbage collector took it
    result = await reconcile_session(ctx, NS, NAME)
    assert result is not None and not result.waiting
    for path in (SECRET, CLAIM, POD):
        assert owner(kube.objects[path]) == [uid], path


async def test_an_orphaned_claim_is_adopted(world, events) -> None:
    ctx, kube, _ = world
    kube.put(CLAIM, {"metadata": {}})
    uid = put_session(kube)["metadata"]["uid"]
    await reconcile_session(ctx, NS, NAME)
    assert owner(kube.objects[CLAIM]) == [uid]
    assert "ClaimAdopted" in events.reasons()


async def test_a_terminating_pod_is_awaited(world) -> None:
    ctx, kube, _ = world
    uid = put_session(kube)["metadata"]["uid"]
    kube.put(
        POD,
        {
            "metadata": {
                "ownerReferences": [{"uid": uid}],
                "deletionTimestamp": "2025-01-01T00:00:00Z",
            }
        },
    )
    await reconcile_session(ctx, NS, NAME)
    assert kube.verbs("create").count(POD) == 0
    kube.finish(POD)
    await reconcile_session(ctx, NS, NAME)
    assert kube.verbs("create").count(POD) == 1


async def test_a_stopped_session_starts_no_pod(world) -> None:
    ctx, kube, _ = world
    put_session(kube)["metadata"]["uid"]
    kube.objects[SESSION_PATH]["status"] = {"phase": "Stopped"}
    await reconcile_session(ctx, NS, NAME)  # what an operator restart does
    assert POD not in kube.objects


@pytest.mark.parametrize(
    "reason", ["ImagePullBackOff", "ErrImagePull", "CreateContainerConfigError"]
)
async def test_a_pod_that_cannot_start_is_reported_with_its_reason(world, events, reason) -> None:
    ctx, kube, _ = world
    put_session(kube)
    await reconcile_session(ctx, NS, NAME)
    kube.objects[POD]["status"] = {
        "phase": "Pending",
        "containerStatuses": [{"state": {"waiting": {"reason": reason, "message": "no"}}}],
    }
    await reconcile_session(ctx, NS, NAME)
    status = kube.objects[SESSION_PATH]["status"]
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (status["phase"], ready["reason"]) == ("Error", reason)
    assert reason in events.reasons()


async def test_unschedulable_pod_is_reported(world, events) -> None:
    ctx, kube, _ = world
    put_session(kube)
    await reconcile_session(ctx, NS, NAME)
    kube.objects[POD]["status"] = {
        "phase": "Pending",
        "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3"}
        ],
    }
    await reconcile_session(ctx, NS, NAME)
    ready = next(
        c for c in kube.objects[SESSION_PATH]["status"]["conditions"] if c["type"] == "Ready"
    )
    assert (ready["reason"], ready["message"]) == ("Unschedulable", "0/3")
    assert "Unschedulable" in events.reasons()


async def test_a_broken_pod_is_replaced_when_the_spec_is_fixed(world) -> None:
    ctx, kube, _ = world
    put_session(kube, image="typo:1")
    await reconcile_session(ctx, NS, NAME)
    first = kube.objects[POD]["metadata"]["uid"]
    kube.objects[POD]["status"] = {
        "phase": "Pending",
        "containerStatuses": [{"state": {"waiting": {"reason": "ImagePullBackOff"}}}],
    }
    put_session(kube, generation=2, image="fixed:1")
    kube.objects[SESSION_PATH]["metadata"]["uid"] = owner(kube.objects[POD])[0]
    await reconcile_session(ctx, NS, NAME)
    assert kube.objects[POD]["metadata"].get("deletionTimestamp")  # rolled at once
    kube.finish(POD)
    await reconcile_session(ctx, NS, NAME)
    pod = kube.objects[POD]
    assert pod["metadata"]["uid"] != first
    assert pod["spec"]["containers"][0]["image"] == "fixed:1"


async def test_a_serving_pod_of_an_older_spec_waits_for_idle(world, events) -> None:
    ctx, kube, stats = world
    body = put_session(kube, generation=1)
    await reconcile_session(ctx, NS, NAME)
    mark_running(kube)
    await reconcile_session(ctx, NS, NAME)
    assert kube.objects[SESSION_PATH]["status"]["observedGeneration"] == 1
    kube.put(SECRET, {**kube.objects[SECRET]})  # token present (fake Secret data)
    # The spec changes in a way the pod must follow (network on).
    kube.objects[SESSION_PATH]["spec"]["network"] = {"enabled": True}
    kube.objects[SESSION_PATH]["metadata"]["generation"] = 2
    stats.active = 1  # busy: an execution runs
    await check_session(ctx, NS, NAME, logging.getLogger("t"))
    status = kube.objects[SESSION_PATH]["status"]
    restart = next(c for c in status["conditions"] if c["type"] == "RestartRequired")
    assert restart["status"] == "True"
    assert status["observedGeneration"] == 1  # the pod does not reflect generation 2 yet
    assert not kube.objects[POD]["metadata"].get("deletionTimestamp")

    stats.active = 0  # idle now: the check rolls it
    await check_session(ctx, NS, NAME, logging.getLogger("t"))
    assert kube.objects[POD]["metadata"].get("deletionTimestamp")
    kube.finish(POD)
    await reconcile_session(ctx, NS, NAME)
    session = SandboxSession.from_body(kube.objects[SESSION_PATH])
    expected = build_sandbox_pod(session, ctx.settings)
    assert kube.objects[POD]["spec"] == expected["spec"]
    status = kube.objects[SESSION_PATH]["status"]
    assert status["observedGeneration"] == 2
    restart = next(c for c in status["conditions"] if c["type"] == "RestartRequired")
    assert restart["status"] == "False"
    assert body["metadata"]["uid"] in owner(kube.objects[POD])


def confinement(**fields: Any) -> dict[str, Any]:
    """A confinement report as the runtime's /v1/stats gives it."""
    return {"network": "denied", "features": ["filesystem", "tcp"], "reason": "", **fields}


@pytest.mark.parametrize(
    ("report", "status", "reason"),
    [
        pytest.param(
            confinement(mode="auto", confined=True, landlock_abi=7),
            "True",
            "Landlock",
            id="confined",
        ),
        pytest.param(
            confinement(mode="auto", confined=False, landlock_abi=0, reason="no landlock"),
            "False",
            "LandlockUnavailable",
            id="unavailable",
        ),
        pytest.param(
            confinement(mode="none", confined=False, landlock_abi=7, network="unrestricted"),
            "False",
            "ConfinementDisabled",
            id="disabled",
        ),
    ],
)
async def test_confined_condition_follows_the_runtime(world, events, report, status, reason):
    ctx, kube, stats = world
    put_session(kube)
    await reconcile_session(ctx, NS, NAME)
    mark_running(kube)
    stats.confinement = report
    await check_session(ctx, NS, NAME, logging.getLogger("t"))
    conds = {c["type"]: c for c in kube.objects[SESSION_PATH]["status"]["conditions"]}
    assert (conds["Confined"]["status"], conds["Confined"]["reason"]) == (status, reason)
    assert events.reasons().count(reason) == 1
    await check_session(ctx, NS, NAME, logging.getLogger("t"))
    assert events.reasons().count(reason) == 1  # an Event on change only


async def test_turning_running_carries_the_runtimes_first_stats_in_that_write(world, events):
    """Issue 23: the reconcile that turns a session Running asks its runtime then — one
    status write with ``lastActivityTime``, ``Confined`` and (issue 39) ``workspacePath``,
    the start marked as asked (no look of its own due at once)."""
    ctx, kube, stats = world
    put_session(kube)
    await reconcile_session(ctx, NS, NAME)
    mark_running(kube)
    stats.confinement = confinement(mode="auto", confined=True, landlock_abi=7)
    kube.calls.clear()
    await reconcile_session(ctx, NS, NAME)
    status = kube.objects[SESSION_PATH]["status"]
    assert status["phase"] == "Running"
    last = datetime.fromisoformat(status["lastActivityTime"].replace("Z", "+00:00"))
    assert abs((datetime.now(UTC) - last).total_seconds() - stats.idle_seconds) < 5
    conds = {c["type"]: c for c in status["conditions"]}
    assert (conds["Confined"]["status"], conds["Confined"]["reason"]) == ("True", "Landlock")
    assert status["workspacePath"] == "/srv/node/ws"  # a cold pod: from its first stats
    assert kube.verbs("patch") == [f"{SESSION_PATH}/status"]  # one write
    assert events.reasons().count("Landlock") == 1
    session = SandboxSession.from_body(kube.objects[SESSION_PATH])
    assert ctx.checked_starts[session.uid] == start_marker(session)
    await check_session(ctx, NS, NAME, logging.getLogger("t"))  # a later look: no new Event
    assert events.reasons().count("Landlock") == 1


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("workspace", id="relative"),
        pytest.param("/work\x00space", id="nul"),
        pytest.param("/" + "a" * 5000, id="huge"),
        pytest.param(7, id="number"),
    ],
)
async def test_a_runtimes_workspace_path_of_another_shape_is_not_recorded(world, path) -> None:
    """The first stats of a cold pod, and the look after: a path that is not absolute,
    holds a NUL or is huge is left out (a number fails the stats' own schema: no answer);
    the session still turns Running, and the API asks the runtime itself."""
    ctx, kube, stats = world
    stats.workspace_path = path
    put_session(kube)
    await reconcile_session(ctx, NS, NAME)
    mark_running(kube)
    await reconcile_session(ctx, NS, NAME)
    await check_session(ctx, NS, NAME, logging.getLogger("t"))
    status = kube.objects[SESSION_PATH]["status"]
    assert status["phase"] == "Running" and status.get("workspacePath") is None


async def running_without_path(world) -> tuple[OperatorContext, FakeKube, Stats]:
    """A session turned Running when its runtime did not answer: no path in the status."""
    ctx, kube, stats = world
    put_session(kube)
    await reconcile_session(ctx, NS, NAME)
    mark_running(kube)
    stats.down = True
    await reconcile_session(ctx, NS, NAME)
    assert kube.objects[SESSION_PATH]["status"].get("workspacePath") is None
    stats.down = False
    return ctx, kube, stats


async def test_a_path_the_first_look_missed_is_recorded_by_the_next_look(world) -> None:
    """No answer when the session turned Running (its runtime slow): the status has no
    path then; the look due at once asks and records it, and a later status of the same
    pod start keeps it."""
    ctx, kube, _ = await running_without_path(world)
    ctx.sessions_seen[(NS, NAME)] = copy.deepcopy(kube.objects[SESSION_PATH])  # its event
    kube.calls.clear()
    await check_session(ctx, NS, NAME, logging.getLogger("t"))  # from the event: no reconcile
    assert kube.objects[SESSION_PATH]["status"]["workspacePath"] == "/srv/node/ws"
    assert kube.verbs("patch") == [f"{SESSION_PATH}/status"]
    await reconcile_session(ctx, NS, NAME)  # e.g. a pod event: the path stays
    assert kube.objects[SESSION_PATH]["status"]["workspacePath"] == "/srv/node/ws"


async def test_a_look_afresh_records_no_path_for_a_later_pod_start(world) -> None:
    """A look made afresh (no watch event to write onto) asks the runtime the status it
    read names; while the answer is on its way the pod is replaced and a reconcile writes
    the new start. The look's write is not guarded: had it carried the old pod's path,
    the new start's status named it (kept while the same start) and the API used it
    instead of asking the new runtime. Only a look from a watch event (its write guarded
    by that version) records a path."""
    ctx, kube, stats = await running_without_path(world)
    asked = []

    def racing(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        if len(asked) == 1:  # the reconcile's first look: no answer in time
            return httpx.Response(503, json={"error": {"code": "unavailable"}})
        session = kube.objects[SESSION_PATH]  # meanwhile: a new pod start is written
        session["status"]["startedAt"] = "2030-01-01T00:00:00Z"
        kube._bump(session)
        return stats.handle(request)  # the old pod's answer

    await ctx.http.aclose()
    async with httpx.AsyncClient(transport=httpx.MockTransport(racing)) as ctx.http:
        await check_session(ctx, NS, NAME, logging.getLogger("t"))  # no event seen: afresh
    assert len(asked) == 2
    status = kube.objects[SESSION_PATH]["status"]
    assert status["startedAt"] == "2030-01-01T00:00:00Z"
    assert status.get("workspacePath") is None


async def test_a_lost_claim_is_reported_not_replaced(world, events) -> None:
    ctx, kube, _ = world
    put_session(kube)
    await reconcile_session(ctx, NS, NAME)
    kube.objects[CLAIM]["status"] = {"phase": "Lost"}
    claim_uid = kube.objects[CLAIM]["metadata"]["uid"]
    await reconcile_session(ctx, NS, NAME)  # the pod waits for its volume
    status = kube.objects[SESSION_PATH]["status"]
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (status["phase"], ready["reason"]) == ("Error", "ClaimLost")
    assert "delete the session" in ready["message"]
    assert "ClaimLost" in events.reasons()
    assert kube.objects[CLAIM]["metadata"]["uid"] == claim_uid  # a data decision: not ours


# -- a due session looked at from its last watch event (issue 23: the idle stop's requests)

LOG = logging.getLogger("t")


@pytest.fixture
async def running(world) -> tuple[OperatorContext, FakeKube]:
    """A session Running, idle for 600 s with idleTimeoutSeconds 60, its runtime asked
    once (lastActivityTime written), and its last event seen by the operator
    (``OperatorContext.sessions_seen``: a due session is looked at from it)."""
    ctx, kube, stats = world
    put_session(kube, idleTimeoutSeconds=60)
    await reconcile_session(ctx, NS, NAME)
    mark_running(kube)
    await reconcile_session(ctx, NS, NAME)
    status = kube.objects[SESSION_PATH]["status"]
    assert status["phase"] == "Running"
    status["lastActivityTime"] = stats.handle(None).json()["last_activity_at"]  # type: ignore[arg-type]
    ctx.sessions_seen[(NS, NAME)] = copy.deepcopy(kube.objects[SESSION_PATH])
    kube.reads.clear()
    kube.calls.clear()
    return ctx, kube


async def test_an_idle_stop_from_the_last_event_reads_nothing(running) -> None:
    ctx, kube = running
    await check_session(ctx, NS, NAME, LOG)
    assert kube.objects[SESSION_PATH]["status"]["phase"] == "Stopped"
    assert kube.objects[POD]["metadata"].get("deletionTimestamp")
    assert kube.reads == []  # no read of the session, its pod or its Secret
    assert kube.verbs("patch") == [f"{SESSION_PATH}/status"]  # one write, then the deletion
    # The stop's own write is what the operator now knows of the session.
    assert ctx.sessions_seen[(NS, NAME)]["status"]["phase"] == "Stopped"


async def test_a_session_changed_since_its_event_is_looked_at_afresh(running) -> None:
    ctx, kube = running
    # Activity the runtime cannot see, after the event the operator holds: its stop from
    # that event is refused (409) and the fresh look finds the session active.
    stamp = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    await kube.patch(SESSION_PATH, {"metadata": {"annotations": {ANNOTATION_LAST_ACTIVITY: stamp}}})
    due = await check_session(ctx, NS, NAME, LOG)
    assert kube.objects[SESSION_PATH]["status"]["phase"] == "Running"
    assert not kube.objects[POD]["metadata"].get("deletionTimestamp")
    assert SESSION_PATH in kube.reads  # read afresh
    assert due is not None and due > datetime.now(UTC)  # the idle deadline moved on


def _deleted(kube: FakeKube) -> kopf.RawEvent:
    pod = copy.deepcopy(kube.objects[POD])
    kube.finish(POD)
    return {"type": "DELETED", "object": pod}  # type: ignore[typeddict-item]


async def test_a_stopped_sessions_departing_pod_needs_no_reconcile(running) -> None:
    ctx, kube = running
    await check_session(ctx, NS, NAME, LOG)
    event = _deleted(kube)
    labels = event["object"]["metadata"]["labels"]
    await on_runtime_pod_event(event=event, namespace=NS, labels=labels, memo=kopf.Memo(ctx=ctx))
    assert kube.reads == []
    assert POD not in kube.objects  # and nothing recreated it


async def test_a_resumed_sessions_departing_pod_is_reconciled(running) -> None:
    ctx, kube = running
    await check_session(ctx, NS, NAME, LOG)
    await kube.patch(SESSION_PATH, {"metadata": {"annotations": {ANNOTATION_RESUME: "now"}}})
    ctx.sessions_seen[(NS, NAME)] = copy.deepcopy(kube.objects[SESSION_PATH])
    event = _deleted(kube)
    labels = event["object"]["metadata"]["labels"]
    await on_runtime_pod_event(event=event, namespace=NS, labels=labels, memo=kopf.Memo(ctx=ctx))
    assert kube.objects[SESSION_PATH]["status"]["phase"] == "Pending"
    assert POD in kube.objects  # the resume's new pod


async def test_a_new_session_is_reconciled_from_its_event_without_reads(world) -> None:
    ctx, kube, _ = world
    body = put_session(kube)
    result = await reconcile_session(ctx, NS, NAME, seen=copy.deepcopy(body))
    assert result is not None and not result.waiting
    assert kube.reads == []  # neither the session nor its children read: created outright
    for path in (SECRET, CLAIM, POD):
        assert owner(kube.objects[path]) == [body["metadata"]["uid"]], path
    assert kube.objects[SESSION_PATH]["status"]["phase"] == "Pending"


async def test_a_new_sessions_taken_pod_name_is_judged_from_fresh_reads(world) -> None:
    ctx, kube, _ = world
    old = kube.put(POD, {"metadata": {"ownerReferences": [{"uid": "old"}]}})
    body = put_session(kube)
    result = await reconcile_session(ctx, NS, NAME, seen=copy.deepcopy(body))
    assert result is not None and result.waiting  # the old incarnation's pod goes first
    assert kube.objects[POD]["metadata"]["uid"] == old["metadata"]["uid"]
    assert kube.objects[POD]["metadata"].get("deletionTimestamp")  # deleted, never reused
    assert kube.objects[SESSION_PATH]["status"]["conditions"][0]["reason"] == "OldIncarnation"


async def test_a_pod_event_stands_for_a_read_of_the_pod(world) -> None:
    ctx, kube, _ = world
    put_session(kube)
    await reconcile_session(ctx, NS, NAME)
    before = copy.deepcopy(kube.objects[POD])
    mark_running(kube)
    event = {"type": "MODIFIED", "object": copy.deepcopy(kube.objects[POD])}
    event["object"]["metadata"]["resourceVersion"] = "newer"  # the kubelet's write
    kube.objects[POD] = before  # the apiserver still answers the older version: unread
    kube.reads.clear()
    labels = event["object"]["metadata"]["labels"]
    await on_runtime_pod_event(event=event, namespace=NS, labels=labels, memo=kopf.Memo(ctx=ctx))
    ready = kube.objects[SESSION_PATH]["status"]["conditions"][0]
    assert ready["reason"] == "RuntimeReady"  # the event's Running pod, not PodPending
    assert kube.reads == [SESSION_PATH]  # the session read, its pod taken from the event


def test_a_seen_session_is_kept_without_its_managed_fields(world) -> None:
    ctx, _, _ = world
    body = {"metadata": {"namespace": NS, "name": NAME, "managedFields": [{"manager": "x"}]}}
    ctx.see_session(body)
    assert ctx.sessions_seen[(NS, NAME)] == {"metadata": {"namespace": NS, "name": NAME}}
    assert body["metadata"]["managedFields"]  # the event's own object is left as it was


# -- child names: sessions made without the API (kubectl) get the current names ----------

LONG = "sb-session-" + "k" * 45  # its claim's name is cut, so hashed: legacy ≠ current


def _long_session(kube: FakeKube, **metadata: Any) -> dict:
    path = custom_path(NS, "sandboxsessions", LONG)
    body = {"apiVersion": "sandboxworkspace.io/v1alpha1", "kind": "SandboxSession",
            "metadata": metadata, "spec": {"userId": "k" * 45}}  # fmt: skip
    return kube.put(path, body)


def _claim(name: str) -> str:
    return core_path(NS, "persistentvolumeclaims", name)


@pytest.mark.parametrize("seen", [False, True], ids=["read", "from-its-event"])
async def test_a_session_made_without_the_api_gets_the_current_child_names(world, seen) -> None:
    ctx, kube, _ = world
    body = _long_session(kube)  # as kubectl makes it: no names annotation, no status
    await reconcile_session(ctx, NS, LONG, seen=copy.deepcopy(body) if seen else None)
    stored = kube.objects[custom_path(NS, "sandboxsessions", LONG)]
    assert stored["metadata"]["annotations"][naming.ANNOTATION_NAMES] == naming.NAMES_CURRENT
    current, legacy = (
        naming.workspace_claim_name(LONG),
        naming.workspace_claim_name(LONG, legacy=True),
    )
    assert current != legacy
    assert _claim(current) in kube.objects and _claim(legacy) not in kube.objects
    assert naming.runtime_secret_name(LONG) in {p.rsplit("/", 1)[1] for p in kube.objects}


async def test_a_session_reconciled_before_the_upgrade_keeps_its_legacy_child_names(world):
    ctx, kube, _ = world
    _long_session(kube)
    path = custom_path(NS, "sandboxsessions", LONG)
    kube.objects[path]["status"] = {"phase": "Running"}  # reconciled by the old operator
    await reconcile_session(ctx, NS, LONG)
    assert naming.ANNOTATION_NAMES not in (kube.objects[path]["metadata"].get("annotations") or {})
    legacy = naming.workspace_claim_name(LONG, legacy=True)
    assert _claim(legacy) in kube.objects
    assert _claim(naming.workspace_claim_name(LONG)) not in kube.objects


@pytest.mark.parametrize(
    ("body", "stamped"),
    [
        ({"metadata": {}}, True),
        ({"metadata": {"annotations": {}}, "status": {}}, True),
        ({"metadata": {}, "status": {"phase": "Pending"}}, False),
        ({"metadata": {"annotations": {naming.ANNOTATION_NAMES: naming.NAMES_CURRENT}}}, False),
        ({"metadata": {"annotations": {naming.ANNOTATION_NAMES: "v9"}}}, False),  # not ours
    ],
)
def test_which_sessions_get_the_names_stamped(body, stamped) -> None:
    assert stamps_names(body) is stamped


async def test_an_api_made_session_is_not_patched_for_its_names(world) -> None:
    ctx, kube, _ = world
    _long_session(kube, annotations={naming.ANNOTATION_NAMES: naming.NAMES_CURRENT})
    await reconcile_session(ctx, NS, LONG)
    assert custom_path(NS, "sandboxsessions", LONG) not in kube.verbs("patch")
