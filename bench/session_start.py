"""Session start on a real node: SandboxSession create → Running (a new pod) and resume
of a stopped session → Running, beside a bare Pod of the same image — all in the same run,
on the node tier's node (kubelet + containerd + runc, tests/node/nodeenv).

The run enters a private network/mount/PID namespace of its own (``nodeenv.netns``: it
re-executes ``python -m bench session_start`` there), starts the control plane,
kube-scheduler, containerd and the kubelet, a SeaweedFS on the node's address (the
bucket of store mode ``s3``: the mode in which sessions with the default spec may take a
pooled pod), installs the chart with docs/operations.md's install block (store mode s3;
operator check interval 2 s so idle sessions stop quickly — creation and resume are
event-driven and do not wait for it; sandbox requests lowered so 50 pool pods fit the
node) and measures, alternating so load drifts hit both:

- create → Running: a SandboxSession (spec ``userId``, ``idleTimeoutSeconds: 1``) is
  created and watched until ``status.phase`` is Running: the operator makes Secret and
  pod, the scheduler binds, the kubelet runs the container, the runtime answers, the
  operator reports Running.
- baseline: a bare Pod of the same image, command, security context and readiness probe,
  created and watched until Ready, then deleted.
- resume → Running: each session, stopped by its idle timeout (pod deleted), gets the
  ``resume-requested`` annotation and is watched until Running again.

The warm pool (issue 25, operator/pool), in the same run, with
``SANDBOX_BENCH_POOL_SIZE`` = N > 0: the figures above are taken with no pool (the cold
baseline); then ``helm upgrade`` sets ``sandbox.pool.size`` = N and
``sandbox.pool.refillBatch`` = ``SANDBOX_BENCH_POOL_REFILL_BATCH`` (10: pods starting at
once while refilling), and with the pool full before each sample: create → Running
(beside each, the floor: one apiserver write and its watch event), resume → Running, a
burst of N concurrent creations (with the same split at the claim), and how long the
pool takes to be full of ready pods again after the burst (``refill_seconds``; the
burst's sessions are deleted meanwhile, so memory stays bounded).
``SANDBOX_BENCH_SESSION_START_PARTS=pool`` runs the pool phase alone (no cold samples:
the floor is its baseline) and updates only the pool's keys of the JSON, whose cold
figures then stay those of the run named by ``when`` (the pool's run: ``pool_when``).
The load average (1 min) is recorded when the pool phase starts and ends.

Where time goes: a watcher records when each pod is first seen, scheduled, its container
started, its runtime first answers /healthz (polled every 20 ms) and the pod is Ready
(perf_counter, not the API's 1 s timestamps); the JSON carries the median of each step.
Results: ``bench/results/session_start.json``.

Skipped (with the reason) where the node tier cannot run (not root, no unshare, no
containerd/runc/CNI plugins/podman, no Go for the binaries), and in --quick mode (a real
node costs minutes; the node tier's tests cover the path).
"""

from __future__ import annotations

import calendar
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from .harness import Figure, namespaced_scratch, note_workdir, percentile
from .operator import _pod_ready, _session_running, _watch_until

REPO = Path(__file__).resolve().parents[1]
# nodeenv, kubeenv, and the test-support helpers nodeenv uses (doc_blocks).
sys.path[:0] = [str(REPO / "tests" / p) for p in ("node", "cluster", "support")]

from kubeenv import KubeClient, wait_until  # noqa: E402
from nodeenv import netns, network  # noqa: E402
from nodeenv.pods import bare_sandbox_pod  # noqa: E402
from nodeenv.prepare import PrepareFailed, prepare, skip_reason  # noqa: E402
from nodeenv.release import NAMESPACE, OPERATOR, RELEASE, SESSIONS  # noqa: E402

RESULTS = REPO / "bench" / "results" / "session_start.json"
OUT_ENV = "SANDBOX_BENCH_SESSION_START_OUT"
SBS_API = "/apis/sandboxworkspace.io/v1alpha1"
RESUME = "sandboxworkspace.io/resume-requested"
BARE_NS = "bench-bare"
GOAL = "create → Running p50 ≤ 2 s"
POOL_GOAL = "from the pool: create and resume → Running p50 ≤ 50 ms, p99 ≤ 250 ms"
# 0 (the default for now): no pool phase, the chart without a pool — as before.
POOL_SIZE = int(os.environ.get("SANDBOX_BENCH_POOL_SIZE", "0"))
POOL_REFILL_BATCH = int(os.environ.get("SANDBOX_BENCH_POOL_REFILL_BATCH", "10"))
POOL_ONLY = os.environ.get("SANDBOX_BENCH_SESSION_START_PARTS", "all") == "pool"
POOL_LABEL = "sandboxworkspace.io/pool"
BUCKET = "bench-sessions"
S3_SECRET = "bench-s3"
CGROUP_MEMORY = Path("/sys/fs/cgroup/memory")
CGROUP_CPU = Path("/sys/fs/cgroup/cpuacct")
FLOOR_NS = "bench-floor"
# A directory: py-spy profiles of the operator during the burst (``_profile``).
PROFILE_ENV = "SANDBOX_BENCH_PROFILE"


