"""The operator at scale: N sessions on the cluster tier's real etcd + kube-apiserver.

``python -m bench operator --sessions 10000`` (``--quick``: 60 sessions, short windows).
Pods stay Pending (no node agent), as a cluster whose nodes are full would leave them;
only the idle-stop step makes pods look Running — a stand-in kubelet patches their
status Ready with the address of one stand-in runtime that answers ``/v1/stats`` for
all of them (no activity since it started). Each figure beside a same-run baseline:

- CPU at rest: the operator's CPU share over a window (≥ 60 s; 5 s with --quick) with N
  sessions reconciled and nothing happening. Baseline: the same operator with none.
- RSS with N sessions. Baseline: the same operator with none.
- Burst: ``burst`` new sessions created at once (concurrently), to the last one
  reconciled — children created and ``status.phase`` written (seen on a watch).
  Baseline: the apiserver's own floor for the same writes — a plain client creating a
  Secret, a PVC and a Pod and patching an object per session, at the operator's pace
  (same concurrency) — with the apiserver's and etcd's CPU seconds during each.
- Idle stop: ``idle`` Running sessions with ``idleTimeoutSeconds`` T, all idle since
  the same moment: lag from their deadline to ``phase: Stopped`` on a watch. Baseline:
  the writes a stop takes (a status patch and a pod deletion) done by a plain client
  for the same number at once, lag from their start.

- The API at the same scale: ``sandbox-workspace api`` (backend ``kubernetes``) on the
  same namespace, one user's session really Running (a test node agent runs its pod
  alone). Its RSS and the p50 of a small upload to that running session with N sessions
  in the namespace, beside the same with 10 sessions (same API process, measured before
  the namespace is populated); its CPU at rest in the operator's rest window.

Writes ``bench/results/operator.json`` (``operator-quick.json`` with --quick).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from .harness import Figure, cpu_seconds, percentile

RESULTS = Path(__file__).resolve().parent / "results"
API = "/apis/sandboxworkspace.io/v1alpha1"
MERGE = {"Content-Type": "application/merge-patch+json"}
CONCURRENCY = 50  # the bench's own client: enough to keep the apiserver busy
BURST_GOAL = 50.0  # new sessions/s (issue 23)
IDLE_TIMEOUT = 20  # seconds; the idle sessions' idleTimeoutSeconds (5 with --quick)
API_USER = "apiuser"  # the API's user: its session is the one Running (a real runtime)


def _stamp(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z")


class Client:
    """A small async client of the test apiserver (admin token), many requests at once."""

    def __init__(self, server: str, token: str, ca_file: str, concurrency: int = CONCURRENCY):
        self.http = httpx.AsyncClient(
            base_url=server,
            verify=ssl.create_default_context(cafile=ca_file),
            headers={"Authorization": f"Bearer {token}"},
            timeout=120,
            trust_env=False,
            limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
        )
        self.slots = asyncio.Semaphore(concurrency)

    async def call(self, method: str, path: str, body: Any = None, **kw: Any) -> httpx.Response:
        async with self.slots:
            r = await self.http.request(method, path, json=body, **kw)
        if r.status_code >= 400 and r.status_code not in (404, 409):
            raise RuntimeError(f"{method} {path}: {r.status_code} {r.text[:300]}")
        return r

    async def each(self, items: list, fn: Callable[[Any], Awaitable[Any]]) -> list[float]:
        """Run ``fn`` on every item at once (the semaphore paces them); each one's end time."""

        async def one(item: Any) -> float:
            await fn(item)
            return time.time()

        return list(await asyncio.gather(*(one(i) for i in items)))

    async def aclose(self) -> None:
        await self.http.aclose()


