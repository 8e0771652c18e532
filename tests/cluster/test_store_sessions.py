"""Sessions without a volume per user (store mode ``s3``) on a real apiserver, with the
API as a real process (backend ``kubernetes``), pods run as runtimes by the node agent,
and a real SeaweedFS: no claim is made, ``/workspace`` is an emptyDir, an idle stop
drops the pod and its storage, and the resumed pod is filled from the store before the
first execution — every upload and output byte-identical at the same path. And no
sandbox pod holds any store credential."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest
from api_calls import execute
from kubeenv import KubeClient, NodeAgent, wait_until
from operator_env import TIMEOUT, sbs_path

from sandbox_workspace.operator import naming

pytestmark = pytest.mark.cluster

USER = "erin"
SID = f"sb-session-{USER}"
BASE = f"/api/v1/sessions/{SID}"
# Every file of the conversation (relative to its directory), with its SHA-256.
HASH_ALL = (
    "import hashlib, os\n"
    "for top in ('uploads', 'outputs'):\n"
    "    for d, _, names in sorted(os.walk(top)):\n"
    "        for n in sorted(names):\n"
    "            p = os.path.join(d, n)\n"
    "            print(p, hashlib.sha256(open(p, 'rb').read()).hexdigest())\n"
)
WRITE_OUTPUTS = (
    "import os\n"
    "os.makedirs('outputs/deep/er', exist_ok=True)\n"
    "open('outputs/deep/er/made.bin', 'wb').write(bytes(range(256)) * 4000)\n"
    "open('outputs/report.txt', 'w').write('made by code')\n"
)


def _pod_path(ns: str) -> str:
    return f"/api/v1/namespaces/{ns}/pods/{naming.runtime_pod_name(SID)}"


def test_a_stopped_session_resumes_on_a_new_pod_with_every_file_from_the_store(
    store_stack: str, kube_api: KubeClient, namespace: str, node_agent: NodeAgent, seaweedfs
):
    payload = os.urandom(3 << 20)
    with httpx.Client(base_url=store_stack, headers={"X-User-Id": USER}, timeout=120) as api:
        r = api.post(
            f"{BASE}/files/upload",
            files={"file": ("in.csv", payload)},
            data={"conversation_id": "c1"},
        )
        assert r.status_code == 201, r.text
        assert execute(api, BASE, WRITE_OUTPUTS, cid="c1")["exit_code"] == 0
        before = execute(api, BASE, HASH_ALL, cid="c1")["stdout"].splitlines()
        paths = api.get(f"{BASE}/files", params={"conversation_id": "c1"}).json()["items"]
    assert len(before) == 3, before

    # No claim at all; /workspace is the pod's emptyDir.
    assert kube_api.list(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims") == []
    pod = kube_api.get(_pod_path(namespace))
    workspace = next(v for v in pod["spec"]["volumes"] if v["name"] == "workspace")
    assert set(workspace) == {"name", "emptyDir"}
    storage = node_agent.data_dir_of(namespace, pod["metadata"]["name"])
    assert storage is not None and (storage / "c1" / "outputs" / "report.txt").is_file()
    old_uid = pod["metadata"]["uid"]

    # Idle stop: the pod goes, and its node-local storage with it.
    kube_api.patch(f"{sbs_path(namespace)}/{SID}", {"spec": {"idleTimeoutSeconds": 1}})
    wait_until(
        lambda: (
            (kube_api.get(f"{sbs_path(namespace)}/{SID}").get("status") or {}).get("phase")
            == "Stopped"
            and kube_api.get_or_none(_pod_path(namespace)) is None
        ),
        timeout=TIMEOUT,
        message="the idle session to stop and its pod to go",
    )
    wait_until(lambda: not storage.exists(), timeout=TIMEOUT, message="the emptyDir to go")
    kube_api.patch(f"{sbs_path(namespace)}/{SID}", {"spec": {"idleTimeoutSeconds": 3600}})

    # Resume: a new pod, filled from the store before the first execution.
    with httpx.Client(base_url=store_stack, headers={"X-User-Id": USER}, timeout=120) as api:
        after = execute(api, BASE, HASH_ALL, cid="c1")["stdout"].splitlines()
        listing = api.get(f"{BASE}/files", params={"conversation_id": "c1"}).json()
        got = api.get(f"{BASE}/files/in.csv", params={"conversation_id": "c1"})
    new_pod = kube_api.get(_pod_path(namespace))
    assert new_pod["metadata"]["uid"] != old_uid
    assert after == before  # same paths, same bytes
    assert listing["files"] == ["in.csv"]
    # The path code opens is the same below the pod's /workspace (the test node agent
    # gives each pod its own directory where a kubelet mounts the emptyDir there).
    new_storage = node_agent.data_dir_of(namespace, new_pod["metadata"]["name"])
    assert new_storage is not None
    assert [str(Path(f["path"]).relative_to(new_storage)) for f in listing["items"]] == [
        str(Path(f["path"]).relative_to(storage)) for f in paths
    ]
    assert got.content == payload
    assert kube_api.list(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims") == []


def test_a_sandbox_pod_holds_no_store_credential(
    store_stack: str, kube_api: KubeClient, namespace: str, node_agent: NodeAgent, seaweedfs,
    s3_bucket,
):  # fmt: skip
    """No pod holds another conversation's keys: the live pod's environment (as the
    node resolved it), its Secrets and its service account carry nothing of the store."""
    with httpx.Client(base_url=store_stack, headers={"X-User-Id": USER}, timeout=120) as api:
        code = "import os, json; print(json.dumps(dict(os.environ)))"
        env = json.loads(execute(api, BASE, code, cid="c1")["stdout"])
    settings = seaweedfs.settings(s3_bucket)
    secrets = {
        settings.access_key_id.get_secret_value(),
        settings.secret_access_key.get_secret_value(),
    }
    leaked = [k for k, v in env.items() if v in secrets or "S3" in k or k.startswith("AWS_")]
    assert leaked == []
    pod = kube_api.get(_pod_path(namespace))
    text = json.dumps(pod)
    assert not [s for s in secrets if s in text] and s3_bucket not in text
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert not [v for v in spec["volumes"] if "secret" in v or "projected" in v]
    (container,) = spec["containers"]
    refs = [e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"] if "valueFrom" in e]
    assert refs == [naming.runtime_secret_name(SID)]
    # The one Secret it reads holds its runtime token and nothing else.
    secret = kube_api.get(f"/api/v1/namespaces/{namespace}/secrets/{refs[0]}")
    assert set(secret["data"]) == {"token"}
    # Its running process: the runtime's own environment (as the node agent gave it).
    run = node_agent.pod_run(namespace, pod["metadata"]["name"])
    assert run is not None and run.proc is not None
    proc_env = Path(f"/proc/{run.proc.pid}/environ").read_bytes().split(b"\0")
    assert not [e for e in proc_env if any(s.encode() in e for s in secrets)]
