"""Fault trials of the deletion guarantee: conversations with files are deleted through
the API while a fault strikes at a random moment; afterwards, what is left is counted.

Set-up (``tests/cluster/kubeenv`` as a library, as ``bench.operator`` does): a real
control plane (etcd, kube-apiserver, kube-controller-manager), the test node agent
running each sandbox pod as a runtime process, and the operator and the API as
subprocesses (``kubeenv.stack``) so they can be killed. Only loopback is contacted.

A trial: the conversation gets files (three uploads and an output written by code),
``DELETE …/conversations/{cid}`` is sent through the API, and the fault's injector
strikes ``uniform(0, 0.25)`` s later (``bench.fault_injection``). Then, within a deadline
(60 s, --quick too: a restarted apiserver alone can take half of it on a loaded machine):
- gone: the ConversationWorkspace no longer exists and the directory is gone from disk
  (delete→gone is the time from the DELETE to both; p50/p99 per fault);
- stuck: the resource still exists at the deadline (``Deleting`` forever);
- released early: at the first look after the resource went, its files still existed;
- leaked objects (the store phase): objects left under the conversation's prefix in
  the bucket after the resource went (a release while some existed is early too),
  counting what a listing misses: incomplete multipart uploads and object versions;
- leaked files: files of the conversation on disk after the resource went and a settle
  time passed (a writer that outlived the deletion has had time to write again). A
  write that raced the deletion may legitimately start the conversation afresh: files
  tracked by a new resource are not leaked — that resource is then deleted too (and
  must leave nothing).

The store faults (``fault_injection.STORE_FAULTS``) run on a second namespace whose
operator and API are in store mode ``s3`` against a real SeaweedFS: the store frozen
during the delete, the store slow, the pod lost with an output not yet written back, the
API killed (SIGKILL, started again) while an upload streams to the cache and the store
and the DELETE is in its hands, the operator killed mid-delete; and the fork/delete
trial (``bench.fork_trial``): forks and snapshots made while the origin and forks are
deleted, and while the API is killed — ``lost_objects`` counts objects a live
conversation's records (or its snapshots') name that are gone, ``partial_forks`` forks
that exist though their request failed.

Results: ``bench/results/faults.json`` (``trials``, ``leaked_files``, ``leaked_objects``,
``lost_objects``, ``partial_forks``, ``stuck``, ``released_early``, ``faults``: one entry
per fault), ``faults-quick.json`` with --quick (the test command runs it; the full run
keeps its file). ``SBW_FAULTS=store`` runs the
store phase alone and merges its entries into the results file; ``SBW_FAULTS=store:TEXT``
only the store faults whose name contains TEXT (a long phase run in parts). Goal: 0 leaked,
0 lost, 0 stuck.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from sandbox_workspace.operator import naming

from . import fork_trial
from .fault_injection import FAULTS, STORE_FAULTS, Fault, Trial, background
from .harness import Figure, percentile
from .operator import NodeAgent, _cluster, _namespace, _skip_reason  # puts kubeenv on sys.path
from .storage import missing_reason as seaweedfs_missing  # puts tests/support on sys.path
from .storage import start_seaweedfs

API = "/apis/sandboxworkspace.io/v1alpha1"
RESULTS = Path(__file__).resolve().parent / "results"


class World:
    """Everything a trial and its injector reach."""

    def __init__(
        self, plane, api, agent: NodeAgent, stack, namespace: str, seed: int, store=None,
        bucket: str = "",
    ):  # fmt: skip
        self.plane, self.api, self.agent, self.stack = plane, api, agent, stack
        self.namespace = namespace
        self.store, self.bucket = store, bucket  # SeaweedFS and bucket in store mode s3
        self.rng = random.Random(seed)
        self.quick = False  # set by ``_phase``: injectors may do less in --quick
        self.owner = ThreadPoolExecutor(max_workers=1)  # outlives every trial
        self._clients: dict[str, httpx.Client] = {}

    def client(self, user: str) -> httpx.Client:
        if user not in self._clients:
            self._clients[user] = httpx.Client(
                base_url=self.stack.api_url, headers={"X-User-Id": user}, timeout=120
            )
        return self._clients[user]

    def api_moved(self) -> None:
        """The API was started again (on a new port): every client follows it."""
        for client in self._clients.values():
            client.base_url = httpx.URL(self.stack.api_url)

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self.owner.shutdown()

    @staticmethod
    def pod_name(user: str) -> str:
        return naming.runtime_pod_name(naming.session_name_for(user))

    def workspace(self, user: str, cid: str) -> dict | None:
        name = naming.workspace_name(naming.session_name_for(user), cid)
        return self.api.get_or_none(
            f"{API}/namespaces/{self.namespace}/conversationworkspaces/{name}"
        )


def _retrying(call, deadline: float):
    """A client's way through a fault: retry what says it may succeed later."""
    while True:
        try:
            r = call()
            if r.status_code < 500 and r.status_code != 409:
                return r
        except httpx.TransportError:
            r = None
        if time.monotonic() > deadline:
            return r
        time.sleep(0.2)