class Watcher:
    """Times at which each session of a namespace first showed a phase (a watch)."""

    def __init__(self, client: Client, ns: str):
        self.client, self.ns = client, ns
        self.first: dict[str, dict[str, float]] = {}
        self.task: asyncio.Task | None = None

    async def start(self) -> None:
        r = await self.client.call("GET", f"{API}/namespaces/{self.ns}/sandboxsessions?limit=1")
        rv = r.json()["metadata"]["resourceVersion"]
        self.task = asyncio.create_task(self._run(rv))

    async def _run(self, rv: str) -> None:
        path = f"{API}/namespaces/{self.ns}/sandboxsessions"
        while True:
            params = {"watch": "true", "resourceVersion": rv, "allowWatchBookmarks": "true"}
            async with self.client.http.stream("GET", path, params=params, timeout=None) as r:
                async for line in r.aiter_lines():
                    if not line:
                        continue
                    event = json.loads(line)
                    obj = event.get("object") or {}
                    rv = obj.get("metadata", {}).get("resourceVersion", rv)
                    phase = (obj.get("status") or {}).get("phase")
                    if phase and event.get("type") in ("ADDED", "MODIFIED"):
                        seen = self.first.setdefault(obj["metadata"]["name"], {})
                        seen.setdefault(phase, time.time())

    def count(self, phase: str | None = None) -> int:
        return sum(1 for s in self.first.values() if phase is None or phase in s)

    async def until(self, names: list[str], phase: str | None, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not all(n in self.first and (phase is None or phase in self.first[n]) for n in names):
            if time.monotonic() > deadline:
                done = sum(1 for n in names if n in self.first)
                raise TimeoutError(f"{done}/{len(names)} sessions got there in {timeout}s")
            await asyncio.sleep(0.2)

    async def aclose(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)


def _session(name: str, **spec: Any) -> dict:
    return {
        "apiVersion": "sandboxworkspace.io/v1alpha1",
        "kind": "SandboxSession",
        "metadata": {"name": name},
        "spec": {"userId": name.removeprefix("sb-session-"), **spec},
    }


async def _create_sessions(client: Client, ns: str, names: list[str], **spec: Any) -> None:
    path = f"{API}/namespaces/{ns}/sandboxsessions"
    await client.each(names, lambda n: client.call("POST", path, _session(n, **spec)))


async def _floor_writes(client: Client, ns: str, count: int) -> tuple[float, float]:
    """Per second: a Secret, a PVC and a Pod created and one object patched per session,
    by a plain client (the apiserver's floor for a reconcile's writes)."""

    async def one(i: int) -> None:
        name = f"floor-{i}"
        meta = {"name": name, "labels": {"bench": "floor"}}
        await client.call(
            "POST",
            f"/api/v1/namespaces/{ns}/secrets",
            {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "data": {"t": "eA=="}},
        )
        claim_spec = {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
        }
        await client.call(
            "POST",
            f"/api/v1/namespaces/{ns}/persistentvolumeclaims",
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": meta,
                "spec": claim_spec,
            },
        )
        pod_spec = {"containers": [{"name": "c", "image": "sandbox-workspace:bench"}]}
        await client.call(
            "POST",
            f"/api/v1/namespaces/{ns}/pods",
            {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec},
        )
        await client.call(
            "PATCH",
            f"/api/v1/namespaces/{ns}/secrets/{name}",
            {"metadata": {"annotations": {"bench/status": "written"}}},
            headers=MERGE,
        )

    start = time.time()
    await client.each(list(range(count)), one)
    return count / (time.time() - start), start


class StandInRuntime:
    """One address answering every sandbox pod's ``/v1/stats`` and ``/healthz``: idle since
    ``since`` (epoch seconds), nothing in flight. Bound on a free 127.x address, port 8080
    (the runtime's port)."""

    def __init__(self) -> None:
        self.since = time.time()
        self.calls = 0
        self.ip = ""
        self.server: asyncio.base_events.Server | None = None

    async def start(self) -> str:
        for _ in range(50):
            ip = f"127.{random.randint(100, 250)}.{random.randint(0, 250)}.{random.randint(1, 250)}"
            with socket.socket() as s:
                try:
                    s.bind((ip, 8080))
                except OSError:
                    continue
            self.server = await asyncio.start_server(self._serve, ip, 8080)
            self.ip = ip
            return ip
        raise RuntimeError("no free 127.x address with port 8080")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                if length:
                    await reader.readexactly(length)
                self.calls += 1
                at = _stamp(self.since)
                body = json.dumps(
                    {
                        "workspace_path": "/workspace",
                        "started_at": at,
                        "last_activity_at": at,
                        "active_operations": 0,
                        "conversations": 0,
                    }
                ).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
        except (
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            asyncio.CancelledError,  # the server closes at the end
            ConnectionError,
        ):
            pass
        finally:
            writer.close()

    async def aclose(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


def _ready_status(ip: str, at: str) -> dict:
    return {
        "status": {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "startTime": at,
            "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": at},
                {"type": "ContainersReady", "status": "True", "lastTransitionTime": at},
            ],
            "containerStatuses": [
                {
                    "name": "runtime",
                    "ready": True,
                    "restartCount": 0,
                    "image": "sandbox-workspace:bench",
                    "imageID": "",
                    "state": {"running": {"startedAt": at}},
                }
            ],
        }
    }