def run(quick: bool) -> list[Figure]:
    if quick:
        print("session_start: skipped in --quick mode (a real node costs minutes)", flush=True)
        return []
    if network.inside():
        raise RuntimeError("run() is the outer side; the namespace side is inner()")
    reason = skip_reason()
    if reason:
        print(f"session_start: skipped — {reason}", flush=True)
        return []
    try:
        env = prepare(sys.stderr)
    except PrepareFailed as exc:
        print(f"session_start: skipped — {exc}", flush=True)
        return []
    data = run_inside("bench.session_start", OUT_ENV, env, "session_start")
    RESULTS.parent.mkdir(exist_ok=True)
    summary = data["summary"]
    if POOL_ONLY and RESULTS.exists():  # the cold figures of the run before stay
        summary = {**json.loads(RESULTS.read_text()), **summary}
    RESULTS.write_text(json.dumps(summary, indent=2) + "\n")
    s = data["samples"]
    extra = data["summary"]
    if POOL_ONLY:
        return _pool_figures(s, extra, "one apiserver write + its watch event", s["floor"])
    figures = [
        Figure.of(
            "session create → Running (real node)",
            "ms",
            s["create"],
            "bare Pod create → Ready, same image",
            s["baseline"],
            goal=GOAL,
            breakdown_ms=extra["create_breakdown_ms"],
        ),
        Figure.of(
            "stopped session resume → Running (real node)",
            "ms",
            s["resume"],
            "bare Pod create → Ready, same image",
            s["baseline"],
            breakdown_ms=extra["resume_breakdown_ms"],
        ),
    ]
    if "pool_create" not in s:
        return figures
    return [*figures, *_pool_figures(s, extra, "session create → Running, cold", s["create"])]


def _pool_figures(s: dict, extra: dict, baseline: str, base: list[float]) -> list[Figure]:
    return [
        Figure.of(
            "session create → Running from the warm pool (real node)",
            "ms",
            s["pool_create"],
            baseline,
            base,
            goal=POOL_GOAL,
        ),
        Figure.of(
            "stopped session resume → Running from the warm pool (real node)",
            "ms",
            s["pool_resume"],
            baseline if POOL_ONLY else "stopped session resume → Running, cold",
            base if POOL_ONLY else s["resume"],
            goal=POOL_GOAL,
        ),
        Figure.of(
            f"burst of {extra['pool_burst_n']} creations from the warm pool (real node)",
            "ms",
            s["pool_burst"],
            "the same burst of ConfigMap creations + their watch events",
            s["floor_burst"],
            refill_seconds=extra["refill_seconds"],
        ),
    ]


# ----------------------------------------------------------------- inside the namespace
class PodSteps:
    """perf_counter times at which each pod of a namespace was first seen in each step."""

    STEPS = ("seen", "scheduled", "started", "listening", "ready")

    def __init__(self, kube_factory, namespace: str, *, listen: bool = True):
        """``listen``: poll each started pod's /healthz (not in a burst: 50 threads
        polling would load the machine the burst is measured on)."""
        self.times: dict[str, dict[str, float]] = {}
        self._listen = listen
        self._stop = threading.Event()
        self._kube, self._ns = kube_factory, namespace
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with self._kube() as kube:
            rv = kube.get(f"/api/v1/namespaces/{self._ns}/pods")["metadata"]["resourceVersion"]
            while not self._stop.is_set():
                try:
                    for event in kube.watch(f"/api/v1/namespaces/{self._ns}/pods", rv, 5):
                        pod = event.get("object", {})
                        rv = pod.get("metadata", {}).get("resourceVersion", rv)
                        if event.get("type") in ("ADDED", "MODIFIED"):
                            self._note(pod)
                except Exception:  # a dropped watch: resume from the last version
                    time.sleep(0.1)

    def _note(self, pod: dict) -> None:
        now = time.perf_counter()
        key = f"{pod['metadata']['name']}/{pod['metadata']['uid']}"
        seen = self.times.setdefault(key, {"seen": now})
        status = pod.get("status") or {}
        if pod["spec"].get("nodeName"):
            seen.setdefault("scheduled", now)
        if (pod["metadata"].get("labels") or {}).get(POOL_LABEL) == "claimed":
            seen.setdefault("claimed", now)
        running = any(
            "running" in (c.get("state") or {}) for c in status.get("containerStatuses", [])
        )
        if running:
            seen.setdefault("started", now)
            # The IP may come in a later event than the running state: poll from then.
            if self._listen and status.get("podIP") and not seen.get("polling"):
                seen["polling"] = now
                threading.Thread(
                    target=self._listening, args=(seen, status["podIP"]), daemon=True
                ).start()
        if _pod_ready(pod):
            seen.setdefault("ready", now)

    @staticmethod
    def _listening(seen: dict[str, float], ip: str) -> None:
        """When the runtime first answers /healthz (polled every 20 ms from the start of
        its container): what separates it from Ready is the readiness probe's period."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://{ip}:8080/healthz", timeout=1).status_code == 200:
                    seen["listening"] = time.perf_counter()
                    return
            time.sleep(0.02)

    def of(self, name: str, after: float) -> dict[str, float]:
        """Steps of the pod ``name`` first seen after ``after``."""
        for key, steps in self.times.items():
            if key.startswith(f"{name}/") and steps["seen"] >= after:
                return steps
        return {}

    def claimed_at(self, name: str) -> float | None:
        """When the pool pod ``name`` was first seen claimed."""
        for key, steps in self.times.items():
            if key.startswith(f"{name}/") and "claimed" in steps:
                return steps["claimed"]
        return None

    def stop(self) -> None:
        self._stop.set()


def _breakdown(samples: list[tuple[float, dict[str, float], float]], last: str) -> dict[str, float]:
    """Median ms of each step: request → pod seen → scheduled → container started →
    runtime answers → ``last`` (the end: the session's Running, the bare pod's Ready).
    Plus, where the kubelet's Ready came after the end (a session reported Running by the
    operator's own check), ``(kubelet Ready after Running)``: how much that check saved."""
    names = ("operator: pod created", "scheduled", "container started", "runtime answers", last)
    spans: dict[str, list[float]] = {n: [] for n in names}
    later: list[float] = []
    for start, steps, end in samples:
        marks = [start, *(steps.get(s) for s in PodSteps.STEPS if s != "ready"), end]
        if None in marks:
            continue
        for name, a, b in zip(names, marks[:-1], marks[1:], strict=True):
            spans[name].append((b - a) * 1000)  # type: ignore[operator]
        if "ready" in steps:
            later.append(max(0.0, steps["ready"] - end) * 1000)
    out = {n: round(statistics.median(v), 1) for n, v in spans.items() if v}
    if later and last != "Ready":
        out["(kubelet Ready after Running)"] = round(statistics.median(later), 1)
    return out