def _prepare(world: World, trial: Trial) -> None:
    client = world.client(trial.user)
    deadline = time.monotonic() + 120
    for n in range(3):
        r = _retrying(
            lambda n=n: client.post(
                f"/api/v1/sessions/sb-session-{trial.user}/files/upload",
                files={"file": (f"file-{n}.csv", b"a,b\n1,2\n" * 100)},
                data={"conversation_id": trial.cid},
            ),
            deadline,
        )
        assert r is not None and r.status_code == 201, r and r.text
        trial.directory = Path(r.json()["path"]).parents[2]
    r = client.post(
        f"/api/v1/sessions/sb-session-{trial.user}/execute",
        json={"conversation_id": trial.cid, "language": "bash", "code": "echo out > outputs/o"},
    )
    assert r.status_code == 200, r.text


def _objects(world: World, trial: Trial, cid: str | None = None) -> int:
    """Objects under the prefix of the trial's conversation (or ``cid``) in the bucket
    (0 without a store)."""
    if world.store is None:
        return 0
    from sandbox_workspace.store.layout import DEFAULT_TENANT, Layout, Scope

    scope = Scope(DEFAULT_TENANT, naming.session_name_for(trial.user))
    prefix = Layout("workspaces/").conversation(scope, cid or trial.cid)
    # What a listing misses counts too: incomplete multipart uploads (a killed API's
    # parts) and non-current versions (``s3_admin``).
    return len(world.store.list_keys(world.bucket, prefix)) + _hidden(world, prefix)


def _hidden(world: World, prefix: str) -> int:
    import asyncio

    from sandbox_workspace.store.s3_admin import S3Admin

    async def count() -> int:
        admin = S3Admin(world.store.settings(world.bucket))
        try:
            versions = [v for v in await admin.versions(prefix) if v[1] != "null"]
            return len(await admin.uploads(prefix)) + len(versions)
        finally:
            await admin.aclose()

    return asyncio.run(count())


def _on_disk(world: World, trial: Trial) -> list[Path]:
    """Files of the conversation on disk: where the trial saw them, and — in store mode,
    where each pod has its own emptyDir — in the session's current pod too."""
    files = _files(trial.directory)
    if world.store is not None:
        root = world.agent.data_dir_of(world.namespace, world.pod_name(trial.user))
        if root is not None and root / trial.cid != trial.directory:
            files += _files(root / trial.cid)
    return files


def _files(directory: Path) -> list[Path]:
    meta = directory.parent / ".runtime" / "meta" / directory.name  # runtime state of it
    return [p for d in (directory, meta) if d.exists() for p in d.rglob("*") if not p.is_dir()]


