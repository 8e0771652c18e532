"""Every promise of a session, on real pods through the API pod: files, code, chat, idle
stop and resume, conversation deletion on the volume's disk, a killed container."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time

import pytest
from kubeenv.client import wait_until
from nodeenv.release import SESSIONS
from scripted_llm import Reply, text_reply, tool_reply, tool_results
from seed_client import SeedClient, assert_recovered
from sessions import SBS, container_id, get

from sandbox_workspace.contract.crd import API_VERSION
from sandbox_workspace.operator import naming
from sandbox_workspace.operator.answers import ANSWERS

pytestmark = pytest.mark.node


def test_upload_list_download_execute_on_a_real_pod(session):
    data = os.urandom(300_000)
    info = session.upload("conv1", "blob.pkl", data)
    assert info["path"] == "/workspace/conv1/uploads/temparea/blob.pkl"
    assert info["sha256"] == hashlib.sha256(data).hexdigest()
    assert session.listing("conv1") == ["blob.pkl"]
    assert session.download("conv1", "blob.pkl") == data
    out = session.execute(
        "import hashlib, os\n"
        "print(hashlib.sha256(open('uploads/temparea/blob.pkl','rb').read()).hexdigest())\n"
        "print(os.getuid(), os.getcwd())",
        cid="conv1",
    )
    assert out["exit_code"] == 0, out
    assert out["stdout"].split() == [hashlib.sha256(data).hexdigest(), "10001", "/workspace/conv1"]
    pod = session.pod()
    assert pod["status"]["phase"] == "Running"
    assert container_id(pod)  # a container of containerd, not a test process
    assert session.sbs()["status"]["endpoint"] == f"http://{pod['status']['podIP']}:8080"


def test_chat_runs_code_in_the_sandbox_pod(session, node_llm):
    session.upload("chat", "t.csv", b"v\n1\n2\n3\n")

    def respond(body: dict) -> Reply:
        results = tool_results(body)
        if not results:
            code = "import pandas as pd\nprint(int(pd.read_csv('uploads/temparea/t.csv').v.sum()))"
            return tool_reply("execute_code", {"code": code})
        return text_reply("Sum: " + results[-1]["content"].strip())

    node_llm.responder = respond
    body = {"conversation_id": "chat", "query": "sum of v?", "selected_files": ["t.csv"]}
    events = []
    with session.api.stream("POST", "/chat", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                events.append((kind, json.loads(line[6:])))
    kinds = [k for k, _ in events]
    assert kinds[0] == "run_started" and kinds[-1] == "done", kinds
    tool_end = next(d for k, d in events if k == "tool_end")
    assert tool_end["ok"] is True and tool_end["output"].strip() == "6"
    result = next(d for k, d in events if k == "result")
    assert result["success"] is True and result["answer"] == "Sum: 6"


def test_idle_stop_keeps_the_claim_and_resume_brings_the_files_back(session, kube):
    data = os.urandom(200_000)
    session.upload("keep", "data.pkl", data)
    out = session.execute("open('outputs/r.txt','w').write('result 42')", cid="keep")
    assert out["exit_code"] == 0, out
    first_pod = session.pod()["metadata"]["uid"]
    kube.patch(f"{SBS}/{session.name}", {"spec": {"idleTimeoutSeconds": 2}})
    stopped = session.wait_phase("Stopped", timeout=90)
    assert {c["type"]: c["status"] for c in stopped["status"]["conditions"]}["Stopped"] == "True"
    wait_until(lambda: session.pod() is None, timeout=60, message="the idle pod to be deleted")
    claim = session.claim()
    assert claim is not None and claim["status"]["phase"] == "Bound"
    kube.patch(f"{SBS}/{session.name}", {"spec": {"idleTimeoutSeconds": 0}})

    # Any file operation resumes the session: a new pod on the same claim.
    assert session.listing("keep") == ["data.pkl"]
    assert session.download("keep", "data.pkl") == data
    out = session.execute("print(open('outputs/r.txt').read())", cid="keep")
    assert out["stdout"].strip() == "result 42"
    assert session.pod()["metadata"]["uid"] != first_pod
    assert session.claim()["metadata"]["uid"] == claim["metadata"]["uid"]


def test_seed_client_recovers_a_session_stopped_for_idleness(session, kube):
    """Seed 000 §3.2's EnsureSandboxSession, ported literally, after a real idle stop:
    GET stopped, POST 409 (its resume started), then pending, running; files kept."""
    session.upload("seed", "keep.csv", b"kept")
    kube.patch(f"{SBS}/{session.name}", {"spec": {"idleTimeoutSeconds": 2}})
    session.wait_phase("Stopped", timeout=90)
    wait_until(lambda: session.pod() is None, timeout=60, message="the idle pod to be deleted")
    kube.patch(f"{SBS}/{session.name}", {"spec": {"idleTimeoutSeconds": 0}})
    seed = SeedClient(session.api, session.user, prefix="")
    assert seed.ensure(session.session_id) == session.session_id
    assert_recovered(seed, "stopped")
    assert session.download("seed", "keep.csv") == b"kept"


def test_conversation_deletion_is_verified_on_the_volume_disk(session, kube):
    session.upload("gone", "a.csv", b"x\n1\n")
    session.upload("stays", "b.csv", b"y\n2\n")
    session.execute("open('outputs/o.txt','w').write('o')", cid="gone")
    disk = session.volume_dir()
    assert (disk / "gone" / "uploads" / "temparea" / "a.csv").read_bytes() == b"x\n1\n"
    assert (disk / "gone" / "outputs" / "o.txt").exists()
    r = session.api.delete(f"{session.url}/conversations/gone")
    assert r.status_code in (200, 202), r.text
    wait_until(
        lambda: not (disk / "gone").exists(), timeout=60, message="the conversation's files gone"
    )
    assert (disk / "stays" / "uploads" / "temparea" / "b.csv").read_bytes() == b"y\n2\n"
    assert session.listing("stays") == ["b.csv"]


def test_a_killed_sandbox_container_is_replaced_and_nothing_is_lost(session, node_cluster):
    data = os.urandom(100_000)
    session.upload("k", "d.pkl", data)
    pod = session.pod()
    answers: list[int] = []

    started = session.volume_dir() / "k" / "outputs" / "started"

    def long_call() -> None:
        code = "open('outputs/started','w').close()\nimport time; time.sleep(30)"
        r = session.api.post(
            f"{session.url}/execute",
            json={"conversation_id": "k", "language": "python", "code": code},
        )
        answers.append(r.status_code)

    caller = threading.Thread(target=long_call)
    caller.start()
    wait_until(started.exists, timeout=60, message="the execution to run in the container")
    node_cluster.containerd.ctr("tasks", "kill", "-s", "SIGKILL", container_id(pod))
    caller.join(timeout=60)
    assert answers and answers[0] != 500, answers  # an answer, not a crash of the API

    def replaced() -> bool:
        new = session.pod()
        return bool(
            new
            and new["metadata"]["uid"] != pod["metadata"]["uid"]
            and new["status"].get("phase") == "Running"
            and session.phase() == "Running"
        )

    wait_until(replaced, timeout=120, message="a replacement pod Running")
    assert session.download("k", "d.pkl") == data
    assert session.execute("print(1 + 1)", cid="k")["stdout"].strip() == "2"


def test_running_is_reported_when_the_runtime_answers_not_a_probe_period_later(release, kube):
    """The operator polls a starting pod's /healthz itself (operator/answers.py): the
    session is Running the moment its runtime answers — before the kubelet's readiness
    probe (every 2 s) marks the pod Ready — and Running still means it answers.

    The operator can only be first when the kubelet reports the pod's address before its
    Ready: on a loaded node it may report both together (seen in CI: all three sessions
    of a run reported by the probe, each polled by the operator for ~20 ms, i.e. from an
    address that came with the runtime already up). So the test watches each pod too and
    holds the operator to it where the kubelet gave it a window (the address seen ≥ 1 s
    before Ready); sessions are made until three told (at most eight)."""
    windows: list[str] = []  # the Ready message of each session that tells
    names: list[str] = []
    try:
        while len(windows) < 3 and len(names) < 8:
            name = f"sb-session-early-{len(names)}"
            names.append(name)
            body = {"apiVersion": API_VERSION, "kind": "SandboxSession",
                    "metadata": {"name": name}, "spec": {"userId": name}}  # fmt: skip
            kube.create(SBS, body)
            pod_path = f"/api/v1/namespaces/{SESSIONS}/pods/{naming.runtime_pod_name(name)}"
            seen: dict[str, float] = {}

            def running(n: str = name, pod_path: str = pod_path, seen=seen) -> dict | None:
                pod = kube.get_or_none(pod_path) or {}
                status = pod.get("status", {})
                ready = any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in status.get("conditions", [])
                )
                if status.get("podIP") and not ready:
                    seen.setdefault("address", time.monotonic())
                if ready:
                    seen.setdefault("ready", time.monotonic())
                return _if_running(kube.get(f"{SBS}/{n}"))

            session = wait_until(
                running, timeout=120, interval=0.02, message=f"session {name} to be Running"
            )
            endpoint = session["status"]["endpoint"]
            assert get(f"{endpoint}/healthz").status_code == 200  # Running = answers
            ready = next(c for c in session["status"]["conditions"] if c["type"] == "Ready")
            # Reported by the operator's check, or by the probe although the kubelet gave
            # the operator its window: either tells. The probe with no window tells nothing.
            window = seen.get("ready", time.monotonic()) - seen.get("address", time.monotonic())
            if ready["message"] == ANSWERS or window >= 1.0:
                windows.append(ready["message"])
        assert windows, f"the kubelet reported no pod's address before its Ready ({names})"
        # With a window, the operator's check comes first — one of three is enough, as a
        # probe can still land the instant the runtime is up.
        assert ANSWERS in windows, windows
    finally:
        for name in names:
            kube.delete(f"{SBS}/{name}")


def _if_running(session: dict) -> dict | None:
    return session if session.get("status", {}).get("phase") == "Running" else None
