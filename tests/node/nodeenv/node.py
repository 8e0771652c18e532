"""A real node for tests: the cluster tier's control plane adapted to it, kube-scheduler,
containerd and a kubelet 1.34 — inside the namespace ``netns`` made (test helper).

``NodeCluster(workdir).start()`` brings up, in order: the node network
(``network.setup``), etcd + kube-apiserver + kube-controller-manager (kubeenv's
``ControlPlane`` with the node's flags), kube-scheduler, containerd with the imported
images, the kubelet; it returns once the node is Ready without the not-ready taint (the
node-lifecycle controller removes it) and the default StorageClass exists.
``stop()`` tears everything down: containers killed and removed, processes stopped,
kubelet mounts and cgroups removed.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path
from typing import IO, Any

import yaml
from kubeenv.client import KubeClient, wait_until
from kubeenv.controlplane import BIN_DIR, ControlPlane, free_port, spawn, stop_process

from . import network
from .cgroups import CgroupRoot
from .containerd import Containerd
from .network import NODE_IP, NODE_NAME, SECOND_NODE_NAME
from .prepare import images_from_env

STORAGE_CLASS = "hostpath"
# The gid the operator's sandbox pods get as fsGroup (operator/builders.py RUNTIME_UID).
FS_GROUP = 10001


def kubelet_config(socket: Path, address: str, cgroup_root: str, ca_file: str) -> dict[str, Any]:
    """The KubeletConfiguration of a node of the tier: containerd at ``socket``, serving on
    ``address``, pods' cgroups under ``cgroup_root``, clients verified against ``ca_file``."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # This machine: cgroup v1 (hybrid), no systemd, swap tolerated.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        # A cgroup root of this run's own: concurrent runs never share kubepods.
        "cgroupRoot": cgroup_root,
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{socket}",
        "address": address,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 0,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": ca_file},
        },
        "authorization": {"mode": "Webhook"},
        "clusterDomain": "cluster.local",
        "resolvConf": "",
        # A shared, busy machine: evict only when truly out of memory, never GC the
        # imported images (nothing could pull them again). No eviction for disk at all
        # ("0%", as kind's nodes): the node's disk is the machine's, which the other
        # users fill and empty, not the node's pods — at 1% (2.5 GB of 252) a full run
        # saw the node report DiskPressure, evict the operator and the API and leave
        # every new pod Pending (the taint stays 5 min after the disk is freed).
        "evictionHard": {
            "memory.available": "50Mi",
            "nodefs.available": "0%",
            "imagefs.available": "0%",
            "nodefs.inodesFree": "0%",
            "imagefs.inodesFree": "0%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "nodeStatusUpdateFrequency": "2s",
        "nodeStatusReportFrequency": "10s",
        "syncFrequency": "10s",
        "serializeImagePulls": False,
    }


class NodeControlPlane(ControlPlane):
    """The control plane of a cluster with a real node.

    The apiserver listens on :443 of every address of the namespace, so pods reach it
    at the `kubernetes` Service's ClusterIP (an address of node0) without kube-proxy;
    it talks to the kubelet by its InternalIP with a client certificate. Node
    authorization admits the kubelet; kube-controller-manager runs the node-lifecycle
    controller (it removes the not-ready taint) and the hostpath provisioner.
    """

    apiserver_port = 443
    extra_ips = (NODE_IP,)
    authorization_modes = "Node,RBAC"
    controllers = "*,-nodeipam"

    def __init__(self, workdir: Path, bin_dir: Path = BIN_DIR):
        super().__init__(workdir, bin_dir)
        self.kubelet_token = self.add_user(f"system:node:{NODE_NAME}", "system:nodes")
        # The second node's kubelet (nodeenv.second_node), if a test starts one.
        self.second_kubelet_token = self.add_user(f"system:node:{SECOND_NODE_NAME}", "system:nodes")
        self.scheduler_token = self.add_user("system:kube-scheduler")

    def apiserver_args(self) -> list[str]:
        cert, key = self.pki.issue_client(
            "apiserver-kubelet-client", "kube-apiserver-kubelet-client", "system:masters"
        )
        return [
            "--bind-address=0.0.0.0",
            f"--advertise-address={NODE_IP}",
            "--enable-admission-plugins=NodeRestriction",
            f"--kubelet-client-certificate={cert}",
            f"--kubelet-client-key={key}",
            "--kubelet-preferred-address-types=InternalIP",
        ]

    def kcm_args(self) -> list[str]:
        return [
            "--enable-hostpath-provisioner",
            "--node-monitor-period=1s",
            # The PV binder binds a claim in two writes (spec.volumeName, then
            # status.phase Bound); the scheduler places the pod after the first, the
            # kubelet mounts after the second and, finding the claim "not bound" in
            # between, retries the pod only 10-15 s later. kube-controller-manager's
            # default client limit (20 requests/s) stretched that gap to 0.5 s while the
            # tier's helm rollouts and session bursts ran, and sessions waited 18-34 s.
            "--kube-api-qps=200",
            "--kube-api-burst=400",
        ]