def _age(path: Path, now: float) -> str:
    try:
        return f"{now - path.stat().st_mtime:.1f} s old"
    except OSError:
        return "gone since"


def _delete(world: World, trial: Trial, deadline: float) -> None:
    client = world.client(trial.user)
    r = _retrying(
        lambda: client.delete(
            f"/api/v1/sessions/sb-session-{trial.user}/conversations/{trial.cid}"
        ),
        deadline,
    )
    if r is None or r.status_code not in (200, 202, 404):
        trial.notes.append(f"DELETE answered {r and r.status_code}: {r and r.text[:200]}")


def _wait_gone(
    world: World, trial: Trial, uid: str, deadline: float
) -> tuple[float | None, float | None]:
    """perf_counter times at which the resource ``uid`` was seen gone (or replaced by a
    fresh one) and at which its files were too; None for what did not happen by the
    deadline. Notes a release while the files still existed."""
    resource_gone = None
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            cws = world.workspace(trial.user, trial.cid)
            if cws is not None and cws["metadata"]["uid"] != uid:
                return time.perf_counter(), None  # started afresh: files are tracked
            if cws is None:
                files = len(_on_disk(world, trial)) or _objects(world, trial)
                if resource_gone is None:
                    resource_gone = time.perf_counter()
                    trial.released_early = files > 0
                if not files:
                    return resource_gone, time.perf_counter()
        time.sleep(0.02)
    return resource_gone, None


def _run_trial(world: World, fault: Fault, trial: Trial, quick: bool) -> dict:
    began = time.monotonic()
    _prepare(world, trial)
    cws = world.workspace(trial.user, trial.cid)
    assert cws is not None, "the API made no ConversationWorkspace"
    if fault.before_delete:
        fault.before_delete(world, trial)
    # Stuck means deleting forever, not slow: the same deadline in quick mode. With 30 s
    # there, one 'apiserver restarted' trial of CI's loaded run counted as stuck and its
    # conversation's 7 files as leaked (that fault's p99 in the full run: 31.2 s).
    limit = 60
    deadline = time.monotonic() + limit
    start = time.perf_counter()
    healed_at: list[float] = []

    def inject() -> None:
        fault.inject(world, trial)
        healed_at.append(time.perf_counter())

    injector = background(inject)
    _delete(world, trial, deadline)
    gone_at, files_gone_at = _wait_gone(world, trial, cws["metadata"]["uid"], deadline)
    injector.join(120)
    for thread in trial.threads:
        thread.join(60)
    fresh = world.workspace(trial.user, trial.cid)
    first_gone_at = gone_at
    if gone_at is not None and fresh is not None:
        # A racing write started the conversation afresh: its files are tracked by the
        # new resource — which must now go the same way, leaving nothing.
        trial.notes.append("a racing write started the conversation afresh")
        deadline = time.monotonic() + limit
        _delete(world, trial, deadline)
        gone_at, _ = _wait_gone(world, trial, fresh["metadata"]["uid"], deadline)
    time.sleep(0.5 if quick else 1.0)  # a surviving writer would have written again
    leaked_paths = _on_disk(world, trial)
    leaked = len(leaked_paths)
    if leaked_paths:  # what was left, and how old: which writer outlived the deletion
        now = time.time()
        trial.notes.append(
            "left on disk: " + ", ".join(f"{p} ({_age(p, now)})" for p in leaked_paths[:12])
        )
    leaked_objects = _objects(world, trial)
    more = fault.check(world, trial, lambda cid: _objects(world, trial, cid)) if fault.check else {}
    leaked_objects += more.get("leaked_objects", 0)
    # Started afresh: the first incarnation's files cannot be told from the new ones,
    # so its delete→gone is the time its resource went.
    end = files_gone_at if fresh is None else first_gone_at
    done = gone_at is not None and end is not None and not leaked and not leaked_objects
    done = done and not more.get("lost_objects") and not more.get("stuck")
    return {
        "fault": fault.name,
        "gone_ms": (end - start) * 1000 if done else None,
        # When the injector had healed its damage (the apiserver answering again, …):
        # delete→gone minus this is the system's own recovery.
        "healed_ms": (healed_at[0] - start) * 1000 if healed_at else None,
        "stuck": gone_at is None or bool(more.get("stuck")),
        "released_early": trial.released_early and not fault.own_session,
        "leaked_files": leaked,
        "leaked_objects": leaked_objects,
        "lost_objects": more.get("lost_objects", 0),
        "partial_forks": more.get("partial_forks", 0),
        "statuses": trial.statuses,
        "notes": trial.notes,
        "seconds": time.monotonic() - began,  # the whole trial: what it costs a run
    }


