"""A test node agent: a tiny stand-in for a kubelet (test helper, not product code).

It registers a Node, binds pending pods that match its label selector to that node,
runs each pod's runtime as a local process on its own loopback address (127.X.Y.N from
a random /24 per agent; all of 127.0.0.0/8 routes to ``lo`` on Linux), and reports the
pod's status the way a kubelet would: phase, podIP, conditions and containerStatuses
through the status subresource. It honours graceful deletion, emulates restartPolicy,
provisions hostPath PersistentVolumes for pending claims (reclaim policy Delete: deleted
with their data once released, unless a test patched them to Retain), and keeps one data
directory per pod, or per PersistentVolumeClaim when the claim is mounted at /workspace,
so files survive pod restarts.

Threads: one watches pods and feeds a queue; one worker owns all state and does every
action, so no locking beyond the queue is needed. Tests talk to it through
:meth:`NodeAgent.kill`, :meth:`NodeAgent.restart` and the read-only helpers.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import ipaddress
import logging
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from .client import ApiError, KubeClient
from .controlplane import base_env, spawn, stop_process

log = logging.getLogger("kubeenv.nodeagent")

RUNTIME_LABEL = "sandboxworkspace.io/component=runtime"
WORKSPACE_MOUNT = "/workspace"
AGENT_LABEL = "sandboxworkspace.io/test-node-agent"


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def default_runtime_command(ctx: PodRun) -> list[str]:
    """The real runtime, from the interpreter's own environment (the project venv)."""
    exe = Path(sys.executable).parent / "sandbox-workspace"
    head = [str(exe)] if exe.exists() else [sys.executable, "-m", "sandbox_workspace"]
    return [*head, "runtime", "--host", ctx.ip, "--port", str(ctx.port), "--root", str(ctx.root)]