def _session(user: str, idle: int = 1) -> dict:
    """A session that stops after ``idle`` seconds without use (1: resumes are measured)."""
    return {
        "apiVersion": "sandboxworkspace.io/v1alpha1",
        "kind": "SandboxSession",
        "metadata": {"name": f"sb-session-{user}"},
        "spec": {"userId": user, "idleTimeoutSeconds": idle},
    }


def _install_values(endpoint: str) -> dict[str, str]:
    """The chart's values of this run (the pool comes later, by an upgrade)."""
    return {
        "operator.settings.CHECK_INTERVAL_SECONDS": "2",
        # Store mode s3 (SeaweedFS on the node's address): the mode pooled pods serve.
        "store.mode": "s3",
        "store.s3.endpointUrl": endpoint,
        "store.s3.bucket": BUCKET,
        "store.s3.existingSecret": S3_SECRET,
        # 50 pool pods and the sessions beside them on one 2-core node: what each sandbox
        # reserves is lowered (the defaults, 100m CPU each, would not fit); limits unchanged.
        "sandbox.resources.requests.cpu": "10m",
        "sandbox.resources.requests.memory": "64Mi",
        "sandbox.resources.requests.ephemeral-storage": "16Mi",
        "sandbox.pool.size": "0",
    }


def _s3_secret(store) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": S3_SECRET, "namespace": NAMESPACE},
        "stringData": {
            "access-key-id": store.access_key,
            "secret-access-key": store.secret_key,
        },
    }


def run_inside(module: str, out_env: str, env: dict[str, str], what: str) -> dict:
    """``python -m module`` inside the node's private namespaces, its JSON result (the
    file named by ``out_env``); its work directories are removed after it ends."""
    with namespaced_scratch("sbw-bench-result-") as (top, scratch_env):
        out = top / "result.json"
        argv = netns.command([sys.executable, "-m", module])
        rc = subprocess.run(
            argv, cwd=REPO, env=netns.env(**env, **scratch_env, **{out_env: str(out)}), check=False
        ).returncode
        if rc != 0 or not out.exists():
            raise RuntimeError(f"{what}: the run inside the namespace failed (exit {rc})")
        return json.loads(out.read_text())


@contextlib.contextmanager
def s3_release(prefix: str) -> Iterator[tuple[object, object, KubeClient]]:
    """A started node with the chart installed in store mode s3 (``_install_values``),
    SeaweedFS on the node's address: ``(cluster, release, kube)``, all stopped after."""
    from nodeenv.network import NODE_IP
    from nodeenv.node import NodeCluster
    from nodeenv.release import Release
    from seaweedfs import start_seaweedfs

    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    note_workdir(workdir)
    cluster = NodeCluster(workdir / "node")
    store = None
    try:
        cluster.start(stream=sys.stderr)
        # On the node's address (made by the cluster's start): the API and operator pods
        # reach it there.
        store = start_seaweedfs(workdir / "s3", host=NODE_IP)
        store.make_bucket(BUCKET)
        with cluster.client() as kube:
            kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
            kube.apply(_s3_secret(store))
        release = Release(
            cluster.kubeconfig,
            workdir / "release",
            cluster.images["image"],
            _install_values(store.endpoint),
        )
        installed = release.install()
        if installed.returncode != 0:
            raise RuntimeError(f"helm install failed:\n{installed.stdout}\n{installed.stderr}")
        with cluster.client() as kube:
            yield cluster, release, kube
    finally:
        cluster.stop()
        if store is not None:
            store.stop()