def _heal(world: World) -> None:
    """Whatever a trial left broken is mended before the next one."""
    if world.stack.operator is None or world.stack.operator.poll() is not None:
        world.stack.start_operator()
    if world.stack.api is None or world.stack.api.poll() is not None:
        world.stack.start_api()
        world.api_moved()


def _summary(name: str, rows: list[dict]) -> dict:
    gone = [r["gone_ms"] for r in rows if r["gone_ms"] is not None]
    healed = [r["healed_ms"] for r in rows if r["healed_ms"] is not None]
    return {
        "name": name,
        "trials": len(rows),
        "leaked_files": sum(r["leaked_files"] for r in rows),
        "leaked_objects": sum(r["leaked_objects"] for r in rows),
        "lost_objects": sum(r["lost_objects"] for r in rows),
        "partial_forks": sum(r["partial_forks"] for r in rows),
        "trials_with_leaks": sum(1 for r in rows if r["leaked_files"] or r["leaked_objects"]),
        "stuck": sum(r["stuck"] for r in rows),
        "released_early": sum(r["released_early"] for r in rows),
        "delete_to_gone_ms": {
            "p50": round(percentile(gone, 50), 1) if gone else None,
            "p99": round(percentile(gone, 99), 1) if gone else None,
        },
        "fault_healed_ms": {
            "p50": round(percentile(healed, 50), 1) if healed else None,
            "p99": round(percentile(healed, 99), 1) if healed else None,
        },
        "notes": sorted({n for r in rows for n in r["notes"]}),
        "seconds": round(sum(r["seconds"] for r in rows), 1),
    }


def _phase(
    stack, world: World, faults: list[Fault], per_fault: int, quick: bool, rows: dict
) -> None:
    """``per_fault`` trials of every fault on one stack (operator and API processes)."""
    world.stack = stack
    world.quick = quick
    try:
        stack.start_operator()
        stack.start_api()
        for i in range(per_fault):  # faults interleaved: drift hits all alike
            for k, fault in enumerate(faults):
                if quick and fault.quick_trials is not None and i >= fault.quick_trials:
                    continue
                user = f"f-{k}-{i}" if fault.own_session else "faults"
                trial = Trial(fault.name, i, user, f"c-{k}-{i}", world.rng.uniform(0, 0.25))
                rows[fault.name].append(_run_trial(world, fault, trial, quick))
                _heal(world)
    finally:
        if stack.operator is None:
            stack.start_operator()
        stack.stop()


