"""Limits on a real pod: a memory bomb past the container's own memory limit is the
kernel OOM killer's pick — code, never the runtime nor another conversation — and
parallel code runs confined with the image's shared-memory shim."""

from __future__ import annotations

import json
import uuid

import pytest
from sessions import SBS, UserSession, container_id, get

from sandbox_workspace.contract.crd import API_VERSION

pytestmark = pytest.mark.node

# The container's memory limit (a real memory cgroup on the node) below what one
# execution may use (RLIMIT_AS and the tree watch at 1Gi): the bomb meets the pod's wall
# first, so it is the kernel that acts. Nothing here can hold more than POD_MEMORY.
POD_MEMORY = "384Mi"
EXECUTION_MEMORY = "1Gi"
# 640 MiB touched at once (a one-byte repeat is a memset): past the pod's limit in
# milliseconds, long before the runtime's 0.1 s tick, and under RLIMIT_AS.
BOMB = "blob = b'x' * (640 << 20)\nprint(len(blob))"


def _task_pid(node_cluster, cid: str) -> int:
    """The host pid of the container's init process (the runtime), from containerd."""
    for line in node_cluster.containerd.ctr("tasks", "ls").splitlines()[1:]:
        task, pid, *_ = line.split()
        if task == cid:
            return int(pid)
    raise AssertionError(f"no task {cid} in containerd")


@pytest.fixture
def limited(release, kube):
    """A session whose pod has a real container memory limit of POD_MEMORY."""
    user = f"oom-{uuid.uuid4().hex[:8]}"
    s = UserSession(release, kube, user)
    spec = {
        "userId": user,
        "resources": {"limits": {"memory": POD_MEMORY}},
        "limits": {"memory": EXECUTION_MEMORY},
    }
    # Made as kubectl would, without the names annotation: the operator stamps it on a
    # session it never reconciled, so its pod carries the current (64-bit) name.
    kube.create(SBS, {"apiVersion": API_VERSION, "kind": "SandboxSession",
                      "metadata": {"name": s.name}, "spec": spec})  # fmt: skip
    yield s
    s.delete()


def test_a_memory_bomb_past_the_pods_limit_takes_only_its_own_interpreter(limited, node_cluster):
    s = limited
    b = s.execute("import os\nkept = 'B-' + os.urandom(8).hex()\nprint(kept)", cid="b")
    kept = b["stdout"].strip()
    assert b["error"] is None and kept.startswith("B-"), b
    pod = s.pod()
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["limits"]["memory"] == POD_MEMORY
    cid = container_id(pod)
    runtime_pid = _task_pid(node_cluster, cid)
    a = s.execute("x = 1", cid="a")  # A's interpreter has state too
    assert a["error"] is None, a

    bombed = s.execute(BOMB, cid="a")

    # A: its own error, from the kernel's OOM kill, told as the memory limit.
    error = bombed["error"]
    assert error and error["code"] == "memory_limit_exceeded", bombed
    assert "OOM killer" in error["value"] and "state is lost" in error["value"], error
    # The runtime: same container, same process, no restart; it still answers.
    after = s.pod()
    (status,) = after["status"]["containerStatuses"]
    assert after["metadata"]["uid"] == pod["metadata"]["uid"]
    assert status["restartCount"] == 0 and not status.get("lastState"), status
    assert container_id(after) == cid and _task_pid(node_cluster, cid) == runtime_pid
    assert get(f"{s.sbs()['status']['endpoint']}/healthz").status_code == 200
    # B: its interpreter and its variable are still there.
    again = s.execute("print(kept)", cid="b")
    assert again["error"] is None and again["stdout"].strip() == kept, again
    # A starts afresh: a new interpreter, its old state gone.
    fresh = s.execute("print('x' in globals())", cid="a")
    assert fresh["error"] is None and fresh["stdout"].strip() == "False", fresh


PARALLEL = r"""
import json, multiprocessing as mp, os
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import shared_memory

def square(x):
    return x * x

with mp.Pool(2) as pool:
    squares = pool.map(square, range(6))
with ProcessPoolExecutor(max_workers=2) as ex:
    cubes = list(ex.map(pow, range(4), [3] * 4))
shm = shared_memory.SharedMemory(create=True, size=16)
def fill(name):
    seg = shared_memory.SharedMemory(name=name)
    seg.buf[:5] = b"hello"
    seg.close()
p = mp.Process(target=fill, args=(shm.name,)); p.start(); p.join()
where = os.path.join(os.environ["TMPDIR"], "shm", shm.name.lstrip("/"))
seen = {"squares": squares, "cubes": cubes, "shm": bytes(shm.buf[:5]).decode(),
        "in_scratch": os.path.exists(where), "in_dev_shm": os.path.exists("/dev/shm" + shm.name),
        "preload": os.environ.get("LD_PRELOAD"),
        "preload_exists": os.path.exists(os.environ.get("LD_PRELOAD", "/nonexistent"))}
shm.close(); shm.unlink()
print(json.dumps(seen))
"""


def test_parallel_code_runs_confined_with_the_images_shared_memory_shim(session):
    out = session.execute(PARALLEL, cid="par")
    assert out["error"] is None, out
    seen = json.loads(out["stdout"])
    assert seen["squares"] == [0, 1, 4, 9, 16, 25] and seen["cubes"] == [0, 1, 8, 27]
    assert seen["shm"] == "hello"
    # Private to the conversation (its scratch space), never /dev/shm.
    assert seen["in_scratch"] is True and seen["in_dev_shm"] is False
    # The library the Dockerfile's `shim` stage built, inside the image's package.
    assert seen["preload"] == "/opt/app/sandbox_workspace/runtime/sbw_shm.so", seen
    assert seen["preload_exists"] is True
