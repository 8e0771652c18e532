"""The ConversationWorkspace handlers against a fake Kubernetes client (injected through
``OperatorContext(kube=…)``) and a fake runtime behind httpx's MockTransport: which
calls they make, when they release the finalizer, and when they hold it."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import kopf
import pytest
from fake_kube import FakeKube
from kopf._core.engines import posting

from sandbox_workspace.kube import core_path, custom_path
from sandbox_workspace.operator.context import OperatorContext
from sandbox_workspace.operator.handlers.deletion import on_workspace_deleted
from sandbox_workspace.operator.handlers.workspaces import on_workspace_created
from sandbox_workspace.operator.settings import OperatorSettings

NS = "ns"
SESSION = "sb-session-alice"
CLAIM = "sb-session-alice-workspace"
SESSION_PATH = custom_path(NS, "sandboxsessions", SESSION)
CLAIM_PATH = core_path(NS, "persistentvolumeclaims", CLAIM)
POD_PATH = core_path(NS, "pods", SESSION)
CWS_PATH = custom_path(NS, "conversationworkspaces", "cws-1")
LOG = logging.getLogger("test")


@dataclass
class FakeRuntime:
    """Conversations that exist, per runtime address; every request recorded."""

    dirs: dict[str, set[str]] = field(default_factory=dict)
    requests: list[tuple[str, str, bytes]] = field(default_factory=list)
    keep: bool = False  # a runtime that claims to delete but does not
    down: bool = False

    def handle(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            raise httpx.ConnectError("refused", request=request)
        host = request.url.host
        self.requests.append((request.method, host, request.url.raw_path))
        cid = request.url.path.split("/")[3]
        present = self.dirs.setdefault(host, set())
        if request.method == "DELETE":
            if not self.keep:
                present.discard(cid)
            return httpx.Response(200, json={"conversation_id": cid, "deleted": True})
        info = {"conversation_id": cid, "exists": cid in present, "path": f"/workspace/{cid}"}
        return httpx.Response(200, json={**info, "uploads_path": "u", "outputs_path": "o"})


@pytest.fixture(autouse=True)
async def events() -> list[posting.K8sEvent]:
    """kopf's own posting context: Events the handlers post land in a queue we read."""
    queue: asyncio.Queue = asyncio.Queue()
    posting.settings_var.set(kopf.OperatorSettings())
    posting.event_queue_loop_var.set(asyncio.get_running_loop())
    posting.event_queue_var.set(queue)
    posted: list[posting.K8sEvent] = []

    class Reader(list):
        def __iter__(self):  # drain on read
            while not queue.empty():
                posted.append(queue.get_nowait())
            return iter(posted)

    return Reader()


@pytest.fixture
async def world() -> AsyncIterator[tuple[OperatorContext, FakeKube, FakeRuntime]]:
    kube, runtime = FakeKube(), FakeRuntime()
    http = httpx.AsyncClient(transport=httpx.MockTransport(runtime.handle))
    ctx = OperatorContext(OperatorSettings(_env_file=None), kube=kube, http=http)  # type: ignore[arg-type]
    yield ctx, kube, runtime
    await http.aclose()


def token_secret(kube: FakeKube, name: str, owner: str) -> None:
    kube.put(
        core_path(NS, "secrets", name),
        {"metadata": {"ownerReferences": [{"uid": owner}]}, "data": {"token": "dG9r"}},
    )


def running_session(kube: FakeKube, phase: str = "Running") -> str:
    body = kube.put(
        SESSION_PATH,
        {
            "apiVersion": "sandboxworkspace.io/v1alpha1",
            "kind": "SandboxSession",
            "metadata": {"uid": "session-uid"},
            "spec": {"userId": "alice"},
            "status": {"phase": phase, "endpoint": "http://10.0.0.7:8080"}
            if phase == "Running"
            else {"phase": phase},
        },
    )
    uid = body["metadata"]["uid"]
    kube.put(CLAIM_PATH, {"metadata": {"ownerReferences": [{"uid": uid}]}})
    token_secret(kube, "sb-session-alice-token", uid)
    if phase == "Running":
        kube.put(POD_PATH, {"metadata": {"ownerReferences": [{"uid": uid}]}})
    return uid