def inner(n: int = 20) -> dict:
    with s3_release("sbw-bench-node-") as (cluster, release, kube):
        result = {"summary": {}, "samples": {}}
        if not POOL_ONLY:
            result = _measure(cluster, kube, SESSIONS, n)
        if POOL_SIZE > 0:
            before = _pods_rss(cluster)
            _enable_pool(release, POOL_SIZE)
            pool = _measure_pool(cluster, kube, SESSIONS, n, POOL_SIZE, before)
            result["summary"].update(pool.pop("summary"))
            result["samples"].update(pool)
        return result


def _enable_pool(release, size: int) -> None:
    """helm upgrade to a pool of ``size``, and wait for the operators to roll."""
    script = (
        f"helm upgrade {RELEASE} charts/sandbox-workspace -n {NAMESPACE} --reuse-values "
        f"--set sandbox.pool.size={size} --set sandbox.pool.refillBatch={POOL_REFILL_BATCH}\n"
        f"kubectl -n {NAMESPACE} rollout status statefulset/{OPERATOR} --timeout=300s\n"
    )
    done = release.shell(script, timeout=400)
    if done.returncode != 0:
        raise RuntimeError(f"enabling the pool failed:\n{done.stdout}\n{done.stderr}")


def _pods_rss(cluster) -> int:
    """Bytes of memory (rss) of every pod on the node: the kubelet's kubepods cgroup."""
    stat = CGROUP_MEMORY / cluster.cgroups.name / "kubepods" / "memory.stat"
    for line in stat.read_text().splitlines():
        key, _, value = line.partition(" ")
        if key == "total_rss":
            return int(value)
    raise RuntimeError(f"no total_rss in {stat}")


