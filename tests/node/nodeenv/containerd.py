"""containerd for the node tier: Debian's containerd + runc with a config of our own
(root, state and socket under the run's directories), and the images imported (test helper).

The content store and snapshots (``root``) are cached in ``.cache/node/containerd`` so an
unchanged image is not unpacked again (~13 s for the product image on a loaded 2-core
machine); a concurrent run that finds the cache locked uses a root of its own. State
(sockets, runc state, netns files) is always per run. Containers never outlive a run:
:meth:`Containerd.clean` removes them before the kubelet starts and after it stopped.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
from pathlib import Path
from typing import IO

from kubeenv.client import wait_until
from kubeenv.controlplane import REPO_ROOT, spawn, stop_process

from .network import POD_SUBNET

CACHE = Path(os.environ.get("SANDBOX_NODE_CACHE", REPO_ROOT / ".cache" / "node"))
IMAGES_SCRIPT = REPO_ROOT / "scripts" / "node" / "images.sh"
RUNC = "/usr/sbin/runc"
CNI_BIN = "/usr/lib/cni"


def config_toml(root: Path, state: Path, socket: Path, cni_conf: Path, pause: str) -> str:
    # restrict_oom_score_adj: the machine has no CAP_SYS_RESOURCE; without it every
    # sandbox fails with "can't get final child's PID from pipe: EOF".
    # SystemdCgroup = false: the kubelet uses cgroupfs (no systemd here, cgroup v1).
    # netns_mounts_under_state_dir: pod netns files under state, not /var/run/netns.
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{root}"
state = "{state}"
oom_score = 0
[grpc]
  address = "{socket}"
[{cri}]
  sandbox_image = "{pause}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        BinaryName = "{RUNC}"
        SystemdCgroup = false
  [{cri}.cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{cni_conf}"
"""


def cni_conflist(ipam_dir: Path, subnet: str = POD_SUBNET, bridge: str = "cni0") -> str:
    # bridge + host-local: pods on the bridge (cni0) with addresses of the subnet
    # (POD_SUBNET), the bridge as their gateway; no masquerading (nothing is meant to
    # leave the namespace).
    return f"""{{
  "cniVersion": "0.4.0",
  "name": "sbw-node",
  "plugins": [
    {{
      "type": "bridge",
      "bridge": "{bridge}",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {{
        "type": "host-local",
        "dataDir": "{ipam_dir}",
        "ranges": [[{{"subnet": "{subnet}"}}]],
        "routes": [{{"dst": "0.0.0.0/0"}}]
      }}
    }}
  ]
}}
"""


class Containerd:
    def __init__(self, workdir: Path, subnet: str = POD_SUBNET, bridge: str = "cni0"):
        self.workdir = workdir
        self.subnet, self.bridge = subnet, bridge
        self.socket = workdir / "containerd.sock"
        self.state = workdir / "containerd-state"
        self.proc: subprocess.Popen[bytes] | None = None
        self._lock: IO[str] | None = None
        self.root = self._claim_root()
        self.images: dict[str, str] = {}

    def _claim_root(self) -> Path:
        CACHE.mkdir(parents=True, exist_ok=True)
        lock = open(CACHE / "containerd.lock", "w")  # noqa: SIM115 - held for the run
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            return self.workdir / "containerd-root"  # another run has the cache
        self._lock = lock
        return CACHE / "containerd"

    def ctr(self, *args: str, check: bool = True) -> str:
        return subprocess.run(
            ["ctr", "--address", str(self.socket), "-n", "k8s.io", *args],
            check=check,
            capture_output=True,
            text=True,
        ).stdout

    def start(self, pause_ref: str) -> Containerd:
        cni_conf = self.workdir / "cni-conf"
        cni_conf.mkdir(parents=True, exist_ok=True)
        (cni_conf / "10-sbw-node.conflist").write_text(
            cni_conflist(self.workdir / "cni-ipam", self.subnet, self.bridge)
        )
        config = self.workdir / "containerd.toml"
        config.write_text(config_toml(self.root, self.state, self.socket, cni_conf, pause_ref))
        self._spawn(config)
        if self.ctr("containers", "ls", "-q").split():
            # A run that died left containers in the cached root: the CRI plugin loaded
            # them at start, so clean and restart for the kubelet to see an empty node.
            self.clean()
            self.stop()
            self._spawn(config)
        return self

    def _spawn(self, config: Path) -> None:
        self.socket.unlink(missing_ok=True)
        self.proc = spawn(
            ["containerd", "--config", str(config), "--log-level", "warn"],
            self.workdir / "containerd.log",
        )
        wait_until(
            lambda: self.socket.exists() and self.ctr("version", check=False),
            timeout=30,
            message="containerd to answer on its socket",
        )

    def import_images(
        self, images: list[tuple[str, str, Path]], stream: IO[str] | None = None
    ) -> None:
        """Import the archives scripts/node/images.sh made (``prepare.images_from_env``)."""
        out = subprocess.run(
            [
                "bash",
                str(IMAGES_SCRIPT),
                "--import",
                str(self.socket),
                *(f"{ref} {archive}" for _, ref, archive in images),
            ],
            check=False,
            capture_output=True,
            text=True,
        )
        if stream is not None:
            stream.write(out.stderr)
        if out.returncode != 0:
            raise RuntimeError(f"scripts/node/images.sh --import failed:\n{out.stderr[-3000:]}")

    def clean(self) -> None:
        """Kill and remove every container of the CRI namespace (pods, sandboxes)."""
        for task in self.ctr("tasks", "ls", "-q", check=False).split():
            self.ctr("tasks", "kill", "-s", "SIGKILL", task, check=False)
        for task in self.ctr("tasks", "ls", "-q", check=False).split():
            self.ctr("tasks", "delete", "-f", task, check=False)
        for container in self.ctr("containers", "ls", "-q", check=False).split():
            self.ctr("containers", "delete", container, check=False)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None

    def release(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None