def cws(cid: str, **status: Any) -> dict:
    return {
        "apiVersion": "sandboxworkspace.io/v1alpha1",
        "kind": "ConversationWorkspace",
        "metadata": {
            "name": "cws-1",
            "namespace": NS,
            "uid": "cws-uid",
            "generation": 1,
            "deletionTimestamp": "2025-01-01T00:00:00Z",
        },
        "spec": {"conversationId": cid, "sessionRef": SESSION, "userId": "alice"},
        "status": status,
    }


async def delete(ctx: OperatorContext, kube: FakeKube, body: dict) -> None:
    kube.put(CWS_PATH, body)
    await on_workspace_deleted(
        body=body, name="cws-1", namespace=NS, memo=kopf.Memo(ctx=ctx), retry=0, logger=LOG
    )


def ready_reason(kube: FakeKube) -> str:
    conds = kube.objects[CWS_PATH]["status"]["conditions"]
    return next(c for c in conds if c["type"] == "Ready")["reason"]


@pytest.mark.parametrize("cid", ["..", ".", "c1/uploads/x.csv", ".runtime", "a\x00b"])
async def test_an_id_the_runtime_refuses_was_never_written_and_is_released(world, cid) -> None:
    ctx, kube, runtime = world
    running_session(kube)
    await delete(ctx, kube, cws(cid))  # returns: the finalizer is released
    assert runtime.requests == []  # no other conversation's files were touched


async def test_live_session_deletes_through_its_runtime_and_confirms(world) -> None:
    ctx, kube, runtime = world
    running_session(kube)
    runtime.dirs["10.0.0.7"] = {"c.1", "other"}
    await delete(ctx, kube, cws("c.1"))
    # The dot is escaped: the path can never be a dot segment of another resource.
    assert [(m, p) for m, _, p in runtime.requests] == [
        ("DELETE", b"/v1/conversations/c%2E1"),
        ("GET", b"/v1/conversations/c%2E1"),
    ]
    assert runtime.dirs["10.0.0.7"] == {"other"}


async def test_directory_still_there_holds_the_finalizer(world, events) -> None:
    ctx, kube, runtime = world
    running_session(kube)
    runtime.dirs["10.0.0.7"], runtime.keep = {"c1"}, True
    with pytest.raises(kopf.TemporaryError):
        await delete(ctx, kube, cws("c1"))
    assert ready_reason(kube) == "StillExists"
    assert kube.objects[CWS_PATH]["status"]["phase"] == "Deleting"


async def test_unreachable_runtime_holds_the_finalizer(world) -> None:
    ctx, kube, runtime = world
    running_session(kube)
    runtime.down = True
    with pytest.raises(kopf.TemporaryError):
        await delete(ctx, kube, cws("c1"))
    assert ready_reason(kube) == "RuntimeUnavailable"


async def test_stopped_session_is_resumed_for_a_deletion(world, events) -> None:
    ctx, kube, _runtime = world
    running_session(kube, phase="Stopped")
    with pytest.raises(kopf.TemporaryError):
        await delete(ctx, kube, cws("c1"))
    annotations = kube.objects[SESSION_PATH]["metadata"]["annotations"]
    assert "sandboxworkspace.io/resume-requested" in annotations
    assert ready_reason(kube) == "SessionStopped"


async def test_session_gone_but_claim_of_the_old_incarnation_remains_holds(world) -> None:
    ctx, kube, _runtime = world
    running_session(kube)
    del kube.objects[SESSION_PATH]  # background deletion: the claim is collected later
    with pytest.raises(kopf.TemporaryError):
        await delete(ctx, kube, cws("c1"))
    assert ready_reason(kube) == "ClaimOfOldSession"
    kube.finish(CLAIM_PATH)
    kube.finish(POD_PATH)
    await delete(ctx, kube, cws("c1"))  # no claim, no volume, no pod: released