def run(quick: bool) -> list[Figure]:
    reason = _skip_reason(quick)
    if reason:
        print(f"faults: skipped — {reason}", flush=True)
        return []
    from kubeenv.stack import Stack  # importable once bench.operator set the path

    per_fault = 2 if quick else 20
    workdir = Path(tempfile.mkdtemp(prefix="sbw-bench-faults-"))
    # The node agent complains loudly while the apiserver restarts: to a file, not here.
    agent_log = logging.getLogger("kubeenv.nodeagent")
    agent_log.addHandler(logging.FileHandler(workdir / "node-agent.log"))
    agent_log.propagate = False
    selected, _, only = os.environ.get("SBW_FAULTS", "").partition(":")
    store_only = selected == "store"
    store_faults = [f for f in STORE_FAULTS + fork_trial.FAULTS
                    if only in f.name and not (quick and f.quick_trials == 0)]  # fmt: skip
    rows: dict[str, list[dict]] = {} if store_only else {f.name: [] for f in FAULTS}
    store_reason = seaweedfs_missing()
    if store_reason is None:
        rows.update({f.name: [] for f in store_faults})
    else:
        print(f"faults: store faults skipped — {store_reason}", flush=True)
    try:
        with _cluster(workdir) as (plane, api):
            agent = NodeAgent(plane.client, workdir / "node").start()
            worlds: list[World] = []
            try:
                if not store_only:
                    ns = _namespace(api, "faults")
                    worlds.append(World(plane, api, agent, None, ns, seed=12))
                    _phase(Stack(plane.kubeconfig, ns, workdir), worlds[0], FAULTS, per_fault,
                           quick, rows)  # fmt: skip
                if store_reason is None:
                    store = start_seaweedfs(workdir / "seaweedfs")
                    try:
                        store.make_bucket("faults")
                        ns = _namespace(api, "store-faults")
                        env = store.env("faults")
                        operator_env = {
                            k.replace("SANDBOX_WORKSPACE_", "SANDBOX_OPERATOR_"): v
                            for k, v in env.items()
                        }
                        stack = Stack(plane.kubeconfig, ns, workdir / "store", api_env=env,
                                      operator_env=operator_env)  # fmt: skip
                        (workdir / "store").mkdir()
                        worlds.append(World(plane, api, agent, None, ns, 13, store, "faults"))
                        _phase(stack, worlds[-1], store_faults, per_fault, quick, rows)
                    finally:
                        store.stop()
            finally:
                agent.stop()
                for world in worlds:  # last: a world's thread owns a restarted apiserver
                    world.close()
    except BaseException:
        print(f"faults: failed; logs kept in {workdir}", flush=True)
        raise
    summaries = own = [_summary(name, r) for name, r in rows.items()]
    out = RESULTS / ("faults-quick.json" if quick else "faults.json")
    if store_only and out.exists():  # the other faults' entries of the last full run stay
        ours = {s["name"] for s in summaries}
        kept = [s for s in json.loads(out.read_text())["faults"] if s["name"] not in ours]
        summaries = kept + summaries
    result = {
        "quick": quick,
        "trials": sum(s["trials"] for s in summaries),
        "leaked_files": sum(s["leaked_files"] for s in summaries),
        "leaked_objects": sum(s.get("leaked_objects", 0) for s in summaries),
        "lost_objects": sum(s.get("lost_objects", 0) for s in summaries),
        "partial_forks": sum(s.get("partial_forks", 0) for s in summaries),
        "stuck": sum(s["stuck"] for s in summaries),
        "released_early": sum(s["released_early"] for s in summaries),
        "faults": summaries,
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    RESULTS.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    if any(result[k] for k in ("leaked_files", "leaked_objects", "lost_objects", "stuck")):
        print(f"faults: LEAKS OR STUCK — logs kept in {workdir}", flush=True)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    first = next(iter(rows))  # the phase's control
    control = [r["gone_ms"] for r in rows[first] if r["gone_ms"] is not None] or [0.0]
    return [
        Figure.of(
            f"delete → gone, {name}",
            "ms",
            [r["gone_ms"] for r in rs if r["gone_ms"] is not None],
            "same, no fault",
            control,
            goal="0 leaked, 0 lost, 0 stuck",
            leaked_files=summary["leaked_files"],
            leaked_objects=summary["leaked_objects"],
            lost_objects=summary["lost_objects"],
            partial_forks=summary["partial_forks"],
            stuck=summary["stuck"],
        )
        for (name, rs), summary in zip(rows.items(), own, strict=True)
        if name != first and any(r["gone_ms"] is not None for r in rs)
    ]
