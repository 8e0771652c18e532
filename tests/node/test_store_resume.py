"""Sessions without a volume per user (store mode ``s3``, issue 21 item 5) on a real
kubelet: no claim, ``/workspace`` a node-local emptyDir on the kubelet's disk, an idle
stop deletes the pod and that directory, and the resumed pod (a new pod) is filled from
the store before first use — on a second node (a second kubelet and containerd, the first
node cordoned) — every upload and every output code wrote, byte-identical at the same real
path, as code in the new pod sees it, and on that node's disk."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from kubeenv.client import wait_until
from nodeenv.network import NODE_NAME, SECOND_NODE_NAME
from sessions import UserSession, empty_dir

pytestmark = pytest.mark.node

# Every file of the conversation with its real path, size and SHA-256, as code sees it.
HASH_ALL = (
    "import hashlib, json, os\n"
    "seen = {}\n"
    "for top in ('uploads', 'outputs'):\n"
    "    for d, _, names in os.walk(top):\n"
    "        for n in names:\n"
    "            p = os.path.abspath(os.path.join(d, n))\n"
    "            data = open(p, 'rb').read()\n"
    "            seen[p] = [len(data), hashlib.sha256(data).hexdigest()]\n"
    "print(json.dumps(seen, sort_keys=True))\n"
)


def outputs(seed: int) -> dict[str, bytes]:
    """What code writes: binary files in nested directories (reproducible from ``seed``)."""
    blob = hashlib.shake_256(seed.to_bytes(4, "big")).digest(1 << 20)
    return {
        "outputs/deep/er/made.bin": blob + bytes(range(256)),
        "outputs/a/b/c/d/zeros.bin": b"\0" * 70_001,
        "outputs/report.txt": f"made by code {seed}\n".encode(),
        "outputs/with space/ünï.bin": bytes(reversed(blob[:5000])),
    }


WRITE_OUTPUTS = (  # after a line SEED = n; the same files as outputs(n)
    "import hashlib, os\n"
    "blob = hashlib.shake_256(SEED.to_bytes(4, 'big')).digest(1 << 20)\n"
    "files = {\n"
    "    'outputs/deep/er/made.bin': blob + bytes(range(256)),\n"
    "    'outputs/a/b/c/d/zeros.bin': bytes(70_001),\n"
    "    'outputs/report.txt': f'made by code {SEED}\\n'.encode(),\n"
    "    'outputs/with space/\\u00fcn\\u00ef.bin': bytes(reversed(blob[:5000])),\n"
    "}\n"
    "for path, data in files.items():\n"
    "    os.makedirs(os.path.dirname(path), exist_ok=True)\n"
    "    open(path, 'wb').write(data)\n"
)


def expected(cid: str, uploads: dict[str, bytes], seed: int) -> dict[str, list]:
    files = {f"uploads/temparea/{n}": d for n, d in uploads.items()} | outputs(seed)
    return {
        f"/workspace/{cid}/{p}": [len(d), hashlib.sha256(d).hexdigest()] for p, d in files.items()
    }


def seen_by_code(session: UserSession, cid: str) -> dict[str, list]:
    out = session.execute(HASH_ALL, cid=cid)
    assert out["exit_code"] == 0, out
    return json.loads(out["stdout"])


def on_disk(directory: Path, cid: str) -> dict[str, list]:
    """The same view, read on the node from the pod's emptyDir."""
    found = {}
    for path in sorted((directory / cid).rglob("*")):
        rel = path.relative_to(directory / cid)
        if path.is_file() and rel.parts[0] in ("uploads", "outputs"):
            data = path.read_bytes()
            found[f"/workspace/{cid}/{rel}"] = [len(data), hashlib.sha256(data).hexdigest()]
    return found


def test_an_idle_stopped_session_resumes_on_a_new_pod_with_every_file_byte_identical(
    s3_session: UserSession, s3_stack, kube, node_cluster, second_node
):
    s = s3_session
    uploads = {
        "c1": {"data.pkl": os.urandom(3 << 20), "notes.csv": b"a,b\n1,2\n"},
        "c2": {"other.pkl": os.urandom(200_000)},
    }
    want = {}
    for seed, (cid, files) in enumerate(uploads.items(), start=1):
        for name, data in files.items():
            assert s.upload(cid, name, data)["path"] == f"/workspace/{cid}/uploads/temparea/{name}"
        assert s.execute(f"SEED = {seed}\n" + WRITE_OUTPUTS, cid=cid)["exit_code"] == 0
        want[cid] = expected(cid, files, seed)
        assert seen_by_code(s, cid) == want[cid]

    # No claim: /workspace is an emptyDir with a size limit, on the kubelet's disk.
    pod = s.pod()
    assert pod is not None and pod["spec"]["nodeName"]
    assert kube.list(f"/api/v1/namespaces/{s.namespace}/persistentvolumeclaims") == []
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert set(volumes["workspace"]) == {"name", "emptyDir"}
    assert volumes["workspace"]["emptyDir"].get("sizeLimit")
    pod_dir = Path(node_cluster.kubelet_dir) / "pods" / pod["metadata"]["uid"]
    disk = empty_dir(node_cluster.kubelet_dir, pod)
    for cid in uploads:
        assert on_disk(disk, cid) == want[cid]
    # Every file is in the store before the stop (written back after each execution).
    keys = s3_stack.keys(s.session_id)
    for cid in uploads:
        for path in want[cid]:
            rel = path.removeprefix(f"/workspace/{cid}/")
            assert any(k.endswith(f"/{cid}/{rel}") for k in keys), (rel, keys)

    # Idle stop: the pod is deleted and the kubelet removes its directory from the disk.
    kube.patch(s.sbs_path, {"spec": {"idleTimeoutSeconds": 2}})
    s.wait_phase("Stopped", timeout=90)
    wait_until(lambda: s.pod() is None, timeout=60, message="the idle pod to be deleted")
    wait_until(
        lambda: not pod_dir.exists(),
        timeout=90,
        message=f"the stopped pod's directory {pod_dir} (its emptyDir) to be removed",
    )
    assert not disk.exists()
    kube.patch(s.sbs_path, {"spec": {"idleTimeoutSeconds": 3600}})

    # Resume through the API, on the other node: a new pod, filled from the store before
    # code runs.
    assert pod["spec"]["nodeName"] == NODE_NAME
    second_node.schedule_here()
    try:
        for cid in uploads:
            assert seen_by_code(s, cid) == want[cid]
    finally:
        second_node.restore()
    new = s.pod()
    assert new["metadata"]["uid"] != pod["metadata"]["uid"]
    assert new["spec"]["nodeName"] == SECOND_NODE_NAME
    assert kube.list(f"/api/v1/namespaces/{s.namespace}/persistentvolumeclaims") == []
    new_disk = empty_dir(second_node.kubelet_dir, new)
    for cid in uploads:
        assert on_disk(new_disk, cid) == want[cid]
    # The listing still shows the uploads only, and a download gives the bytes.
    assert s.listing("c1") == sorted(uploads["c1"])
    assert s.download("c1", "data.pkl") == uploads["c1"]["data.pkl"]