async def test_retained_volume_holds_with_a_warning(world, events) -> None:
    ctx, kube, _runtime = world
    kube.put(
        "/api/v1/persistentvolumes/pvc-1",
        {
            "spec": {
                "persistentVolumeReclaimPolicy": "Retain",
                "claimRef": {"namespace": NS, "name": CLAIM, "uid": "gone"},
            },
            "status": {"phase": "Released"},
        },
    )
    with pytest.raises(kopf.TemporaryError) as err:
        await delete(ctx, kube, cws("c1"))
    assert err.value.delay == ctx.settings.retry_max_delay_seconds  # the slowest pace
    assert ready_reason(kube) == "VolumeRetained"
    assert [(e.type, e.reason) for e in events] == [("Warning", "VolumeRetained")]
    with pytest.raises(kopf.TemporaryError):  # the same reason again: no second Event
        await delete(ctx, kube, dict(kube.objects[CWS_PATH]))
    assert len(list(events)) == 1


async def test_orphaned_claim_is_cleaned_by_a_cleanup_pod(world, events) -> None:
    ctx, kube, runtime = world
    kube.put(CLAIM_PATH, {"metadata": {"annotations": {"sandboxworkspace.io/user-id": "alice"}}})
    with pytest.raises(kopf.TemporaryError):
        await delete(ctx, kube, cws("c1"))
    assert ready_reason(kube) == "CleanupPodStarting"
    pod_path = core_path(NS, "pods", f"{CLAIM}-cleanup")
    pod = kube.objects[pod_path]
    assert pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == CLAIM
    assert "sandboxworkspace.io/session" not in pod["metadata"]["labels"]
    pod["status"] = {
        "phase": "Running",
        "podIP": "10.0.0.9",
        "conditions": [{"type": "Ready", "status": "True"}],
    }
    runtime.dirs["10.0.0.9"] = {"c1"}
    await delete(ctx, kube, dict(kube.objects[CWS_PATH]))
    assert [(m, h) for m, h, _ in runtime.requests] == [("DELETE", "10.0.0.9"), ("GET", "10.0.0.9")]
    assert runtime.dirs["10.0.0.9"] == set()
    assert kube.objects[pod_path]["metadata"].get("deletionTimestamp")  # torn down
    assert core_path(NS, "secrets", f"{CLAIM}-cleanup-token") not in kube.objects


async def test_orphaned_emptydir_pod_is_deleted_then_released(world) -> None:
    ctx, kube, _runtime = world
    kube.put(POD_PATH, {"metadata": {}})
    with pytest.raises(kopf.TemporaryError):
        await delete(ctx, kube, cws("c1"))
    assert kube.objects[POD_PATH]["metadata"].get("deletionTimestamp")
    kube.finish(POD_PATH)
    await delete(ctx, kube, dict(kube.objects[CWS_PATH]))


async def ensure(ctx: OperatorContext, body: dict, reason: str) -> kopf.Patch:
    patch = kopf.Patch()
    await on_workspace_created(
        body=body,
        name="cws-1",
        namespace=NS,
        patch=patch,
        memo=kopf.Memo(ctx=ctx),
        retry=0,
        reason=reason,
        logger=LOG,
    )
    return patch


def live_cws(cid: str, **status: Any) -> dict:
    body = cws(cid, **status)
    del body["metadata"]["deletionTimestamp"]
    return body


async def test_operator_restart_never_resumes_a_stopped_session(world) -> None:
    ctx, kube, runtime = world
    running_session(kube, phase="Stopped")
    with pytest.raises(kopf.TemporaryError) as err:
        await ensure(ctx, live_cws("c1", phase="Pending"), kopf.Reason.RESUME)
    assert "sandboxworkspace.io/resume-requested" not in json.dumps(kube.objects[SESSION_PATH])
    assert err.value.delay == ctx.settings.check_interval_seconds
    assert runtime.requests == []


async def test_operator_restart_leaves_a_ready_workspace_alone(world) -> None:
    ctx, kube, runtime = world
    running_session(kube)
    patch = await ensure(
        ctx, live_cws("c1", phase="Ready", observedGeneration=1), kopf.Reason.RESUME
    )
    assert not patch and runtime.requests == [] and kube.calls == []