class NodeCluster:
    """Control plane + scheduler + containerd + kubelet; see the module docstring."""

    def __init__(self, workdir: Path, bin_dir: Path = BIN_DIR):
        self.workdir = Path(workdir)
        self.bin_dir = Path(bin_dir)
        self.plane = NodeControlPlane(self.workdir / "kube", bin_dir)
        self.containerd: Containerd | None = None
        self.cgroups = CgroupRoot(f"sbw-node-{os.getpid()}")
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.timings: dict[str, float] = {}
        self.kubelet_dir = self.workdir / "kubelet"
        self.images: dict[str, str] = {}
        self._fs_group = _FsGroupWatcher(Path("/tmp/hostpath_pv"), FS_GROUP)

    def client(self, timeout: float = 30.0) -> KubeClient:
        return self.plane.client(timeout)

    @property
    def kubeconfig(self) -> Path:
        return self.plane.kubeconfig

    def log_path(self, name: str) -> Path:
        return self.workdir / f"{name}.log"

    def start(self, stream: IO[str] | None = None) -> NodeCluster:
        t0 = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            network.setup(self.workdir / "private")
            self._fs_group.start()
            self.plane.start()
            self.timings["control plane"] = time.monotonic() - t0
            self._start_scheduler()
            images = images_from_env()
            if not images:
                raise RuntimeError("no images to import: run through nodeenv.prepare first")
            self.images = {key: ref for key, ref, _ in images}
            self.containerd = Containerd(self.workdir / "containerd").start(self.images["pause"])
            self.containerd.import_images(images, stream)
            self.timings["containerd + images"] = time.monotonic() - t0
            self.cgroups.create()
            self._start_kubelet()
            self._wait_ready()
            self.timings["node ready"] = time.monotonic() - t0
            self._storage_class()
        except BaseException:
            self.stop()
            raise
        return self

    # -- components -------------------------------------------------------------------
    def _start_scheduler(self) -> None:
        kubeconfig = self.workdir / "scheduler.kubeconfig"
        self.plane.write_kubeconfig(kubeconfig, "system:kube-scheduler", self.plane.scheduler_token)
        port = free_port()
        self.procs["kube-scheduler"] = spawn(
            [
                str(self.bin_dir / "kube-scheduler"),
                f"--kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                "--leader-elect=false",
                "--profiling=false",
                "--v=1",
            ],
            self.log_path("kube-scheduler"),
        )

    def _kubelet_config(self) -> dict[str, Any]:
        return kubelet_config(
            self.containerd.socket,  # type: ignore[union-attr]
            NODE_IP,
            f"/{self.cgroups.name}",
            self.plane.ca_file,
        )

    def _start_kubelet(self) -> None:
        self.procs["kubelet"] = self.spawn_kubelet(
            NODE_NAME, NODE_IP, self.plane.kubelet_token, self.kubelet_dir, self._kubelet_config()
        )

    def spawn_kubelet(
        self, name: str, address: str, token: str, root_dir: Path, config: dict[str, Any]
    ) -> subprocess.Popen[bytes]:
        """A kubelet registering node ``name`` at ``address`` (its log: ``<name>.log``,
        the first node's ``kubelet.log``)."""
        root_dir.mkdir(parents=True, exist_ok=True)
        stem = "kubelet" if name == NODE_NAME else f"kubelet-{name}"
        config_file = self.workdir / f"{stem}-config.yaml"
        config_file.write_text(yaml.safe_dump(config, sort_keys=False))
        kubeconfig = self.workdir / f"{stem}.kubeconfig"
        self.plane.write_kubeconfig(kubeconfig, f"system:node:{name}", token)
        return spawn(
            [
                str(self.bin_dir / "kubelet"),
                f"--config={config_file}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={root_dir}",
                f"--node-ip={address}",
                f"--hostname-override={name}",
                # SANDBOX_NODE_KUBELET_V=4 logs each pod's steps with timestamps (where
                # the time of a pod start goes); 1 keeps the log small.
                f"--v={os.environ.get('SANDBOX_NODE_KUBELET_V', '1')}",
            ],
            self.log_path(stem),
        )

    def _check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                tail = self.log_path(name).read_text(errors="replace")[-4000:]
                raise RuntimeError(f"{name} exited with {proc.returncode}; log tail:\n{tail}")

    def _wait_ready(self, timeout: float = 120.0) -> None:
        def ready() -> bool:
            self._check_alive()
            node = api.get_or_none(f"/api/v1/nodes/{NODE_NAME}")
            if node is None:
                return False
            conditions = {c["type"]: c["status"] for c in node["status"].get("conditions", [])}
            taints = [t["key"] for t in node["spec"].get("taints", [])]
            return conditions.get("Ready") == "True" and not taints

        with self.client() as api:
            try:
                wait_until(ready, timeout=timeout, interval=0.2, message="the node to be Ready")
            except TimeoutError as exc:
                tail = self.log_path("kubelet").read_text(errors="replace")[-4000:]
                raise RuntimeError(f"{exc}\nkubelet log tail:\n{tail}") from None

    def _storage_class(self) -> None:
        with self.client() as api:
            api.apply(
                {
                    "apiVersion": "storage.k8s.io/v1",
                    "kind": "StorageClass",
                    "metadata": {
                        "name": STORAGE_CLASS,
                        "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
                    },
                    "provisioner": "kubernetes.io/host-path",
                    "reclaimPolicy": "Delete",
                    "volumeBindingMode": "Immediate",
                }
            )

    # -- teardown ---------------------------------------------------------------------
    def stop(self) -> None:
        if "kubelet" in self.procs:
            stop_process(self.procs.pop("kubelet"))
        if self.containerd is not None:
            self.containerd.clean()
            self.containerd.stop()
            self.containerd.release()
            self.containerd = None
        for name in reversed(list(self.procs)):
            stop_process(self.procs.pop(name))
        self.plane.stop()
        self._fs_group.stop()
        network.unmount_under(self.kubelet_dir)
        network.unmount_under(self.workdir)
        self.cgroups.remove()
        network.teardown()

    def __enter__(self) -> NodeCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _FsGroupWatcher:
    """Gives each new hostpath volume the ownership a CSI driver's fsGroup support would.

    The hostpath provisioner makes ``/tmp/hostpath_pv/<uuid>`` root-owned with mode 0750,
    and the kubelet applies no fsGroup to hostPath volumes, so the sandbox's uid 10001
    could not write its workspace. A cluster's real storage applies the pod's fsGroup;
    this thread stands in for that (gid FS_GROUP, setgid, group-writable) within
    milliseconds of the provisioner creating the directory — before any pod can use it.
    """

    def __init__(self, base: Path, gid: int):
        self.base, self.gid = base, gid
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fsgroup", daemon=True)
        self._seen: set[str] = set()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            try:
                names = os.listdir(self.base)
            except OSError:
                continue
            for name in names:
                if name in self._seen:
                    continue
                path = self.base / name
                try:
                    os.chown(path, 0, self.gid)
                    os.chmod(path, 0o2770)
                except OSError:
                    continue
                self._seen.add(name)
