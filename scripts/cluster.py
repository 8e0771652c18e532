"""``make cluster`` / ``make cluster-down``: the chart on a real local node in one command.

    python scripts/cluster.py up [--port 8100]   build, start, install, print how to reach it
    python scripts/cluster.py down               stop it (the node, its pods, their files)
    python scripts/cluster.py kubectl ARGS...    kubectl against it (inside its namespaces)

``up`` is the node tier's own path (tests/node): the builds (``nodeenv.prepare``: the
control plane and kubelet from Go modules, the image with podman), then, in a private
network, mount and PID namespace (``nodeenv.netns``: nothing of it reaches the machine's
network, and its end takes every process with it), the control plane, containerd and a
kubelet, and the chart installed by docs/operations.md's install block
(``nodeenv.standup``). The way in is a loopback port of the machine, opened here and
handed down to a relay inside that forwards to the API pod. It returns once the API
answers, leaving the node running in the background (log and state in build/cluster/);
``down`` asks it to stop and waits. Needs root and what the node tier needs; without
them it says what is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for sub in ("tests/node", "tests/cluster", "tests/support"):
    sys.path.insert(0, str(REPO / sub))

from kubeenv.controlplane import BIN_DIR  # noqa: E402
from nodeenv import netns  # noqa: E402
from nodeenv.prepare import PrepareFailed, prepare, skip_reason  # noqa: E402
from nodeenv.standup import LISTEN_FD_ENV, READY, STOP, TOKEN, inside  # noqa: E402

STATE = Path(os.environ.get("SANDBOX_CLUSTER_DIR", REPO / "build" / "cluster"))
PID, LOG = STATE / "pid", STATE / "cluster.log"
START_TIMEOUT = 900.0  # a cold image import and rollout on a busy machine


def _running() -> int | None:
    try:
        pid = int(PID.read_text())
        os.kill(pid, 0)
    except (FileNotFoundError, ValueError, ProcessLookupError):
        return None
    return pid


def how_to_reach(ready: dict) -> str:
    url, token = ready["url"], ready["token_file"]
    return f"""
Sandbox Workspace runs on a local node (control plane + kubelet in a private namespace).

  API:    {url}   (docs: {url}/docs)
  Try it: TOKEN=$(cat {token})
          curl -fsS -X POST {url}/api/v1/sessions -H "Authorization: Bearer $TOKEN" \\
            -H 'X-User-Id: alice' -H 'Content-Type: application/json' -d '{{}}'
  kubectl: python scripts/cluster.py kubectl -n sandbox-workspace get pods
  Stop:   make cluster-down
"""


def up(port: int) -> int:
    pid = _running()
    if pid is not None and (STATE / READY).exists():
        print(how_to_reach(json.loads((STATE / READY).read_text())))
        return 0
    if pid is not None:
        print(f"a cluster is starting or stopping (pid {pid}); see {LOG}", file=sys.stderr)
        return 1
    reason = skip_reason()
    if reason:
        print(f"make cluster cannot run here: {reason}", file=sys.stderr)
        return 2
    try:
        env = prepare(sys.stdout)
    except PrepareFailed as exc:
        print(f"make cluster: the builds failed: {exc}", file=sys.stderr)
        return 1
    STATE.mkdir(parents=True, exist_ok=True)
    for name in (READY, STOP):
        (STATE / name).unlink(missing_ok=True)
    _wipe()  # a new node each time: an old etcd would still hold the last release
    listener = socket.create_server(("127.0.0.1", port))
    argv = [sys.executable, str(Path(__file__).resolve()), "inside"]
    with open(LOG, "w") as log:
        proc = subprocess.Popen(
            netns.command(argv),
            cwd=REPO,
            env=netns.env(**env, **{LISTEN_FD_ENV: str(listener.fileno())}),
            pass_fds=[listener.fileno()],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    listener.close()  # the relay inside holds it now
    PID.write_text(str(proc.pid))
    print(f"starting the node and installing the chart (log: {LOG})", flush=True)
    deadline = time.monotonic() + START_TIMEOUT
    while not (STATE / READY).exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            print(f"make cluster failed; the end of {LOG}:", file=sys.stderr)
            print(LOG.read_text()[-4000:], file=sys.stderr)
            down()
            return 1
        time.sleep(0.5)
    print(how_to_reach(json.loads((STATE / READY).read_text())))
    return 0


def down(timeout: float = 120.0) -> int:
    pid = _running()
    if pid is None:
        print("no cluster is running")
        PID.unlink(missing_ok=True)
        return 0
    (STATE / STOP).touch()
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    if _alive(pid):
        # unshare's end kills the namespace's PID 1, and with it every process inside.
        os.kill(pid, signal.SIGKILL)
    for path in (PID, STATE / STOP, STATE / TOKEN):
        path.unlink(missing_ok=True)
    _wipe()
    print("the cluster is stopped")
    return 0


def _wipe() -> None:
    """The node's state (etcd, kubelet, containerd, the release's files): gone with it."""
    for name in ("node", "release"):
        shutil.rmtree(STATE / name, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        finished, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not our child (another `make`): ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    return finished == 0


def kubectl(args: list[str]) -> int:
    pid = _running()
    if pid is None or not (STATE / READY).exists():
        print("no cluster is running: make cluster", file=sys.stderr)
        return 1
    # The namespace's PID 1 (bash) is unshare's child; its network and mounts are the node's.
    child = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()[0]
    kubeconfig = json.loads((STATE / READY).read_text())["kubeconfig"]
    command = ["nsenter", "--target", child, "--net", "--mount", "--"]
    command += ["env", f"KUBECONFIG={kubeconfig}", str(BIN_DIR / "kubectl"), *args]
    return subprocess.run(command, check=False).returncode


def main() -> int:
    if sys.argv[1:2] == ["kubectl"]:  # everything after it is kubectl's, flags included
        return kubectl(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("up")
    start.add_argument("--port", type=int, default=int(os.environ.get("CLUSTER_PORT", 8100)))
    sub.add_parser("down")
    sub.add_parser("inside")
    sub.add_parser("kubectl", help="kubectl ARGS... against the node")
    ns = parser.parse_args()
    if ns.command == "up":
        return up(ns.port)
    if ns.command == "down":
        return down()
    inside(STATE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