async def test_a_new_workspace_is_made_ready_in_one_call_to_its_runtime(world) -> None:
    """The create answers what a look would (path, files, bytes): the operator asks the
    runtime once — it runs beside the conversation's first command (an E2B Start)."""
    ctx, kube, runtime = world
    running_session(kube)
    patch = await ensure(ctx, live_cws("c1"), kopf.Reason.CREATE)
    assert [(method, path) for method, _, path in runtime.requests] == [
        ("PUT", b"/v1/conversations/c1")
    ]
    assert patch["status"]["phase"] == "Ready"
    assert patch["status"]["path"] == "/workspace/c1"


async def test_invalid_spec_is_an_error_condition_not_a_retry_loop(world, events) -> None:
    ctx, _kube, _runtime = world
    with pytest.raises(kopf.PermanentError):
        patch = kopf.Patch()
        await on_workspace_created(
            body=live_cws("../x"),
            name="cws-1",
            namespace=NS,
            patch=patch,
            memo=kopf.Memo(ctx=ctx),
            retry=0,
            reason=kopf.Reason.CREATE,
            logger=LOG,
        )
    assert patch["status"]["phase"] == "Error"
    assert patch["status"]["conditions"][0]["reason"] == "InvalidSpec"
    assert [(e.type, e.reason) for e in events] == [("Warning", "InvalidSpec")]


# -- a session deleted with --cascade=orphan keeps the workspaces it adopted -------------

ADOPTED = "sandboxworkspace.io/adopted-by"
OWNER = {"apiVersion": "sandboxworkspace.io/v1alpha1", "kind": "SandboxSession",
         "name": SESSION, "uid": "session-uid"}  # fmt: skip


def adopted_cws(*, owned: bool, status: dict | None = None) -> dict:
    """A Pending workspace the session adopted (waiting for it to start, say); ``owned``:
    the owner reference is still there (the garbage collector has not removed it)."""
    body = live_cws("c1", **(status or {"phase": "Pending"}))
    body["metadata"]["annotations"] = {ADOPTED: "session-uid"}
    body["metadata"]["ownerReferences"] = [OWNER] if owned else []
    return body


async def ensure_waits(ctx: OperatorContext, body: dict) -> tuple[kopf.Patch, float | None]:
    patch = kopf.Patch()
    with pytest.raises(kopf.TemporaryError) as err:
        await on_workspace_created(
            body=body, name="cws-1", namespace=NS, patch=patch, memo=kopf.Memo(ctx=ctx),
            retry=0, reason=kopf.Reason.CREATE, logger=LOG,
        )  # fmt: skip
    return patch, err.value.delay


@pytest.mark.parametrize("when", ["session-going", "session-gone"])
async def test_a_workspace_orphaned_with_its_session_is_kept_until_one_adopts_it(
    world, events, when: str
) -> None:
    """``kubectl delete sbs --cascade=orphan``: while the garbage collector removes our
    owner reference (the orphan finalizer on the session), and after (the reference gone),
    the workspace is kept with its files — not deleted, which would have its finalizer
    delete the files the orphaned claim keeps — and a session of the same name adopts it."""
    ctx, kube, _runtime = world
    if when == "session-going":
        running_session(kube, phase="Stopped")
        kube.objects[SESSION_PATH]["metadata"] |= {
            "deletionTimestamp": "2026-01-01T00:00:00Z", "finalizers": ["orphan"]}  # fmt: skip
    body = adopted_cws(owned=when == "session-going")
    patch, delay = await ensure_waits(ctx, body)
    assert kube.verbs("delete") == []
    assert delay == ctx.settings.check_interval_seconds  # a slow look, for a session to come
    (condition,) = patch["status"]["conditions"]
    assert condition["reason"] == "Orphaned" and "kept" in condition["message"]
    assert [(e.type, e.reason) for e in events] == [("Normal", "Orphaned")]
    # Looked at again (its status now says so): no second Event.
    body["status"] = patch["status"]
    await ensure_waits(ctx, body)
    assert [(e.type, e.reason) for e in events] == [("Normal", "Orphaned")]
    # A session of the same name (a new incarnation) takes it back.
    kube.objects.pop(SESSION_PATH, None)
    running_session(kube, phase="Stopped")
    uid = kube.objects[SESSION_PATH]["metadata"]["uid"] = "session-uid-2"
    patch, _ = await ensure_waits(ctx, body)  # adopted, then waits for the session to start
    assert patch["metadata"]["annotations"] == {ADOPTED: uid}
    assert [r["uid"] for r in patch["metadata"]["ownerReferences"]][-1] == uid