class Sampler:
    """CPU seconds of a set of processes (by name) between two points."""

    def __init__(self, pids: dict[str, int]):
        self.pids = pids
        self.at = time.monotonic()
        self.cpu = {n: cpu_seconds(p) for n, p in pids.items()}

    def percent(self) -> dict[str, float]:
        took = time.monotonic() - self.at
        return {
            n: round(100 * (cpu_seconds(p) - self.cpu[n]) / took, 2) for n, p in self.pids.items()
        }

    def seconds(self) -> dict[str, float]:
        return {n: round(cpu_seconds(p) - self.cpu[n], 2) for n, p in self.pids.items()}


async def _requests(client: Client) -> dict[str, float]:
    """The apiserver's own count of requests served so far, by ``VERB resource`` (its
    ``apiserver_request_total``; WATCH and the apiserver's own lease traffic included)."""
    r = await client.call("GET", "/metrics")
    counts: dict[str, float] = {}
    for line in r.text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels, _, value = line.partition("} ")
        pairs = labels.removeprefix("apiserver_request_total{").split(",")
        fields = dict(part.split("=", 1) for part in pairs)
        verb = fields.get("verb", "").strip('"')
        resource = fields.get("resource", "").strip('"')
        sub = fields.get("subresource", "").strip('"')
        key = f"{verb} {resource}{'/' + sub if sub else ''}"
        counts[key] = counts.get(key, 0.0) + float(value)
    return counts


def _per(before: dict[str, float], after: dict[str, float], count: int) -> dict[str, float]:
    """Requests per item (session) between two ``_requests`` counts, busiest first."""
    diff = {k: (after.get(k, 0.0) - before.get(k, 0.0)) / count for k in after}
    kept = {k: round(v, 2) for k, v in diff.items() if v >= 0.01}
    return dict(sorted(kept.items(), key=lambda kv: -kv[1]))


class Profile:
    """``py-spy record`` of a process over one phase, when ``SANDBOX_BENCH_PROFILE`` names
    a directory (raw collapsed stacks, one file per phase); nothing otherwise."""

    def __init__(self, pid: int, phase: str):
        self.proc: subprocess.Popen | None = None
        where = os.environ.get("SANDBOX_BENCH_PROFILE")
        if where:
            Path(where).mkdir(parents=True, exist_ok=True)
            out = str(Path(where) / f"{phase}.txt")
            spy = Path(sys.executable).parent / "py-spy"  # the venv's, else on PATH
            cmd = [
                str(spy) if spy.exists() else "py-spy",
                "record",
                "-p",
                str(pid),
                "-o",
                out,
                "--format",
                "raw",
                "-r",
                "50",
            ]
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
            self.proc.wait(timeout=30)


def _sockets(pid: int) -> int:
    """Open sockets of a process (its connections, mostly to the apiserver)."""
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            count += os.readlink(fd).startswith("socket:")
    return count


async def _peak_sockets(pid: int, into: list[int]) -> None:
    """Keep the most sockets ``pid`` held at once in ``into[0]`` (sampled every 0.2 s)."""
    while True:
        into[0] = max(into[0], _sockets(pid))
        await asyncio.sleep(0.2)


async def _rest(pids: dict[str, int], seconds: float) -> dict[str, float]:
    sampler = Sampler(pids)
    await asyncio.sleep(seconds)
    return sampler.percent()


@dataclass
class ApiUnderTest:
    """What ``start_api(namespace, session)`` gives: the API's URL and pid, its user's
    session Running (stopped by the caller)."""

    url: str
    pid: int