def _measure(cluster, kube: KubeClient, sessions_ns: str, n: int) -> dict:
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": BARE_NS}})
    wait_until(lambda: kube.get_or_none(f"/api/v1/namespaces/{BARE_NS}/serviceaccounts/default"))
    image = cluster.images["image"]
    sbs = f"{SBS_API}/namespaces/{sessions_ns}/sandboxsessions"
    pods = f"/api/v1/namespaces/{BARE_NS}/pods"
    steps = PodSteps(cluster.client, sessions_ns)
    bare_steps = PodSteps(cluster.client, BARE_NS)
    created: list[tuple[float, dict, float]] = []
    bare: list[tuple[float, dict, float]] = []
    try:
        for i in range(n + 1):  # the first of each is a warm-up
            start = time.perf_counter()
            obj = kube.create(sbs, _session(f"bench-{i}"))
            end = _watch_until(kube, sbs, obj, _session_running, timeout=120)
            if i:
                created.append((start, steps.of(_pod_name(obj), start), end))
            start = time.perf_counter()
            obj = kube.create(pods, bare_sandbox_pod(f"bare-{i}", BARE_NS, image))
            end = _watch_until(kube, pods, obj, _pod_ready, timeout=120)
            if i:
                bare.append((start, bare_steps.of(f"bare-{i}", start), end))
            kube.delete(f"{pods}/bare-{i}", gracePeriodSeconds=0)
        # Every session stops by its idle timeout: pod deleted, PVC kept.
        for i in range(n + 1):
            kube.wait_for(
                f"{sbs}/sb-session-bench-{i}",
                lambda s: (s.get("status") or {}).get("phase") == "Stopped",
                timeout=180,
            )
        resumed: list[tuple[float, dict, float]] = []
        for i in range(1, n + 1):
            path = f"{sbs}/sb-session-bench-{i}"
            wait_until(lambda p=path: _pod_gone(kube, sessions_ns, p), timeout=60)
            start = time.perf_counter()
            obj = kube.patch(path, {"metadata": {"annotations": {RESUME: _now()}}})
            end = _watch_until(kube, sbs, obj, _session_running, timeout=120)
            resumed.append((start, steps.of(_pod_name(obj), start), end))
    finally:
        steps.stop()
        bare_steps.stop()
    ms = {
        "create": [(e - s) * 1000 for s, _, e in created],
        "baseline": [(e - s) * 1000 for s, _, e in bare],
        "resume": [(e - s) * 1000 for s, _, e in resumed],
    }
    summary = {
        "n": n,
        "create_p50_ms": round(statistics.median(ms["create"]), 1),
        "create_p99_ms": round(percentile(ms["create"], 99), 1),
        "resume_p50_ms": round(statistics.median(ms["resume"]), 1),
        "resume_p99_ms": round(percentile(ms["resume"], 99), 1),
        "baseline_pod_p50_ms": round(statistics.median(ms["baseline"]), 1),
        "baseline_pod_p99_ms": round(percentile(ms["baseline"], 99), 1),
        "create_breakdown_ms": _breakdown(created, "Running"),
        "resume_breakdown_ms": _breakdown(resumed, "Running"),
        "baseline_breakdown_ms": _breakdown(bare, "Ready"),
        "goal": GOAL,
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    return {"summary": summary, "samples": ms}


def _free_ready(kube: KubeClient, ns: str) -> int:
    pods = kube.list(f"/api/v1/namespaces/{ns}/pods", labelSelector=f"{POOL_LABEL}=free")
    return sum(1 for p in pods if _pod_ready(p) and not p["metadata"].get("deletionTimestamp"))


def _pool_full(kube: KubeClient, ns: str, size: int, timeout: float = 300) -> float:
    """perf_counter time at which ``size`` free pool pods are ready (polled every 50 ms)."""
    wait_until(
        lambda: _free_ready(kube, ns) >= size,
        timeout=timeout,
        interval=0.05,
        message=f"{size} free ready pool pods",
    )
    return time.perf_counter()


def _floor(kube: KubeClient, i: int) -> float:
    """The floor of a start through the API: one write (a ConfigMap patched) and its watch
    event, measured the way the sessions are (the write, then a watch from the version
    before it)."""
    path = f"/api/v1/namespaces/{FLOOR_NS}/configmaps/floor"
    before = kube.get_or_none(path) or kube.create(
        f"/api/v1/namespaces/{FLOOR_NS}/configmaps", {"metadata": {"name": "floor"}}
    )
    start = time.perf_counter()
    kube.patch(path, {"data": {"i": str(i)}})
    cms = f"/api/v1/namespaces/{FLOOR_NS}/configmaps"
    end = _watch_until(kube, cms, before, lambda o: (o.get("data") or {}).get("i") == str(i))
    return (end - start) * 1000


def _claim_split(steps: PodSteps, pod: str, start: float, end: float) -> tuple[float, float]:
    """(request → the pod's claim seen on a watch, that → Running) in ms."""
    claimed = steps.claimed_at(pod)
    if claimed is None:
        return (float("nan"), float("nan"))
    return ((claimed - start) * 1000, (end - claimed) * 1000)


def _measure_pool(cluster, kube: KubeClient, ns: str, n: int, size: int, rss_before: int) -> dict:
    """The warm pool's figures (module docstring); samples in ms, and the summary."""
    sbs = f"{SBS_API}/namespaces/{ns}/sandboxsessions"
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": FLOOR_NS}})
    _pool_full(kube, ns, size, timeout=600)
    rss_full = _pods_rss(cluster)
    load_before, began = os.getloadavg()[0], time.strftime("%Y-%m-%d %H:%M:%S")
    steps = PodSteps(cluster.client, ns)
    create: list[float] = []
    # (request, Running seen) on the monotonic clock the operator's "started from the
    # pool" log lines share (its handler's start, ``begun``): the span before the operator.
    create_marks: list[tuple[float, float]] = []
    floor: list[float] = []
    splits: list[tuple[float, float]] = []
    pods: dict[str, str] = {}
    sources: list[str] = []
    try:
        for i in range(n + 1):  # the first is a warm-up
            _pool_full(kube, ns, size)
            sample = _floor(kube, i)
            start = time.perf_counter()
            obj = kube.create(sbs, _session(f"pool-{i}"))
            end = _watch_until(kube, sbs, obj, _session_running, timeout=120)
            status = kube.get(f"{sbs}/{obj['metadata']['name']}")["status"]
            pods[obj["metadata"]["name"]] = status["podName"]
            sources.append(status.get("startedFrom") or "")
            if i:
                create.append((end - start) * 1000)
                create_marks.append((start, end))
                floor.append(sample)
                splits.append(_claim_split(steps, status["podName"], start, end))
        for name in pods:
            kube.wait_for(
                f"{sbs}/{name}",
                lambda s: (s.get("status") or {}).get("phase") == "Stopped",
                timeout=180,
            )
        resume: list[float] = []
        for i in range(1, n + 1):
            name = f"sb-session-pool-{i}"
            pod = f"/api/v1/namespaces/{ns}/pods/{pods[name]}"
            wait_until(lambda p=pod: kube.get_or_none(p) is None, timeout=60)
            _pool_full(kube, ns, size)
            start = time.perf_counter()
            obj = kube.patch(f"{sbs}/{name}", {"metadata": {"annotations": {RESUME: _now()}}})
            end = _watch_until(kube, sbs, obj, _session_running, timeout=120)
            status = kube.get(f"{sbs}/{name}")["status"]
            sources.append(status.get("startedFrom") or "")
            resume.append((end - start) * 1000)
            splits.append(_claim_split(steps, status["podName"], start, end))
    finally:
        steps.stop()
    floor_burst = _floor_burst(cluster, size)
    burst_marks: list[tuple[float, float]] = []
    burst_requests: dict[str, float] = {}
    burst_cpu_split: dict[str, float] = {}
    burst, refill, burst_splits, burst_cpu = _burst(
        cluster, kube, sbs, ns, size, sources, burst_marks, burst_requests, burst_cpu_split
    )
    claimed = [c for c, _ in splits if c == c]
    after = [a for _, a in splits if a == a]
    burst_claimed = [c for c, _ in burst_splits if c == c]
    burst_after = [a for _, a in burst_splits if a == a]
    summary = {
        "pool_when": began,
        "pool_loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "pool_refill_batch": POOL_REFILL_BATCH,
        "pool_size": size,
        "pool_create_p50_ms": round(statistics.median(create), 1),
        "pool_create_p99_ms": round(percentile(create, 99), 1),
        "pool_resume_p50_ms": round(statistics.median(resume), 1),
        "pool_resume_p99_ms": round(percentile(resume, 99), 1),
        "floor_p50_ms": round(statistics.median(floor), 1),
        "floor_p99_ms": round(percentile(floor, 99), 1),
        # Where a claim's time goes (create and resume samples): the request until the
        # pod's compare-and-swap shows on a pod watch (the operator's event, reads and the
        # swap), then until Running shows (token to the runtime, the status write, its event).
        "pool_breakdown_ms": {
            "request → pod claimed (watch)": round(statistics.median(claimed), 1)
            if claimed
            else None,
            "pod claimed → Running (watch)": round(statistics.median(after), 1) if after else None,
        },
        "pool_burst_n": size,
        "pool_burst_p50_ms": round(statistics.median(burst), 1),
        "pool_burst_p99_ms": round(percentile(burst, 99), 1),
        # The same burst of writes + watch events without the operator (ConfigMaps).
        "floor_burst_p50_ms": round(statistics.median(floor_burst), 1),
        "floor_burst_p99_ms": round(percentile(floor_burst, 99), 1),
        # From the gate until the last burst session is Running: CPU the operator used
        # (ms per creation) and how busy the whole machine's cores were (every user's).
        "pool_burst_operator_cpu_ms_per_start": round(burst_cpu[0] * 1000 / size, 1),
        "pool_burst_machine_busy_percent": round(burst_cpu[1], 1),
        # The same span's CPU seconds by component (the run's own processes by name, and
        # the machine's busy time outside the run: the other engineers' work).
        "pool_burst_cpu_seconds": burst_cpu_split,
        "pool_burst_seconds": round(
            max(e for _, e in burst_marks) - min(s for s, _ in burst_marks), 2
        ),
        # The same split for the burst, p50 / p99: queueing shows in the first span.
        "pool_burst_breakdown_ms": {
            "request → pod claimed (watch)": _p50_p99(burst_claimed),
            "pod claimed → Running (watch)": _p50_p99(burst_after),
        },
        # The apiserver's requests per burst creation (every client's, the bench's own
        # create and watch included), from the gate until the last one is Running.
        "pool_burst_requests_per_start": burst_requests,
        "refill_seconds": round(refill, 2),
        "pool_pod_rss_mib": round((rss_full - rss_before) / size / 2**20, 1),
        # Pool-phase starts that fell back to a cold pod (the pool ran dry or a claim lost).
        "pool_phase_cold_starts": sum(1 for s in sources if s != "pool"),
        "pool_goal": POOL_GOAL,
    }
    return {
        "summary": summary,
        "pool_create": create,
        "pool_create_marks": create_marks,
        "pool_burst_marks": burst_marks,
        "pool_resume": resume,
        "pool_burst": burst,
        "floor": floor,
        "floor_burst": floor_burst,
    }


def _p50_p99(values: list[float]) -> list[float] | None:
    if not values:
        return None
    return [round(statistics.median(values), 1), round(percentile(values, 99), 1)]


def _operator_cpu(cluster, kube: KubeClient) -> float:
    """Seconds of CPU the operator's pods (both replicas) have used: their cgroups'
    ``cpuacct.usage`` (the kubelet's kubepods tree of this run)."""
    root = CGROUP_CPU / cluster.cgroups.name / "kubepods"
    total = 0
    for pod in kube.list(f"/api/v1/namespaces/{NAMESPACE}/pods"):
        if pod["metadata"]["name"].startswith(OPERATOR):
            for cgroup in root.rglob(f"pod{pod['metadata']['uid']}"):
                total += int((cgroup / "cpuacct.usage").read_text())
    return total / 1e9


def _operator_pids(cluster, kube: KubeClient) -> list[int]:
    """Host pids of the operator pods' processes (their cgroups' ``cgroup.procs``)."""
    root = CGROUP_CPU / cluster.cgroups.name / "kubepods"
    pids: list[int] = []
    for pod in kube.list(f"/api/v1/namespaces/{NAMESPACE}/pods"):
        if pod["metadata"]["name"].startswith(OPERATOR):
            for cgroup in root.rglob(f"pod{pod['metadata']['uid']}"):
                for procs in cgroup.rglob("cgroup.procs"):
                    pids += [int(p) for p in procs.read_text().split()]
    return sorted(set(pids))


def _profile(cluster, kube: KubeClient, seconds: int) -> list[subprocess.Popen]:
    """With ``SANDBOX_BENCH_PROFILE`` = a directory: py-spy records every operator process
    for ``seconds`` (a burst's; nonblocking: the operator is never paused) into
    ``operator-<pid>.txt`` (collapsed stacks). Nothing without it or without py-spy."""
    out = os.environ.get(PROFILE_ENV)
    spy = Path(sys.executable).parent / "py-spy"
    if not out or not spy.exists():
        return []
    Path(out).mkdir(parents=True, exist_ok=True)
    return [
        subprocess.Popen(
            [
                *(str(spy), "record", "--nonblocking", "--format", "raw", "--rate", "200"),
                *("--duration", str(seconds), "--pid", str(pid)),
                *("--output", f"{out}/operator-{pid}.txt"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for pid in _operator_pids(cluster, kube)
        if Path(f"/proc/{pid}/cmdline").read_bytes().find(b"operator") >= 0
    ]


def _requests(kube: KubeClient) -> dict[str, float]:
    """The apiserver's own count of requests served so far, by ``VERB resource``
    (``apiserver_request_total``: every client's — the bench's, the operator's, the
    kubelet's, kopf's Events)."""
    counts: dict[str, float] = {}
    for line in str(kube.get("/metrics")).splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels, _, value = line.partition("} ")
        pairs = labels.removeprefix("apiserver_request_total{").split(",")
        fields = {k: v.strip('"') for k, _, v in (p.partition("=") for p in pairs)}
        key = f"{fields.get('verb', '')} {fields.get('resource', '')}"
        counts[key] = counts.get(key, 0.0) + float(value)
    return counts


def _event_sources(kube: KubeClient, since: float) -> dict[str, float]:
    """Who wrote the Events the apiserver counts (``POST events``, and ``PATCH events``:
    a repeated Event's count raised by its reporter), from ``since`` (wall clock): per
    ``events by <component> <reason> <kind>``, the Events made and their repeats (the
    caller divides them per start, as the request counts)."""
    out: dict[str, float] = {}
    for event in kube.list("/api/v1/events"):
        last = event.get("lastTimestamp") or event.get("eventTime") or ""
        try:
            stamp = calendar.timegm(time.strptime(last[:19], "%Y-%m-%dT%H:%M:%S"))
        except ValueError:
            continue
        if stamp < int(since):
            continue
        source = event.get("reportingComponent") or (event.get("source") or {}).get("component")
        kind = (event.get("involvedObject") or {}).get("kind", "")
        key = f"events by {source} {event.get('reason')} {kind}"
        made, repeats = out.get(f"{key}: made", 0.0), out.get(f"{key}: repeats", 0.0)
        out[f"{key}: made"] = made + 1
        out[f"{key}: repeats"] = repeats + max(0, (event.get("count") or 1) - 1)
    return {k: v for k, v in sorted(out.items()) if v}


def _process_cpu() -> dict[int, tuple[str, float]]:
    """pid → (component, CPU seconds so far) of every process this run's namespace sees
    (its own PID namespace: the control plane, node, pods and the bench): the operator,
    the pods' runtimes and the bench by their command line, kernel workers as one, the
    rest by name."""
    hz = os.sysconf("SC_CLK_TCK")
    out: dict[int, tuple[str, float]] = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            stat = (proc / "stat").read_text()
            line = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        comm, fields = stat[stat.index("(") + 1 : stat.rindex(")")], stat.rsplit(")", 1)[1].split()
        if "sandbox-workspace" in line or "sandbox_workspace" in line:
            comm = next((r for r in ("operator", "runtime", "api") if f" {r}" in line), comm)
        elif "-m bench" in line:  # not "bench" alone: the control plane's paths have it
            comm = "bench (this run's client threads)"
        elif comm.startswith("kworker"):
            comm = "kernel workers"
        out[int(proc.name)] = (comm, (int(fields[11]) + int(fields[12])) / hz)
    return out


def _cpu_split(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], busy: float
) -> dict[str, float]:
    """CPU seconds per component between two ``_process_cpu`` readings (a process born
    in between: all of its time), the largest first; ``outside this run`` is the
    machine's busy time the namespace cannot see."""
    spent: dict[str, float] = {}
    for pid, (comm, seconds) in after.items():
        spent[comm] = spent.get(comm, 0.0) + seconds - before.get(pid, (comm, 0.0))[1]
    top = {k: round(v, 2) for k, v in sorted(spent.items(), key=lambda kv: -kv[1]) if v >= 0.01}
    top["outside this run"] = round(max(0.0, busy - sum(spent.values())), 2)
    return top


def _machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far (/proc/stat: every
    engineer's work, not only this run's)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]
    return (sum(fields) - idle) / hz, sum(fields) / hz


def _floor_burst(cluster, size: int) -> list[float]:
    """The floor of a burst: ``size`` threads released together, each creating a
    ConfigMap and watching until its event shows — the burst's client side and the
    apiserver's, without the operator (ms each)."""
    cms = f"/api/v1/namespaces/{FLOOR_NS}/configmaps"
    took: list[float] = [0.0] * size
    gate = threading.Barrier(size)

    def one(j: int) -> None:
        with cluster.client() as own:
            # The connection is open before the gate; the watch starts before the write.
            rv = own.get(f"{cms}?limit=1")["metadata"]["resourceVersion"]
            gate.wait()
            start = time.perf_counter()
            name = own.create(cms, {"metadata": {"name": f"burst-{j}"}})["metadata"]["name"]
            before = {"metadata": {"name": name, "resourceVersion": rv}}
            took[j] = (_watch_until(own, cms, before, lambda _: True) - start) * 1000

    threads = [threading.Thread(target=one, args=(j,)) for j in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if not all(took):
        raise RuntimeError("a floor burst creation was not seen")
    return took


def _burst(
    cluster,
    kube: KubeClient,
    sbs: str,
    ns: str,
    size: int,
    sources: list[str],
    marks: list[tuple[float, float]],
    requests: dict[str, float],
    split: dict[str, float],
) -> tuple[list[float], float, list[tuple[float, float]], tuple[float, float]]:
    """``size`` concurrent creations on a full pool; then the sessions are deleted (their
    pods go: memory stays bounded) while the pool refills. (ms each, refill s, each
    creation's split at its pod's claim, (operator CPU s, machine busy %) meanwhile);
    ``split`` gets the CPU seconds each component used meanwhile (``_cpu_split``)."""
    _pool_full(kube, ns, size)
    burst: list[float] = [0.0] * size
    ends: list[float] = [0.0] * size
    starts: list[float] = [0.0] * size
    pods: list[str] = [""] * size
    gate = threading.Barrier(size)
    steps = PodSteps(cluster.client, ns, listen=False)

    def one(j: int) -> None:
        with cluster.client() as own:
            own.get(f"{sbs}?limit=1")  # the connection is open before the gate
            gate.wait()
            starts[j] = start = time.perf_counter()
            # Not stopped while the burst goes on (its first ones would be, after 1 s, and
            # their stops load the node the last claims run on): deleted after it.
            obj = own.create(sbs, _session(f"burst-{j}", idle=600))
            ends[j] = _watch_until(own, sbs, obj, _session_running, timeout=180)
            burst[j] = (ends[j] - start) * 1000
            status = own.get(f"{sbs}/{obj['metadata']['name']}")["status"]
            sources.append(status["startedFrom"])
            pods[j] = status["podName"]

    threads = [threading.Thread(target=one, args=(j,)) for j in range(size)]
    spies = _profile(cluster, kube, 8)
    wall_start = time.time()
    requests_before = _requests(kube)
    cpu_before, (busy_before, all_before) = _operator_cpu(cluster, kube), _machine_busy()
    procs_before = _process_cpu()
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        steps.stop()
    procs_after = _process_cpu()
    busy, every = (a - b for a, b in zip(_machine_busy(), (busy_before, all_before), strict=True))
    split.update(_cpu_split(procs_before, procs_after, busy))
    cpu = (_operator_cpu(cluster, kube) - cpu_before, 100 * busy / every if every else 0.0)
    splits = [_claim_split(steps, pods[j], starts[j], ends[j]) for j in range(size) if pods[j]]
    served = _requests(kube)
    for key, count in requests_before.items():
        served[key] = served.get(key, 0.0) - count
    requests.update({k: round(v / size, 2) for k, v in sorted(served.items()) if v / size >= 0.05})
    events = _event_sources(kube, wall_start)
    requests.update({k: round(v / size, 2) for k, v in events.items()})
    for spy in spies:
        spy.wait()
    marks.extend(zip(starts, ends, strict=True))
    if not all(ends):
        raise RuntimeError("a burst creation did not reach Running")
    for j in range(size):
        kube.delete(f"{sbs}/sb-session-burst-{j}")
    refill = _pool_full(kube, ns, size, timeout=600) - max(ends)
    return burst, refill, splits, cpu


def _pod_name(session: dict) -> str:
    from sandbox_workspace.operator import naming

    return naming.runtime_pod_name(session["metadata"]["name"])


def _pod_gone(kube: KubeClient, ns: str, session_path: str) -> bool:
    from sandbox_workspace.operator import naming

    name = session_path.rsplit("/", 1)[1]
    return kube.get_or_none(f"/api/v1/namespaces/{ns}/pods/{naming.runtime_pod_name(name)}") is None


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


if __name__ == "__main__":
    # The namespace side: `run()` re-executes this module inside nodeenv.netns.
    result = inner(int(os.environ.get("SANDBOX_BENCH_SESSION_START_N", "20")))
    Path(os.environ[OUT_ENV]).write_text(json.dumps(result))
    print(json.dumps(result["summary"], indent=2))
