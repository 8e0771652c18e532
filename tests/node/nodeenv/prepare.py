"""What the node tier needs before it enters its namespace (test helper): whether this
machine can host it at all, and the builds that need the network (binaries, helm, the
images), which cannot run inside the namespace.

Used by tests/node/conftest.py and by ``python -m bench session_start``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import IO

from build_scripts import find_go, run_build_script  # tests/support
from kubeenv.controlplane import BIN_DIR, REPO_ROOT

from . import netns
from .containerd import CNI_BIN, RUNC

IMAGES_ENV = "SANDBOX_NODE_IMAGES"
TOOLS = ("containerd", "ctr", "podman", "gcc", "ip", "curl", "base64", "iptables", "ipset")
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet")
SCRIPTS = ("build-kube.sh", "build-tools.sh", "node/images.sh")
# The egress module's NetworkPolicy enforcer: built beside the tier, not before it (only
# that module waits for it: ``wait_for_enforcer``), as scripts/prebuild.sh's step
# ``enforcer``, which writes its exit code to ENFORCER_DIR/enforcer.rc; its output goes to
# ENFORCER_LOG.
ENFORCER_SCRIPT = REPO_ROOT / "scripts" / "build-enforcer.sh"
ENFORCER_DIR = REPO_ROOT / "build" / "node-enforcer"
ENFORCER_LOG = ENFORCER_DIR / "build.log"
ENFORCER_RC = ENFORCER_DIR / "enforcer.rc"


def missing_parts() -> list[str]:
    missing = [t for t in TOOLS if shutil.which(t) is None]
    for path in (RUNC, f"{CNI_BIN}/bridge", f"{CNI_BIN}/host-local"):
        if not os.access(path, os.X_OK):
            missing.append(path)
    return missing


def skip_reason() -> str | None:
    """Why the node tier cannot run here (None when it can)."""
    if os.environ.get("SANDBOX_SKIP_NODE", "") not in ("", "0"):
        return "SANDBOX_SKIP_NODE is set: node tier disabled"
    why = netns.unavailable()
    if why:
        return f"node tier {why}"
    missing = missing_parts()
    if missing:
        return (
            f"node tier needs {', '.join(missing)} (scripts/install-system-deps.sh installs them)"
        )
    if not all(os.access(BIN_DIR / b, os.X_OK) for b in BINARIES) and find_go() is None:
        return "node tier needs Go to build kubelet/kube-scheduler (no binaries in .cache/kube)"
    return None


class PrepareFailed(RuntimeError):
    pass


def prepare(stream: IO[str] | None, enforcer: bool = False) -> dict[str, str]:
    """Build (or reuse: seconds) binaries, helm and the images; return the environment
    the inner run needs (which image archives to import). With ``enforcer``, first start
    scripts/build-enforcer.sh in the background (it needs the network, so it runs out
    here; seconds when cached, and when the run's prebuild is at it, it waits for that
    one's lock)."""
    if enforcer:
        start_enforcer_build()
    images = ""
    for script in SCRIPTS:
        if stream is not None:
            stream.write(f"\n[node tier] scripts/{script}\n")
        rc, tail = run_build_script(REPO_ROOT / "scripts" / script, REPO_ROOT, stream)
        if rc != 0:
            raise PrepareFailed(f"scripts/{script} failed (exit {rc}):\n{tail}")
        if script == "node/images.sh":
            images = "\n".join(
                line for line in tail.splitlines() if line.startswith(("pause=", "image="))
            )
    return {IMAGES_ENV: images}


def images_from_env() -> list[tuple[str, str, Path]]:
    """(key, reference, archive) of each image the outer run built."""
    found = []
    for line in os.environ.get(IMAGES_ENV, "").splitlines():
        key, _, rest = line.partition("=")
        ref, _, archive = rest.partition(" ")
        found.append((key, ref, Path(archive)))
    return found


def start_enforcer_build() -> subprocess.Popen[bytes]:
    ENFORCER_DIR.mkdir(parents=True, exist_ok=True)
    ENFORCER_RC.unlink(missing_ok=True)
    with ENFORCER_LOG.open("wb") as log:
        return subprocess.Popen(
            ["bash", str(REPO_ROOT / "scripts" / "prebuild.sh"), str(ENFORCER_DIR), "enforcer"],
            cwd=REPO_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def enforcer_built() -> bool:
    """scripts/build-enforcer.sh's own check (a hash of scripts/enforcer/: no network)."""
    out = subprocess.run(["bash", str(ENFORCER_SCRIPT), "--print"], capture_output=True)
    return out.returncode == 0


def wait_for_enforcer(timeout: float) -> str | None:
    """Wait for the build ``prepare`` started; None when built, else why not. Built
    already: no wait. Else its exit code is waited for (a file's look a second, not the
    script's check: that hashes the sources in four processes)."""
    if enforcer_built():
        return None
    deadline = time.monotonic() + timeout
    while not ENFORCER_RC.exists() and time.monotonic() < deadline:
        time.sleep(1)  # a build of seconds to minutes
    rc = ENFORCER_RC.read_text().strip() if ENFORCER_RC.exists() else ""
    if rc == "0" and enforcer_built():
        return None
    log = ENFORCER_LOG.read_text()[-3000:] if ENFORCER_LOG.exists() else "(no log)"
    ended = f"exit {rc}" if rc else f"still running after {timeout:.0f} s"
    return f"scripts/build-enforcer.sh: {ended}; {ENFORCER_LOG}:\n{log}"