async def _uploads(url: str, user: str, count: int) -> list[float]:
    """Milliseconds of ``count`` 1 KiB uploads into one conversation of a running session
    (after three unmeasured ones: the session's start, the conversation's creation)."""
    path = f"{url}/api/v1/sessions/sb-session-{user}/files/upload"
    samples = []
    async with httpx.AsyncClient(headers={"X-User-Id": user}, timeout=300) as api:
        for i in range(count + 3):
            files = {"file": (f"f{i % 5}.txt", b"x" * 1024)}
            started = time.perf_counter()
            r = await api.post(path, files=files, data={"conversation_id": "c"})
            took = (time.perf_counter() - started) * 1000
            if r.status_code != 201:
                raise RuntimeError(f"upload through the API: {r.status_code} {r.text[:300]}")
            if i >= 3:
                samples.append(took)
    return samples


async def scale(
    plane: Any,
    start_operator: Callable[[str], Any],
    rss_of: Callable[[Any], int],
    sessions: int,
    quick: bool,
    start_api: Callable[[str, str], ApiUnderTest] | None = None,
    rss_bytes: Callable[[int], int] | None = None,
) -> tuple[list[Figure], dict]:
    """The scale figures; ``start_operator(namespace)`` runs one, ``start_api(namespace,
    session)`` the API (both stopped by the caller; without ``start_api``, no API figures)."""
    burst = min(1000, max(20, sessions // 10)) if not quick else 20
    idle = min(1000, sessions) if not quick else 10
    window = 3.0 if quick else 60.0
    timeout = 5 if quick else IDLE_TIMEOUT
    client = Client(plane.server, plane.token, plane.ca_file)
    ns, floor_ns = "scale", "scale-floor"
    try:
        for name in (ns, floor_ns):
            body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
            await client.call("POST", "/api/v1/namespaces", body)
        op = start_operator(ns)
        pids = {"operator": op.proc.pid, **{n: p.pid for n, p in plane.procs.items()}}
        await asyncio.sleep(1.0 if quick else 10.0)  # start-up settles
        idle_cpu = await _rest(pids, window)
        idle_rss = rss_of(op)

        watcher = Watcher(client, ns)
        await watcher.start()
        base = [f"sb-session-u{i}" for i in range(sessions)]
        api_figures: dict[str, Any] = {}
        if start_api is not None and rss_bytes is not None and sessions >= 10:
            # The API with 10 sessions in its namespace: its user's (running) and 9 more.
            api = await asyncio.to_thread(start_api, ns, f"sb-session-{API_USER}")
            pids["api"] = api.pid
            await _create_sessions(client, ns, base[:9])
            api_figures["small"] = await _uploads(api.url, API_USER, 10 if quick else 100)
            api_figures["small_rss"] = rss_bytes(api.pid)
            base = base[9:]  # N in all with the API's user
        # Populate: N sessions, created at the pace the apiserver takes them.
        populate_started = time.time()
        for first in range(0, len(base), 200):  # users arriving, not one flood
            chunk = base[first : first + 200]
            await _create_sessions(client, ns, chunk)
            await watcher.until(chunk, None, timeout=300)
        populate_s = time.time() - populate_started
        await asyncio.sleep(1.0 if quick else 15.0)  # let the last events drain
        rest_cpu = await _rest(pids, window)
        rest_rss = rss_of(op)
        if api_figures:  # the API with N sessions: the same uploads, its memory
            api_figures["large"] = await _uploads(api.url, API_USER, 10 if quick else 100)
            api_figures["large_rss"] = rss_bytes(api.pid)

        # Burst: `burst` more at once.
        extra = [f"sb-session-b{i}" for i in range(burst)]
        sampler = Sampler(pids)
        counted = await _requests(client)
        profile = Profile(op.proc.pid, "burst")
        peak = [0]
        peaks = asyncio.create_task(_peak_sockets(op.proc.pid, peak))
        started = time.time()
        await _create_sessions(client, ns, extra)
        created = time.time()
        await watcher.until(extra, None, timeout=60 + burst)
        done = max(watcher.first[n]["Pending"] for n in extra if "Pending" in watcher.first[n])
        burst_rate = burst / (done - started)
        burst_cpu = sampler.seconds()
        profile.stop()
        peaks.cancel()
        await asyncio.sleep(1.0)  # the last Events and kopf's own patches land
        after_burst = await _requests(client)
        burst_requests = _per(counted, after_burst, burst)
        sampler = Sampler(pids)
        floor_rate, _ = await _floor_writes(client, floor_ns, burst)
        floor_cpu = sampler.seconds()
        floor_requests = _per(after_burst, await _requests(client), burst)

        # Idle stop: `idle` sessions made Running (stand-in kubelet + runtime).
        runtime = StandInRuntime()
        ip = await runtime.start()
        try:
            names = [f"sb-session-i{i}" for i in range(idle)]
            await _create_sessions(client, ns, names, idleTimeoutSeconds=timeout)
            await watcher.until(names, None, timeout=60 + idle)
            counted = await _requests(client)
            idle_sampler = Sampler(pids)
            profile = Profile(op.proc.pid, "idle")
            runtime.since = time.time()
            at = _stamp(runtime.since)
            await client.each(
                names,
                lambda n: client.call(
                    "PATCH",
                    f"/api/v1/namespaces/{ns}/pods/{n}/status",
                    _ready_status(ip, at),
                    headers=MERGE,
                ),
            )
            due = runtime.since + timeout
            await watcher.until(names, "Stopped", timeout=timeout + 120 + idle * 0.2)
            idle_cpu_s = idle_sampler.seconds()
            profile.stop()
            await asyncio.sleep(1.0)  # the last pod deletions' events are handled
            # From Running to Stopped: the bench's own pod status patch (1 each) included.
            idle_requests = _per(counted, await _requests(client), idle)
            lags = [watcher.first[n]["Stopped"] - due for n in names]
            # When each showed Running (its status after the pod's Ready), from the moment
            # the bench began marking the pods Ready: the work before the deadlines.
            to_running = [
                watcher.first[n]["Running"] - runtime.since
                for n in names
                if "Running" in watcher.first[n]
            ]
            running = sum(1 for n in names if "Running" in watcher.first[n])
        finally:
            await runtime.aclose()
        # Baseline: the writes of `idle` stops at once, by a plain client.
        floor_pods = [f"floor-{i}" for i in range(idle)]
        begun = time.time()
        ends = await client.each(
            floor_pods,
            lambda n: _stop_writes(client, floor_ns, n),
        )
        floor_lags = [e - begun for e in ends]
        await watcher.aclose()
    finally:
        await client.aclose()

    def fig(name: str, unit: str, value: float, base_name: str, base: float, **extra: Any):
        return Figure.of(name, unit, [value], base_name, [base], **extra)

    # CPU time counts in clock ticks: a share below one tick per window shows as one tick
    # (the JSON keeps the raw value).
    tick = round(100 / os.sysconf("SC_CLK_TCK") / window, 3)
    figures = [
        fig(
            f"operator CPU at rest, {sessions} sessions ({window:.0f} s)",
            "% of a core",
            max(rest_cpu["operator"], tick),
            "same operator, 0 sessions",
            max(idle_cpu["operator"], tick),
            goal="≤ 5%",
            resolution_percent=tick,
            apiserver_percent=rest_cpu.get("kube-apiserver"),
            etcd_percent=rest_cpu.get("etcd"),
        ),
        fig(
            f"operator RSS, {sessions} sessions",
            "MB",
            rest_rss / 2**20,
            "same operator, 0 sessions",
            idle_rss / 2**20,
            goal="≤ 1 GiB",
        ),
        fig(
            f"burst of {burst} new sessions reconciled (rate)",
            "sessions/s",
            burst_rate,
            "apiserver floor: the same writes by a plain client",
            floor_rate,
            goal=f"≥ {BURST_GOAL:.0f}/s",
            create_seconds=round(created - started, 2),
            cpu_seconds_during_burst=burst_cpu,
            cpu_seconds_during_floor=floor_cpu,
        ),
        Figure.of(
            f"idle stop lag past the deadline, {idle} sessions at once",
            "s",
            lags,
            "a stop's writes for as many at once, plain client",
            floor_lags,
            goal="p99 ≤ 10 s",
            idle_timeout_seconds=timeout,
            stats_calls=runtime.calls,
            reported_running=running,
        ),
    ]
    if api_figures:
        figures += _api_figures(api_figures, sessions, rest_cpu.get("api", 0.0), tick)
    result = {
        "quick": quick,
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "sessions": sessions,
        "cpu_rest_percent": rest_cpu["operator"],
        "cpu_rest_window_s": window,
        "cpu_rest_baseline_percent": idle_cpu["operator"],
        "rss_bytes": rest_rss,
        "rss_baseline_bytes": idle_rss,
        "burst_sessions": burst,
        "burst_per_second": round(burst_rate, 1),
        "burst_floor_per_second": round(floor_rate, 1),
        "burst_cpu_seconds": burst_cpu,
        "burst_floor_cpu_seconds": floor_cpu,
        # Whose limit: the floor (no operator) below the goal is this machine's apiserver
        # and etcd; their cores busy over each (CPU seconds ÷ wall seconds) say so.
        "burst_goal_per_second": BURST_GOAL,
        "burst_floor_below_goal": floor_rate < BURST_GOAL,
        "burst_seconds": round(done - started, 2),
        "burst_floor_seconds": round(burst / floor_rate, 2),
        "burst_control_plane_cores": _cores(burst_cpu, done - started),
        "burst_floor_control_plane_cores": _cores(floor_cpu, burst / floor_rate),
        "populate_seconds": round(populate_s, 1),
        "idle_sessions": idle,
        "idle_timeout_s": timeout,
        "idle_stop_lag_p50_s": round(percentile(lags, 50), 2),
        "idle_stop_lag_p99_s": round(percentile(lags, 99), 2),
        "idle_stop_floor_p99_s": round(percentile(floor_lags, 99), 2),
        "idle_stop_floor_p50_s": round(percentile(floor_lags, 50), 2),
        # The apiserver's own counts (apiserver_request_total), per session: the burst's
        # (the bench's create included) beside its floor's, and those of an idle session
        # from Running to Stopped (the bench's pod status patch included).
        "burst_requests_per_session": burst_requests,
        "burst_floor_requests_per_session": floor_requests,
        "burst_operator_peak_sockets": peak[0],
        "idle_requests_per_session": idle_requests,
        "idle_running_p50_s": round(percentile(to_running, 50), 2) if to_running else None,
        "idle_running_p99_s": round(percentile(to_running, 99), 2) if to_running else None,
        "idle_cpu_seconds": idle_cpu_s,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "rest_cpu_percent_by_process": rest_cpu,
        "idle_cpu_percent_by_process": idle_cpu,
        "machine_cpus": os.cpu_count(),
    }
    if api_figures:
        result |= {
            "api_rss_bytes": api_figures["large_rss"],
            "api_rss_10_sessions_bytes": api_figures["small_rss"],
            "api_upload_p50_ms": round(percentile(api_figures["large"], 50), 2),
            "api_upload_10_sessions_p50_ms": round(percentile(api_figures["small"], 50), 2),
            "api_upload_p99_ms": round(percentile(api_figures["large"], 99), 2),
            "api_upload_10_sessions_p99_ms": round(percentile(api_figures["small"], 99), 2),
            "api_cpu_rest_percent": rest_cpu.get("api"),
        }
    RESULTS.mkdir(exist_ok=True)
    name = "operator-quick.json" if quick else "operator.json"
    (RESULTS / name).write_text(json.dumps(result, indent=2) + "\n")
    return figures, result


def _cores(cpu: dict[str, float], seconds: float) -> dict[str, float]:
    """Cores busy on average over ``seconds`` per control-plane process (etcd,
    kube-apiserver) and their sum, from their CPU seconds."""
    parts = {n: round(cpu.get(n, 0.0) / seconds, 2) for n in ("kube-apiserver", "etcd")}
    return {**parts, "sum": round(sum(parts.values()), 2)}


def _api_figures(seen: dict[str, Any], sessions: int, cpu: float, tick: float) -> list[Figure]:
    rss = Figure.of(
        f"API RSS, {sessions} sessions in its namespace",
        "MB",
        [seen["large_rss"] / 2**20],
        "same API, 10 sessions",
        [seen["small_rss"] / 2**20],
        cpu_rest_percent=max(cpu, tick),
    )
    upload = Figure.of(
        f"upload 1 KiB to a running session through the API, {sessions} sessions",
        "ms",
        seen["large"],
        "same API, same session, 10 sessions",
        seen["small"],
    )
    return [rss, upload]


async def _stop_writes(client: Client, ns: str, name: str) -> None:
    await client.call(
        "PATCH",
        f"/api/v1/namespaces/{ns}/secrets/{name}",
        {"metadata": {"annotations": {"bench/status": "Stopped"}}},
        headers=MERGE,
    )
    await client.call("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}")
