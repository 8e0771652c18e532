"""The product on a real local node — for the node tier and for people (``make cluster``,
scripts/cluster.py) alike: one install, one way in (test helper).

- ``install_release(cluster, workdir, values)``: the chart installed on a started
  ``NodeCluster`` by docs/operations.md's install block (``Release.install``), with the
  image the tier built; the tier's ``release`` fixture and ``inside()`` both call it.
- ``serve(release, kube, listener, state_dir)``: the way in from the machine. The
  listening socket was made on the machine's loopback *before* the private network
  namespace (scripts/cluster.py passes it down), so a relay inside (``TcpProxy.on``) can
  answer it and forward each connection to the API pod as it is now. It writes
  ``ready.json`` (URL, kubeconfig, token file) into ``state_dir`` and returns once the
  file ``stop`` appears there (``make cluster-down``) or ``stop`` is set.
- ``inside(state_dir)``: the namespace side of ``make cluster``: node, install, serve,
  then everything stopped.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

from kubeenv.client import KubeClient
from tcp_proxy import TcpProxy  # tests/support

from .node import NodeCluster
from .release import API_PORT, Release, api_pod_ip

LISTEN_FD_ENV = "SANDBOX_CLUSTER_LISTEN_FD"
READY, STOP, TOKEN = "ready.json", "stop", "service-token"


def install_release(
    cluster: NodeCluster, workdir: Path, values: dict[str, str]
) -> tuple[Release, subprocess.CompletedProcess[str]]:
    release = Release(cluster.kubeconfig, workdir, cluster.images["image"], values)
    return release, release.install()


def serve(
    release: Release,
    kube: KubeClient,
    listener: socket.socket,
    state_dir: Path,
    stop: threading.Event | None = None,
) -> None:
    stop = stop or threading.Event()
    relay = TcpProxy.on(listener, lambda: (api_pod_ip(kube), API_PORT)).start()
    try:
        token = state_dir / TOKEN
        token.write_text(release.service_token)
        token.chmod(0o600)
        host, port = listener.getsockname()[:2]
        ready = {"url": f"http://{host}:{port}", "kubeconfig": str(release.kubeconfig)}
        (state_dir / READY).write_text(json.dumps({**ready, "token_file": str(token)}))
        while not (stop.is_set() or (state_dir / STOP).exists()):
            stop.wait(0.5)
    finally:
        relay.stop()
        (state_dir / READY).unlink(missing_ok=True)


def inside(state_dir: Path) -> None:
    listener = socket.socket(fileno=int(os.environ[LISTEN_FD_ENV]))
    cluster = NodeCluster(state_dir / "node")
    try:
        cluster.start(stream=sys.stdout)
        release, result = install_release(cluster, state_dir / "release", {})
        print(result.stdout, result.stderr, flush=True)
        if result.returncode != 0:
            raise SystemExit(f"helm install failed (exit {result.returncode})")
        with cluster.client() as kube:
            serve(release.connect(kube), kube, listener, state_dir)
    finally:
        cluster.stop()
