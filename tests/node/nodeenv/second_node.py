"""A second node beside the tier's first (test helper): its own kubelet (node name
``sbw-node-2``, address 10.250.0.2 on node0, its own root directory, cgroup root and pod
log directory) and its own containerd (socket, state, root; pod bridge ``cni1`` with
10.244.1.0/24) — a kubelet owns every pod sandbox of its containerd's CRI namespace, so
two kubelets cannot share one containerd.

``SecondNode(cluster).start()`` returns once the node is Ready and the not-ready taint is
gone; the node is *cordoned* from its registration on (patched before the not-ready taint
leaves, so nothing lands there unasked); ``schedule_here()`` uncordons it and cordons the
first node, ``restore()`` undoes that. ``stop()`` deletes the pods bound to the node and
waits until its kubelet has let them go (``drain``), then deletes the Node object, stops
the kubelet, removes its containers, stops containerd and removes its cgroups and mounts.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path
from typing import IO

from kubeenv.client import wait_until
from kubeenv.controlplane import stop_process

from . import network
from .cgroups import CgroupRoot
from .containerd import Containerd
from .network import NODE_NAME, SECOND_BRIDGE, SECOND_NODE_IP, SECOND_NODE_NAME, SECOND_POD_SUBNET
from .node import NodeCluster, kubelet_config
from .prepare import images_from_env

NODES = "/api/v1/nodes"


class SecondNode:
    def __init__(self, cluster: NodeCluster):
        self.cluster = cluster
        self.workdir = cluster.workdir / "node-2"
        self.kubelet_dir = self.workdir / "kubelet"
        self.cgroups = CgroupRoot(f"sbw-node2-{os.getpid()}")
        self.containerd: Containerd | None = None
        self.kubelet: subprocess.Popen[bytes] | None = None
        self.timings: dict[str, float] = {}

    @property
    def log(self) -> Path:
        return self.cluster.log_path(f"kubelet-{SECOND_NODE_NAME}")

    def start(self, stream: IO[str] | None = None) -> SecondNode:
        t0 = time.monotonic()
        try:
            self.workdir.mkdir(parents=True, exist_ok=True)
            network.ip("addr", "add", f"{SECOND_NODE_IP}/{network.NODE_PREFIX}", "dev", "node0")
            # The first node holds the cached containerd root: this one imports the images
            # into a root of its own.
            images = images_from_env()
            pause = next(ref for key, ref, _ in images if key == "pause")
            self.containerd = Containerd(
                self.workdir / "containerd", SECOND_POD_SUBNET, SECOND_BRIDGE
            ).start(pause)
            self.containerd.import_images(images, stream)
            self.timings["containerd + images"] = time.monotonic() - t0
            self.cgroups.create()
            config = kubelet_config(
                self.containerd.socket,
                SECOND_NODE_IP,
                f"/{self.cgroups.name}",
                self.cluster.plane.ca_file,
            )
            # /var/log/pods is the first kubelet's: each kubelet removes the log
            # directories of pods it does not know.
            config["podLogsDirectory"] = str(self.workdir / "pod-logs")
            self.kubelet = self.cluster.spawn_kubelet(
                SECOND_NODE_NAME,
                SECOND_NODE_IP,
                self.cluster.plane.second_kubelet_token,
                self.kubelet_dir,
                config,
            )
            self._cordon_and_wait_ready()
            self.timings["node ready"] = time.monotonic() - t0
            if stream is not None:
                stream.write(f"[second node] {self.timings}\n")
        except BaseException:
            self.stop()
            raise
        return self

    def _alive(self) -> None:
        if self.kubelet is not None and self.kubelet.poll() is not None:
            tail = self.log.read_text(errors="replace")[-4000:]
            raise RuntimeError(f"the second kubelet exited ({self.kubelet.returncode}):\n{tail}")

    def _cordon_and_wait_ready(self, timeout: float = 120.0) -> None:
        with self.cluster.client() as api:

            def registered() -> bool:
                self._alive()
                return api.get_or_none(f"{NODES}/{SECOND_NODE_NAME}") is not None

            wait_until(registered, timeout=timeout, message="the second node to register")
            api.patch(f"{NODES}/{SECOND_NODE_NAME}", {"spec": {"unschedulable": True}})

            def ready() -> bool:
                self._alive()
                node = api.get(f"{NODES}/{SECOND_NODE_NAME}")
                conditions = {c["type"]: c["status"] for c in node["status"].get("conditions", [])}
                taints = {t["key"] for t in node["spec"].get("taints", [])}
                return conditions.get("Ready") == "True" and taints <= {
                    "node.kubernetes.io/unschedulable"
                }

            wait_until(ready, timeout=timeout, interval=0.2, message="the second node Ready")

    def schedule_here(self) -> None:
        """New pods go to this node only: the first is cordoned, this one uncordoned."""
        self._set_unschedulable(NODE_NAME, True)
        self._set_unschedulable(SECOND_NODE_NAME, False)

    def restore(self) -> None:
        """New pods go to the first node only again."""
        self._set_unschedulable(SECOND_NODE_NAME, True)
        self._set_unschedulable(NODE_NAME, False)

    def _set_unschedulable(self, name: str, value: bool) -> None:
        with self.cluster.client() as api:
            api.patch(f"{NODES}/{name}", {"spec": {"unschedulable": value}})

    def drain(self, timeout: float = 90.0) -> None:
        """Delete every pod bound to this node and wait until they are gone: a pod's
        deletion completes only when its kubelet confirms it, so one left behind when the
        kubelet stops stays Terminating — and with it whatever waits for it (a
        ConversationWorkspace's finalizer waits for its session's pod and emptyDir)."""
        if self.kubelet is None:
            return
        bound = {"fieldSelector": f"spec.nodeName={SECOND_NODE_NAME}"}
        with self.cluster.client() as api:
            for pod in api.list("/api/v1/pods", **bound):
                meta = pod["metadata"]
                api.delete(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}")
            wait_until(
                lambda: not api.list("/api/v1/pods", **bound),
                timeout=timeout,
                message=f"the pods bound to {SECOND_NODE_NAME} to be gone",
            )

    def stop(self) -> None:
        if self.kubelet is not None:
            try:
                self.drain()
            finally:
                stop_process(self.kubelet)
                self.kubelet = None
        with contextlib.suppress(Exception), self.cluster.client() as api:
            api.delete(f"{NODES}/{SECOND_NODE_NAME}")  # after the kubelet: it would re-register
        if self.containerd is not None:
            self.containerd.clean()
            self.containerd.stop()
            self.containerd.release()
            self.containerd = None
        network.unmount_under(self.kubelet_dir)
        network.unmount_under(self.workdir)
        self.cgroups.remove()
        subprocess.run(
            ["ip", "addr", "del", f"{SECOND_NODE_IP}/{network.NODE_PREFIX}", "dev", "node0"],
            check=False,
            capture_output=True,
        )
        subprocess.run(["ip", "link", "del", SECOND_BRIDGE], check=False, capture_output=True)