@pytest.mark.parametrize(
    "case", ["never-adopted", "adopted-session-going", "adopted-before-the-annotation"]
)
async def test_a_workspace_whose_session_goes_without_orphaning_goes_with_it(
    world, events, case: str
) -> None:
    """Never adopted (made as the session went, or the session expired first: no
    propagation policy speaks for it), or adopted and the session deleted the usual way
    (the reference still there, no orphan finalizer): deleted (reason SessionGone)."""
    ctx, kube, _runtime = world
    body = adopted_cws(owned=True)
    if case == "never-adopted":
        body["metadata"]["annotations"], body["metadata"]["ownerReferences"] = {}, []
    if case == "adopted-before-the-annotation":
        body["metadata"]["annotations"] = {}
    if case == "adopted-session-going":
        running_session(kube, phase="Stopped")
        kube.objects[SESSION_PATH]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    kube.put(CWS_PATH, body)
    await ensure(ctx, body, kopf.Reason.CREATE)
    assert kube.verbs("delete") == [CWS_PATH]
    assert [e.reason for e in events] == ["SessionGone"]


# -- store mode: the finalizer also waits for the conversation's objects ------------------


async def put_objects(store, *keys: str) -> None:
    for key in keys:
        await store.put(key, b"x")


PREFIX = "workspaces/default/sb-session-alice/"


async def test_store_mode_releases_only_with_no_object_left(world, tmp_path) -> None:
    from sandbox_workspace.store import DirStore

    ctx, kube, runtime = world
    ctx.store = DirStore(tmp_path / "store")
    await ctx.store.check()
    running_session(kube)
    runtime.dirs["10.0.0.7"] = {"c1"}
    await put_objects(
        ctx.store,
        PREFIX + "c1/uploads/temparea/a.csv",
        PREFIX + "c1/.sbw/files.json",
        PREFIX + "c10/outputs/keep.txt",  # a neighbour whose id starts the same
    )
    await delete(ctx, kube, cws("c1"))  # returns: released
    assert [i.key async for i in ctx.store.list("workspaces/")] == [PREFIX + "c10/outputs/keep.txt"]
    assert runtime.dirs["10.0.0.7"] == set()  # and the cache is gone


async def test_store_down_holds_the_finalizer(world, events) -> None:
    from sandbox_workspace.store import StoreUnavailable

    class DownStore:
        async def delete_prefix(self, prefix: str) -> int:
            raise StoreUnavailable("connection refused")

    ctx, kube, runtime = world
    ctx.store = DownStore()  # type: ignore[assignment]
    running_session(kube)
    runtime.dirs["10.0.0.7"] = {"c1"}
    with pytest.raises(kopf.TemporaryError):
        await delete(ctx, kube, cws("c1"))
    assert ready_reason(kube) == "StoreUnavailable"


async def test_objects_left_after_a_delete_hold_the_finalizer(world, events) -> None:
    class LeakyStore:  # a store that answers what it still finds (a write raced us)
        async def delete_prefix(self, prefix: str) -> int:
            return 2

    ctx, kube, _ = world
    ctx.store = LeakyStore()  # type: ignore[assignment]
    running_session(kube)
    with pytest.raises(kopf.TemporaryError):
        await delete(ctx, kube, cws("c1"))
    assert ready_reason(kube) == "StoreNotEmpty"
