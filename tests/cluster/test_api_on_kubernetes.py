"""The foundation's API test suite, run against the ``kubernetes`` backend.

Everything is a real process: the control plane (fixtures), ``sandbox-workspace operator``
and ``sandbox-workspace api`` (backend ``kubernetes``) as subprocesses, and each sandbox
pod run by the test node agent as a runtime on its own 127.x address. The suite in
``tests/api`` is then run as it is, pointed at this API through SANDBOX_TEST_API_URL;
tests that exercise the local backend itself are skipped there (marker
``local_backend``).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from kubeenv.processes import clean_env
from kubeenv.stack import Stack
from operator_env import sbs_path, wait_phase
from scripted_llm import Reply, ScriptedLLM, text_reply, tool_reply, tool_results
from seed_client import SeedClient, assert_recovered

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
SUITE = [
    "tests/api/test_files.py",
    "tests/api/test_sessions.py",
    "tests/api/test_execute.py",
    # Seed 000 §3.2's client: new user, running, three first uses at once.
    "tests/api/test_seed_ensure.py",
    "tests/api/test_hostile_paths.py::test_api_download_and_delete_by_hostile_path",
    "tests/api/test_hostile_paths.py::test_api_list_download_delete_with_hostile_conversation_id",
    # Conversation state (the kubernetes backend's conversation_phase) and bare names.
    *(
        f"tests/api/test_contract_conversations.py::{name}"
        for name in (
            "test_bare_name_download_resolves_within_the_session",
            "test_bare_name_delete_resolves_the_same_way",
            "test_conversation_state_lists_uploads_and_outputs",
            "test_unknown_conversation_is_absent_and_reading_creates_nothing",
            "test_deleted_conversation_reads_deleting_then_absent",
        )
    ),
    # The hostile-code catalogue (tests/support/hostile_code.py) against pods' runtimes.
    "tests/api/test_confinement.py::test_hostile_code_is_refused_and_the_sandbox_stays_healthy",
]


@pytest.fixture(scope="module")
def scripted_model() -> Iterator[ScriptedLLM]:
    model = ScriptedLLM().start()
    yield model
    model.stop()


@pytest.fixture
def kubernetes_api(
    kube_control_plane, kube_api, node_agent, namespace, tmp_path, scripted_model
) -> Iterator[str]:
    stack = Stack(
        kube_control_plane.kubeconfig,
        namespace,
        tmp_path,
        api_env={
            "SANDBOX_WORKSPACE_SESSION_STORAGE__SIZE": "2Gi",
            "SANDBOX_WORKSPACE_LLM_BASE_URL": scripted_model.url,
            "SANDBOX_WORKSPACE_LLM_MODEL": "scripted",
        },
    )
    # Sessions left by the suite still have workspaces whose finalizers need the
    # operator: running() deletes them before it goes.
    with stack.running(kube_api) as url:
        yield url


# The whole API suite in one subprocess: pytest-timeout's per-test default is too short
# for it on a loaded two-core machine (it hit 300 s at load average 10).
@pytest.mark.timeout(900)
def test_api_suite_passes_on_the_kubernetes_backend(kubernetes_api, tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            *SUITE,
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            "addopts=--import-mode=importlib -ra",
        ],
        cwd=REPO,
        env=clean_env(SANDBOX_TEST_API_URL=kubernetes_api),
        capture_output=True,
        text=True,
        timeout=850,
    )
    report = tmp_path / "api-suite.txt"
    report.write_text(result.stdout + result.stderr)
    summary = result.stdout[-6000:]
    assert result.returncode == 0, f"full output: {report}\n" + summary + result.stderr[-3000:]
    assert " passed" in summary and "failed" not in summary.splitlines()[-1]


def test_sessions_created_through_the_api_carry_the_api_settings(
    kubernetes_api, kube_api, namespace
):
    r = httpx.post(
        kubernetes_api + "/api/v1/sessions",
        headers={"X-User-Id": "carol"},
        json={"agent_id": "a1"},
        timeout=30,
    )
    assert r.status_code == 201, r.text
    cr = kube_api.get(
        f"/apis/sandboxworkspace.io/v1alpha1/namespaces/{namespace}"
        "/sandboxsessions/sb-session-carol"
    )
    assert cr["spec"]["storage"]["size"] == "2Gi"
    assert cr["spec"]["idleTimeoutSeconds"] == 3600
    assert cr["spec"]["userId"] == "carol" and cr["spec"]["agentId"] == "a1"


def test_open_chat_run_awaiting_approval_counts_as_session_activity(
    kubernetes_api, kube_api, namespace, scripted_model
):
    def respond(body: dict) -> Reply:
        if not tool_results(body):
            return tool_reply("bash", {"command": "echo hi"}, call_id="call_wait")
        return text_reply("done")

    scripted_model.responder = respond
    headers = {"X-User-Id": "dora"}
    body = {"query": "q", "conversation_id": "c", "tool_policies": {"bash": "require_approval"}}
    with (
        httpx.Client(base_url=kubernetes_api, headers=headers, timeout=120) as client,
        client.stream("POST", "/api/v1/chat", json=body) as r,
    ):
        assert r.status_code == 200
        kind = None
        lines = r.iter_lines()
        for line in lines:
            if line.startswith("event: "):
                kind = line[7:]
                if kind == "tool_approval":
                    break
        assert kind == "tool_approval"
        path = (
            f"/apis/sandboxworkspace.io/v1alpha1/namespaces/{namespace}"
            "/sandboxsessions/sb-session-dora"
        )
        # Written by the API's own patch after the event was sent (and by the run's
        # heartbeat, a task of its own): waited for, never read once.
        kube_api.wait_for(
            path,
            lambda o: "sandboxworkspace.io/last-activity" in o["metadata"].get("annotations", {}),
            timeout=30,
            message="the pending approval recorded as session activity",
        )
        approved = client.post(
            f"/api/v1/runs/{r.headers['x-run-id']}/approvals",
            json={"tool_call_id": "call_wait", "approved": True},
        )
        assert approved.status_code == 200, approved.text
        rest = [line[7:] for line in lines if line.startswith("event: ")]
    assert rest[-2:] == ["result", "done"]


def test_seed_client_recovers_a_session_stopped_for_idleness(kubernetes_api, kube_api, namespace):
    """Seed 000 §3.2's EnsureSandboxSession after the operator's idle stop: GET stopped,
    POST 409 (its resume started), then pending — never stopped — and running; the files
    are kept (the session's volume)."""
    user = "seed-idle"
    sid = f"sb-session-{user}"
    path = sbs_path(namespace, sid)
    with httpx.Client(base_url=kubernetes_api, headers={"X-User-Id": user}, timeout=120) as api:
        r = api.post(
            f"/api/v1/sessions/{sid}/files/upload",
            files={"file": ("keep.csv", b"kept")},
            data={"conversation_id": "c"},
        )
        assert r.status_code == 201, r.text
        kube_api.patch(path, {"spec": {"idleTimeoutSeconds": 2}})
        wait_phase(kube_api, path, "Stopped", timeout=60)
        kube_api.patch(path, {"spec": {"idleTimeoutSeconds": 3600}})  # not stopped again
        seed = SeedClient(api, user)
        assert seed.ensure(sid) == sid
        assert_recovered(seed, "stopped")
        got = api.get(f"/api/v1/sessions/{sid}/files/keep.csv", params={"conversation_id": "c"})
        assert got.status_code == 200 and got.content == b"kept"


def test_reads_of_absent_conversations_create_no_conversation_workspace(
    kubernetes_api, kube_api, namespace
):
    """Issue 34: a read never creates a ConversationWorkspace, so a user looping over
    random conversation ids cannot fill etcd; only the write makes one."""
    user = "reader"
    sid = f"sb-session-{user}"
    base = f"/api/v1/sessions/{sid}"
    ghosts = [f"ghost-{i}" for i in range(7)]
    with httpx.Client(base_url=kubernetes_api, headers={"X-User-Id": user}, timeout=120) as api:
        r = api.post(
            f"{base}/files/upload",
            files={"file": ("a.csv", b"1")},
            data={"conversation_id": "real"},
        )
        assert r.status_code == 201, r.text
        reads = [
            api.get(f"{base}/files", params={"conversation_id": ghosts[0]}),
            api.get(f"{base}/files", params={"conversation_id": ghosts[1], "subdir": "outputs"}),
            api.get(f"{base}/files/a.csv", params={"conversation_id": ghosts[2]}),
            api.get(f"{base}/conversations/{ghosts[3]}"),
            api.get(f"{base}/conversations/{ghosts[4]}/runs"),
            api.get(f"{base}/workspace/{ghosts[5]}"),
            api.get(f"{base}/workspace/{ghosts[6]}/files/f-0123456789abcdef"),
        ]
    for ghost, r in zip(ghosts, reads, strict=True):
        assert r.status_code < 500 or r.status_code == 503, (ghost, r.status_code, r.text)
    workspaces = kube_api.get(
        f"/apis/sandboxworkspace.io/v1alpha1/namespaces/{namespace}/conversationworkspaces"
    )["items"]
    mine = sorted(w["spec"]["conversationId"] for w in workspaces if w["spec"]["userId"] == user)
    assert mine == ["real"], mine