class PodConfigError(Exception):
    """The pod cannot start yet (missing Secret, key, claim...). Retried."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass
class PodRun:
    """What the agent knows about one pod it runs."""

    uid: str
    namespace: str
    name: str
    pod: dict[str, Any]
    ip: str = ""
    port: int = 8080
    root: Path = Path()
    ephemeral_root: bool = True  # delete `root` with the pod (no PVC)
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    started_at: str | None = None
    start_time: str | None = None  # pod's status.startTime
    ready: bool = False
    restart_count: int = 0
    last_state: dict[str, Any] = field(default_factory=dict)
    terminal: bool = False
    deleting: bool = False
    next_start: float = 0.0  # monotonic time of the next (re)start when waiting
    waiting: tuple[str, str] | None = None  # (reason, message) while not started
    transitions: dict[str, tuple[str, str]] = field(default_factory=dict)
    log_path: Path | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def container(self) -> dict[str, Any]:
        return self.pod["spec"]["containers"][0]

    @property
    def restart_policy(self) -> str:
        return self.pod["spec"].get("restartPolicy", "Always")


def random_subnet() -> str:
    """A random 127.X.Y.0/24 (X >= 1, so never 127.0.0.x): concurrent test sessions on
    one machine (each with its own agent) then do not hand out the same addresses."""
    import random

    return f"127.{random.randint(1, 254)}.{random.randint(0, 255)}.0/24"


def port_free(ip: str, port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind((ip, port))
        except OSError:
            return False
    return True


class IpPool:
    """Hands out the host addresses of a loopback subnet (127.X.Y.1, .2, ...), reusing
    freed ones, skipping any address whose port is already taken by someone else."""

    def __init__(self, subnet: str | None = None):
        self.subnet = ipaddress.ip_network(subnet or random_subnet())
        if not self.subnet.is_loopback:
            raise ValueError(f"{self.subnet} is not a loopback subnet")
        self._hosts = self.subnet.hosts()
        self._free: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = []

    def allocate(self, port: int | None = None) -> str:
        skipped = []
        try:
            while True:
                if self._free:
                    candidate = self._free.pop(0)
                else:
                    candidate = next(self._hosts, None)
                    if candidate is None:
                        raise RuntimeError(f"loopback address pool {self.subnet} exhausted")
                if port is None or port_free(str(candidate), port):
                    return str(candidate)
                skipped.append(candidate)
        finally:
            self._free = sorted(self._free + skipped)

    def release(self, ip: str) -> None:
        if ip:
            self._free.append(ipaddress.ip_address(ip))
            self._free.sort()


class NodeAgent:
    def __init__(
        self,
        client_factory: Callable[[], KubeClient],
        data_dir: Path,
        node_name: str = "sandbox-test-node",
        label_selector: str = RUNTIME_LABEL,
        runtime_command: Callable[[PodRun], list[str]] = default_runtime_command,
        max_grace_seconds: float = 10.0,
        pod_subnet: str | None = None,
        provision_volumes: bool = True,
    ):
        self.client_factory = client_factory
        self.data_dir = Path(data_dir)
        self.node_name = node_name
        self.label_selector = label_selector
        self.runtime_command = runtime_command
        self.max_grace_seconds = max_grace_seconds
        self.ips = IpPool(pod_subnet)
        # Off: no PersistentVolume for anyone's claims (an agent that runs one selected pod
        # beside thousands of Pending sessions must not provision them all).
        self.provision_volumes = provision_volumes
        self.pods: dict[str, PodRun] = {}  # by uid; owned by the worker thread
        self.errors: list[str] = []  # unexpected exceptions, for tests to assert on
        self._queue: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._api: KubeClient | None = None
        self._watch_api: KubeClient | None = None
        self._last_provision = 0.0
        self._last_heartbeat = 0.0

    # ------------------------------------------------------------------ public API
    def start(self) -> NodeAgent:
        verify_loopback_alias(str(next(self.ips.subnet.hosts())))
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._api = self.client_factory()
        self._register_node()
        for target, name in ((self._watch_loop, "watch"), (self._work_loop, "worker")):
            thread = threading.Thread(target=target, name=f"node-agent-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        """Stop every runtime process and the agent's threads."""
        if not self._threads:
            return
        self._stop.set()
        self._queue.put(("wake",))
        if self._watch_api is not None:
            # Interrupts the blocking watch read instead of waiting for its timeout.
            with contextlib.suppress(Exception):
                self._watch_api.close()
        for thread in self._threads:
            thread.join(timeout=20)
        self._threads.clear()
        # The worker stops processes on its way out; this is the safety net.
        for run in self.pods.values():
            if run.proc is not None:
                stop_process(run.proc, grace=2)
        if self._api is not None:
            self._api.close()

    def __enter__(self) -> NodeAgent:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def kill(self, namespace: str, name: str, sig: int = signal.SIGKILL) -> int:
        """Send ``sig`` to the pod's process group (a crash); returns the pid killed."""
        return self._call(self._do_kill, namespace, name, sig)

    def restart(self, namespace: str, name: str) -> int:
        """Restart the pod's process (as a kubelet restarts a container); returns new pid."""
        return self._call(self._do_restart, namespace, name)

    def pod_run(self, namespace: str, name: str) -> PodRun | None:
        return self._call(self._find, namespace, name, True)

    def pid(self, namespace: str, name: str) -> int | None:
        def get() -> int | None:
            run = self._find(namespace, name, True)
            return run.proc.pid if run and run.proc and run.proc.poll() is None else None

        return self._call(get)

    def data_dir_of(self, namespace: str, name: str) -> Path | None:
        run = self.pod_run(namespace, name)
        return run.root if run else None

    def logs(self, namespace: str, name: str) -> str:
        run = self.pod_run(namespace, name)
        if run is None or run.log_path is None or not run.log_path.exists():
            return ""
        return run.log_path.read_text(errors="replace")

    # ------------------------------------------------------------- thread plumbing
    def _call(self, fn: Callable[..., Any], *args: Any, timeout: float = 30) -> Any:
        if threading.current_thread() in self._threads:
            return fn(*args)
        fut: Future[Any] = Future()
        self._queue.put(("call", fn, args, fut))
        return fut.result(timeout=timeout)

    def _watch_loop(self) -> None:
        api = self._watch_api = self.client_factory()
        rv: str | None = None
        path = "/api/v1/pods"
        try:
            while not self._stop.is_set():
                try:
                    if rv is None:
                        listing = api.get(path, labelSelector=self.label_selector)
                        rv = listing["metadata"]["resourceVersion"]
                        self._queue.put(("resync", listing["items"]))
                    for event in api.watch(
                        path, rv, timeout_seconds=5, labelSelector=self.label_selector
                    ):
                        kind, obj = event.get("type"), event.get("object", {})
                        if kind == "ERROR":  # 410 Gone: relist
                            rv = None
                            break
                        rv = obj.get("metadata", {}).get("resourceVersion", rv)
                        if kind != "BOOKMARK":
                            self._queue.put(("event", kind, obj))
                        if self._stop.is_set():
                            break
                except Exception as exc:
                    if self._stop.is_set():
                        break
                    log.warning("pod watch failed: %r; relisting", exc)
                    rv = None
                    self._stop.wait(0.5)
        finally:
            api.close()

    def _work_loop(self) -> None:
        last_tick = 0.0
        try:
            while not self._stop.is_set():
                try:
                    item = self._queue.get(timeout=0.1)
                except queue.Empty:
                    item = None
                if item is not None:
                    self._handle(item)
                if time.monotonic() - last_tick >= 0.1:
                    last_tick = time.monotonic()
                    self._safe(self._tick)
        finally:
            for run in list(self.pods.values()):
                if run.proc is not None:
                    stop_process(run.proc, grace=2)
            # Fail anything still waiting on us.
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item[0] == "call":
                    item[3].set_exception(RuntimeError("node agent stopped"))

    def _handle(self, item: tuple[Any, ...]) -> None:
        kind = item[0]
        if kind == "call":
            _, fn, args, fut = item
            try:
                fut.set_result(fn(*args))
            except BaseException as exc:
                fut.set_exception(exc)
        elif kind == "event":
            _, event_type, pod = item
            if event_type == "DELETED":
                self._safe(self._pod_gone, pod["metadata"]["uid"])
            else:
                self._safe(self._reconcile, pod)
        elif kind == "resync":
            pods = item[1]
            seen = {p["metadata"]["uid"] for p in pods}
            for uid in [u for u in self.pods if u not in seen]:
                self._safe(self._pod_gone, uid)
            for pod in pods:
                self._safe(self._reconcile, pod)

    def _safe(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:
            log.exception("node agent: %s failed", getattr(fn, "__name__", fn))
            self.errors.append(f"{getattr(fn, '__name__', fn)}: {exc!r}")

    @property
    def api(self) -> KubeClient:
        assert self._api is not None
        return self._api

    # ------------------------------------------------------------------- the node
    def _register_node(self) -> None:
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.node_name,
                "labels": {
                    "kubernetes.io/hostname": self.node_name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    AGENT_LABEL: "true",
                },
            },
            "spec": {},
        }
        try:
            self.api.create("/api/v1/nodes", node)
        except ApiError as exc:
            if exc.status != 409:
                raise
        self._heartbeat()

    def _heartbeat(self) -> None:
        now = now_rfc3339()
        cpu, mem = str(os.cpu_count() or 1), "16Gi"
        self.api.patch(
            f"/api/v1/nodes/{self.node_name}/status",
            {
                "status": {
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True",
                            "reason": "KubeletReady",
                            "message": "test node agent is posting ready status",
                            "lastHeartbeatTime": now,
                            "lastTransitionTime": now,
                        }
                    ],
                    "addresses": [
                        {"type": "InternalIP", "address": "127.0.0.1"},
                        {"type": "Hostname", "address": self.node_name},
                    ],
                    "capacity": {"cpu": cpu, "memory": mem, "pods": "250"},
                    "allocatable": {"cpu": cpu, "memory": mem, "pods": "250"},
                    "nodeInfo": {
                        "operatingSystem": "linux",
                        "architecture": "amd64",
                        "kubeletVersion": "sandbox-test-node-agent",
                        "containerRuntimeVersion": "process://local",
                    },
                }
            },
        )
        self._last_heartbeat = time.monotonic()

    # --------------------------------------------------------------- reconciling
    def _find(self, namespace: str, name: str, latest: bool = True) -> PodRun | None:
        matches = [r for r in self.pods.values() if r.namespace == namespace and r.name == name]
        return matches[-1] if matches else None

    def _reconcile(self, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        uid = meta["uid"]
        node = spec.get("nodeName")
        if not node:
            # Like the default scheduler, bind only the pods that name it (or no one):
            # a pod for another scheduler waits for that one.
            mine = spec.get("schedulerName") in (None, "default-scheduler")
            if mine and not meta.get("deletionTimestamp"):
                self._bind(pod)
            return
        if node != self.node_name:
            return
        run = self.pods.get(uid)
        if run is not None:
            run.pod = pod
        if meta.get("deletionTimestamp"):
            self._terminate(run, pod)
            return
        if run is None:
            run = PodRun(uid=uid, namespace=meta["namespace"], name=meta["name"], pod=pod)
            self.pods[uid] = run
            phase = pod.get("status", {}).get("phase")
            if phase in ("Succeeded", "Failed"):
                run.terminal = True
                return
            run.start_time = pod.get("status", {}).get("startTime") or now_rfc3339()
            self._try_start(run)

    def _bind(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": self.node_name},
        }
        try:
            self.api.create(
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/binding", binding
            )
        except ApiError as exc:
            if exc.status not in (404, 409):  # gone, or already bound
                raise

    def _terminate(self, run: PodRun | None, pod: dict[str, Any]) -> None:
        """Graceful deletion: stop the process, then finalize with grace period 0."""
        meta = pod["metadata"]
        if run is not None and run.deleting:
            return
        if run is not None:
            run.deleting = True
            if run.proc is not None and run.proc.poll() is None:
                grace = float(meta.get("deletionGracePeriodSeconds") or 0)
                stop_process(run.proc, grace=min(max(grace, 0.5), self.max_grace_seconds))
        self.api.delete(
            f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
            body={
                "apiVersion": "v1",
                "kind": "DeleteOptions",
                "gracePeriodSeconds": 0,
                "preconditions": {"uid": meta["uid"]},
            },
        )

    def _pod_gone(self, uid: str) -> None:
        run = self.pods.pop(uid, None)
        if run is None:
            return
        if run.proc is not None:
            stop_process(run.proc, grace=1)
        self.ips.release(run.ip)
        if run.ephemeral_root and run.root != Path() and run.root.exists():
            shutil.rmtree(run.root, ignore_errors=True)

    # -------------------------------------------------------------- starting pods
    def _try_start(self, run: PodRun) -> None:
        run.next_start = 0.0
        try:
            run.root, run.ephemeral_root = self._volume_root(run)
            run.port = self._container_port(run.container)
            if not run.ip:
                run.ip = self.ips.allocate(run.port)
            run.env = self._resolve_env(run)
        except PodConfigError as exc:
            run.waiting = (exc.reason, str(exc))
            run.next_start = time.monotonic() + 1.0  # retried from the tick
            self._report(run)
            return
        self._spawn(run)

    def _spawn(self, run: PodRun) -> None:
        run.root.mkdir(parents=True, exist_ok=True)
        env = base_env()
        env.update(run.env)
        env["PYTHONUNBUFFERED"] = "1"
        # The pod says /workspace; the process lives here. Host/port/root are ours.
        overrides = {"ROOT": str(run.root), "HOST": run.ip, "PORT": str(run.port)}
        for suffix, value in overrides.items():
            if f"SANDBOX_RUNTIME_{suffix}" in env:
                env[f"SANDBOX_RUNTIME_{suffix}"] = value
        logs = self.data_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        run.log_path = logs / f"{run.namespace}_{run.name}_{run.uid[:8]}.log"
        with open(run.log_path, "a") as fh:
            fh.write(f"--- start #{run.restart_count} at {now_rfc3339()} on {run.ip}:{run.port}\n")
        run.proc = spawn(self.runtime_command(run), run.log_path, env=env, cwd=run.root)
        run.started_at = now_rfc3339()
        run.ready = False
        run.waiting = None
        self._report(run)

    def _volume_root(self, run: PodRun) -> tuple[Path, bool]:
        """Directory backing /workspace: per PVC (by the claim's uid) or per pod."""
        spec = run.pod["spec"]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for mount in run.container.get("volumeMounts", []):
            if mount.get("mountPath", "").rstrip("/") != WORKSPACE_MOUNT:
                continue
            volume = volumes.get(mount["name"], {})
            claim = volume.get("persistentVolumeClaim")
            if claim:
                pvc = self.api.get_or_none(
                    f"/api/v1/namespaces/{run.namespace}/persistentvolumeclaims/{claim['claimName']}"
                )
                if pvc is None:
                    raise PodConfigError(
                        "ContainerCreating",
                        f'persistentvolumeclaim "{claim["claimName"]}" not found',
                    )
                if pvc["metadata"].get("deletionTimestamp"):
                    raise PodConfigError(
                        "ContainerCreating",
                        f'persistentvolumeclaim "{claim["claimName"]}" is being deleted',
                    )
                sub = mount.get("subPath", "")
                return self.claim_dir(pvc["metadata"]["uid"]) / sub, False
        return self.data_dir / "pods" / run.uid, True

    def claim_dir(self, claim_uid: str) -> Path:
        return self.data_dir / "pvcs" / claim_uid

    @staticmethod
    def _container_port(container: dict[str, Any]) -> int:
        ports = container.get("ports") or []
        return int(ports[0]["containerPort"]) if ports else 8080

    def _resolve_env(self, run: PodRun) -> dict[str, str]:
        ns = run.namespace
        cache: dict[tuple[str, str], dict[str, Any] | None] = {}

        def fetch(kind: str, name: str) -> dict[str, Any] | None:
            if (kind, name) not in cache:
                plural = "secrets" if kind == "Secret" else "configmaps"
                cache[kind, name] = self.api.get_or_none(f"/api/v1/namespaces/{ns}/{plural}/{name}")
            return cache[kind, name]

        def lookup(kind: str, ref: dict[str, Any], key: str | None) -> dict[str, str] | None:
            obj = fetch(kind, ref["name"])
            if obj is None:
                if ref.get("optional"):
                    return None
                raise PodConfigError(
                    "CreateContainerConfigError", f'{kind.lower()} "{ref["name"]}" not found'
                )
            if kind == "Secret":
                data = {k: base64.b64decode(v).decode() for k, v in obj.get("data", {}).items()}
                data.update(obj.get("stringData", {}))
            else:
                data = dict(obj.get("data", {}))
            if key is not None and key not in data:
                if ref.get("optional"):
                    return None
                raise PodConfigError(
                    "CreateContainerConfigError",
                    f"couldn't find key {key} in {kind} {ns}/{ref['name']}",
                )
            return data

        env: dict[str, str] = {}
        for source in run.container.get("envFrom", []):
            prefix = source.get("prefix", "")
            for kind, ref_key in (("Secret", "secretRef"), ("ConfigMap", "configMapRef")):
                if ref_key in source:
                    data = lookup(kind, source[ref_key], None) or {}
                    env.update({prefix + k: v for k, v in data.items()})
        for item in run.container.get("env", []):
            name = item["name"]
            if "valueFrom" not in item:
                env[name] = _expand(item.get("value", ""), env)
                continue
            source = item["valueFrom"]
            if "secretKeyRef" in source or "configMapKeyRef" in source:
                kind = "Secret" if "secretKeyRef" in source else "ConfigMap"
                ref = source["secretKeyRef" if kind == "Secret" else "configMapKeyRef"]
                data = lookup(kind, ref, ref["key"])
                if data is not None:
                    env[name] = data[ref["key"]]
            elif "fieldRef" in source:
                env[name] = self._field_ref(run, source["fieldRef"]["fieldPath"])
            elif "resourceFieldRef" in source:
                env[name] = "0"
        return env

    def _field_ref(self, run: PodRun, path: str) -> str:
        meta = run.pod["metadata"]
        simple = {
            "metadata.name": meta["name"],
            "metadata.namespace": meta["namespace"],
            "metadata.uid": meta["uid"],
            "spec.nodeName": self.node_name,
            "spec.serviceAccountName": run.pod["spec"].get("serviceAccountName", ""),
            "status.podIP": run.ip,
            "status.podIPs": run.ip,
            "status.hostIP": "127.0.0.1",
            "status.hostIPs": "127.0.0.1",
        }
        if path in simple:
            return simple[path]
        m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
        if m:
            return meta.get(m.group(1), {}).get(m.group(2), "")
        return ""

    # ----------------------------------------------------------- the periodic tick
    def _tick(self) -> None:
        now = time.monotonic()
        for run in list(self.pods.values()):
            if run.deleting or run.terminal:
                continue
            if run.proc is None:
                if run.next_start and now >= run.next_start:
                    if run.waiting and run.waiting[0] == "CrashLoopBackOff":
                        self._spawn(run)
                    else:
                        self._try_start(run)
                continue
            code = run.proc.poll()
            if code is not None:
                self._container_exited(run, code)
            elif not run.ready and self._probe(run):
                run.ready = True
                self._report(run)
        if self.provision_volumes and now - self._last_provision >= 1.0:
            self._last_provision = now
            self._safe(self._provision_volumes)
        if now - self._last_heartbeat >= 30.0:
            self._safe(self._heartbeat)

    def _probe(self, run: PodRun) -> bool:
        probe = run.container.get("readinessProbe") or {}
        http_get = probe.get("httpGet")
        port = run.port
        if http_get:
            port = self._named_port(run.container, http_get.get("port", run.port))
            url = f"http://{run.ip}:{port}{http_get.get('path', '/')}"
            try:
                r = httpx.get(url, timeout=0.5, trust_env=False)
            except httpx.HTTPError:
                return False
            return 200 <= r.status_code < 400
        import socket

        with socket.socket() as s:
            s.settimeout(0.5)
            return s.connect_ex((run.ip, port)) == 0

    @staticmethod
    def _named_port(container: dict[str, Any], port: int | str) -> int:
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        for p in container.get("ports", []):
            if p.get("name") == port:
                return int(p["containerPort"])
        return 8080

    def _container_exited(self, run: PodRun, code: int) -> None:
        assert run.proc is not None
        stop_process(run.proc, grace=0.5)  # reap anything left in its group
        terminated = {
            "exitCode": 128 - code if code < 0 else code,  # -9 (SIGKILL) -> 137
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": run.started_at,
            "finishedAt": now_rfc3339(),
            "containerID": f"process://{run.proc.pid}",
        }
        if code < 0:
            terminated["signal"] = -code
            terminated["exitCode"] = 128 - code
        run.proc = None
        run.ready = False
        policy = run.restart_policy
        if policy == "Never" or (policy == "OnFailure" and code == 0):
            run.terminal = True
            run.last_state = {"terminated": terminated}
            self._report(run, terminated=terminated)
            return
        run.restart_count += 1
        run.last_state = {"terminated": terminated}
        backoff = min(0.2 * 2 ** min(run.restart_count - 1, 6), 10.0)
        run.waiting = (
            "CrashLoopBackOff",
            f"back-off {backoff:.1f}s restarting failed container",
        )
        run.next_start = time.monotonic() + backoff
        self._report(run)

    # ----------------------------------------------------------- test-driven faults
    def _do_kill(self, namespace: str, name: str, sig: int) -> int:
        run = self._find(namespace, name)
        if run is None or run.proc is None or run.proc.poll() is not None:
            raise LookupError(f"no running process for pod {namespace}/{name}")
        pid = run.proc.pid
        os.killpg(pid, sig)
        return pid

    def _do_restart(self, namespace: str, name: str) -> int:
        run = self._find(namespace, name)
        if run is None or run.proc is None:
            raise LookupError(f"no process for pod {namespace}/{name}")
        code = stop_process(run.proc, grace=self.max_grace_seconds)
        run.last_state = {
            "terminated": {
                "exitCode": 128 - code if code is not None and code < 0 else (code or 0),
                "reason": "Restarted",
                "startedAt": run.started_at,
                "finishedAt": now_rfc3339(),
                "containerID": f"process://{run.proc.pid}",
            }
        }
        run.proc = None
        run.restart_count += 1
        self._spawn(run)
        assert run.proc is not None
        return run.proc.pid

    # ------------------------------------------------------------- storage emulation
    def _provision_volumes(self) -> None:
        """Bind each pending claim to a hostPath PV in the agent's data directory and
        drop released PVs (and their data): a tiny dynamic provisioner."""
        for pvc in self.api.list("/api/v1/persistentvolumeclaims"):
            meta, spec = pvc["metadata"], pvc["spec"]
            if spec.get("volumeName") or meta.get("deletionTimestamp"):
                continue
            if pvc.get("status", {}).get("phase") not in (None, "Pending"):
                continue
            pv_name = f"pvc-{meta['uid']}"
            path = self.claim_dir(meta["uid"])
            path.mkdir(parents=True, exist_ok=True)
            size = spec.get("resources", {}).get("requests", {}).get("storage", "1Gi")
            pv = {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": pv_name, "labels": {AGENT_LABEL: "true"}},
                "spec": {
                    "capacity": {"storage": size},
                    "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
                    # Like a dynamic provisioner's default. A test makes a volume
                    # Retain the way an administrator does: patching the PV.
                    "persistentVolumeReclaimPolicy": "Delete",
                    "hostPath": {"path": str(path), "type": "DirectoryOrCreate"},
                    "claimRef": {
                        "apiVersion": "v1",
                        "kind": "PersistentVolumeClaim",
                        "namespace": meta["namespace"],
                        "name": meta["name"],
                        "uid": meta["uid"],
                    },
                    "volumeMode": spec.get("volumeMode", "Filesystem"),
                },
            }
            if spec.get("storageClassName"):
                pv["spec"]["storageClassName"] = spec["storageClassName"]
            try:
                self.api.create("/api/v1/persistentvolumes", pv)
            except ApiError as exc:
                if exc.status != 409:
                    raise
        for pv in self.api.list("/api/v1/persistentvolumes", labelSelector=f"{AGENT_LABEL}=true"):
            if pv["spec"].get("persistentVolumeReclaimPolicy") == "Retain":
                continue  # released but kept, data included, as a Retain volume is
            # The PV controller may mark a released volume Failed (no deleter plugin):
            # either way this provisioner deletes it, as the policy says.
            if pv.get("status", {}).get("phase") in ("Released", "Failed"):
                claim_uid = pv["spec"].get("claimRef", {}).get("uid")
                self.api.delete(f"/api/v1/persistentvolumes/{pv['metadata']['name']}")
                if claim_uid:
                    shutil.rmtree(self.claim_dir(claim_uid), ignore_errors=True)

    # ------------------------------------------------------------ status reporting
    def _condition(self, run: PodRun, ctype: str, ok: bool, reason: str = "") -> dict[str, Any]:
        status = "True" if ok else "False"
        prev = run.transitions.get(ctype)
        if prev is None or prev[0] != status:
            run.transitions[ctype] = (status, now_rfc3339())
        cond = {
            "type": ctype,
            "status": status,
            "lastProbeTime": None,
            "lastTransitionTime": run.transitions[ctype][1],
        }
        if reason and not ok:
            cond["reason"] = reason
        return cond

    def _report(self, run: PodRun, terminated: dict[str, Any] | None = None) -> None:
        container = run.container
        if terminated is not None:
            state: dict[str, Any] = {"terminated": terminated}
            phase = "Succeeded" if terminated["exitCode"] == 0 else "Failed"
            started = False
        elif run.proc is not None:
            state = {"running": {"startedAt": run.started_at}}
            phase, started = "Running", True
        else:
            reason, message = run.waiting or ("ContainerCreating", "")
            state = {"waiting": {"reason": reason, "message": message}}
            phase = "Running" if run.restart_count else "Pending"
            started = False
        ready = run.ready and terminated is None and run.proc is not None
        not_ready = "PodCompleted" if terminated is not None else "ContainersNotReady"
        container_status = {
            "name": container["name"],
            "image": container.get("image", ""),
            "imageID": "",
            "ready": ready,
            "started": started,
            "restartCount": run.restart_count,
            "state": state,
            "lastState": run.last_state if terminated is None else {},
        }
        if run.proc is not None:
            container_status["containerID"] = f"process://{run.proc.pid}"
        elif terminated is not None:
            container_status["containerID"] = terminated["containerID"]
        status: dict[str, Any] = {
            "phase": phase,
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "startTime": run.start_time,
            "conditions": [
                self._condition(run, "PodReadyToStartContainers", bool(run.ip)),
                self._condition(run, "Initialized", True),
                self._condition(run, "Ready", ready, not_ready),
                self._condition(run, "ContainersReady", ready, not_ready),
                self._condition(run, "PodScheduled", True),
            ],
            "containerStatuses": [container_status],
        }
        if run.ip:
            status["podIP"] = run.ip
            status["podIPs"] = [{"ip": run.ip}]
        if run.waiting and run.proc is None and terminated is None:
            status["message"] = run.waiting[1]
        try:
            self.api.patch(
                f"/api/v1/namespaces/{run.namespace}/pods/{run.name}/status",
                {"metadata": {"uid": run.uid}, "status": status},
            )
        except ApiError as exc:
            if exc.status not in (404, 409):  # pod gone / replaced: the watch catches up
                raise


_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def _expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: known names expand, $$ escapes, others stay."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _VAR.sub(sub, value)


def verify_loopback_alias(ip: str) -> None:
    """Raise when ``ip`` cannot be bound and reached (all of 127/8 is on ``lo`` on Linux;
    other systems only configure 127.0.0.1)."""
    import socket

    with contextlib.closing(socket.socket()) as s:
        s.bind((ip, 0))
        s.listen(1)
        port = s.getsockname()[1]
        with socket.create_connection((ip, port), timeout=2):
            pass
