"""The deletion guarantee through the API on a real apiserver (kubernetes backend).

The operator and the API are subprocesses (``kubeenv.stack``) so the operator can be
stopped: the ConversationWorkspace with its finalizer must exist before the first byte
of the conversation is written, a deletion waits for the operator however long it is
away, writes are refused meanwhile, and the same id then starts with a fresh resource.
Also: a session being deleted gets no traffic, and a failed session recovers on the
first try (its stale status is not judged before the operator acted on the resume).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from kubeenv import wait_until
from kubeenv.client import delete_sandbox_resources
from kubeenv.stack import Stack

pytestmark = pytest.mark.cluster

GROUP = "/apis/sandboxworkspace.io/v1alpha1"
FINALIZER = "sandboxworkspace.io/files"
HOLD = "test.sandboxworkspace.io/hold"


@pytest.fixture
def stack(kube_control_plane, kube_api, node_agent, namespace, tmp_path) -> Iterator[Stack]:
    s = Stack(kube_control_plane.kubeconfig, namespace, tmp_path)
    s.start_operator()
    s.start_api()
    try:
        yield s
    finally:
        s.stop_api()
        if s.operator is None:
            s.start_operator()
        delete_sandbox_resources(kube_api, namespace)
        s.stop_operator()


def _client(stack: Stack, user: str) -> httpx.Client:
    return httpx.Client(base_url=stack.api_url, headers={"X-User-Id": user}, timeout=120)


def _upload(client: httpx.Client, user: str, cid: str, name: str = "a.txt") -> httpx.Response:
    return client.post(
        f"/api/v1/sessions/sb-session-{user}/files/upload",
        files={"file": (name, b"payload")},
        data={"conversation_id": cid},
    )


def _workspaces(kube_api, namespace: str) -> dict[str, dict]:
    items = kube_api.list(f"{GROUP}/namespaces/{namespace}/conversationworkspaces")
    return {w["spec"]["conversationId"]: w for w in items}


def test_a_conversation_written_while_the_operator_is_down_is_deleted_once_it_is_back(
    stack, kube_api, namespace
):
    user = "ada"
    with _client(stack, user) as client:
        assert _upload(client, user, "warm-up").status_code == 201  # the session runs
        stack.stop_operator()
        r = _upload(client, user, "c1")
        assert r.status_code == 201, r.text
        on_disk = Path(r.json()["path"])
        assert on_disk.read_bytes() == b"payload"
        cws = _workspaces(kube_api, namespace)["c1"]
        # Nobody but the API made it: the finalizer came with the creation.
        assert cws["metadata"]["finalizers"] == [FINALIZER]
        assert not cws.get("status")
        old_uid = cws["metadata"]["uid"]

        r = client.delete(f"/api/v1/sessions/sb-session-{user}/conversations/c1")
        assert r.status_code == 202, r.text
        held = _workspaces(kube_api, namespace)["c1"]
        assert held["metadata"].get("deletionTimestamp"), "deletion waits for the operator"
        for attempt in (
            _upload(client, user, "c1", "late.txt"),
            client.post(
                f"/api/v1/sessions/sb-session-{user}/execute",
                json={"conversation_id": "c1", "language": "bash", "code": "echo x > y"},
            ),
        ):
            assert attempt.status_code == 409, attempt.text
            assert attempt.json()["error"]["code"] == "conversation_deleting"
            assert attempt.headers["retry-after"]
        assert on_disk.exists(), "nothing deletes the files without the operator"

        stack.start_operator()
        wait_until(lambda: "c1" not in _workspaces(kube_api, namespace), timeout=60)
        assert not on_disk.exists() and not on_disk.parents[2].exists()

        # Gone from the apiserver is not yet gone from the API's watched cache of the
        # workspaces: until its DELETED event arrives the id answers "deleting" (409 with
        # a Retry-After), and a client retries. Anything else fails at once.
        def fresh_upload() -> httpx.Response | None:
            r = _upload(client, user, "c1", "fresh.txt")
            if r.status_code == 409 and r.json()["error"]["code"] == "conversation_deleting":
                return None
            return r

        again = wait_until(fresh_upload, timeout=30, message="the API to see c1 gone")
        assert again.status_code == 201, again.text
        fresh = _workspaces(kube_api, namespace)["c1"]
        assert fresh["metadata"]["uid"] != old_uid
        assert fresh["metadata"]["finalizers"] == [FINALIZER]
        listing = client.get(
            f"/api/v1/sessions/sb-session-{user}/files", params={"conversation_id": "c1"}
        ).json()
        assert listing["files"] == ["fresh.txt"]


def test_execute_creates_the_tracked_workspace_before_code_runs(stack, kube_api, namespace):
    user = "bob"
    with _client(stack, user) as client:
        assert _upload(client, user, "warm-up").status_code == 201
        stack.stop_operator()
        r = client.post(
            f"/api/v1/sessions/sb-session-{user}/execute",
            json={"conversation_id": "by-code", "language": "bash", "code": "echo x > out"},
        )
        assert r.status_code == 200, r.text
        assert _workspaces(kube_api, namespace)["by-code"]["metadata"]["finalizers"] == [FINALIZER]


def test_a_terminating_session_gets_no_traffic(stack, kube_api, namespace):
    user = "cleo"
    path = f"{GROUP}/namespaces/{namespace}/sandboxsessions/sb-session-{user}"
    with _client(stack, user) as client:
        assert _upload(client, user, "c").status_code == 201
        kube_api.patch(path, {"metadata": {"finalizers": [HOLD]}})
        kube_api.delete(path)
        try:
            r = _upload(client, user, "c")
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "session_terminating"
            assert int(r.headers["retry-after"]) >= 1
            status = client.get(f"/api/v1/sessions/sb-session-{user}")
            assert status.status_code == 200  # it can still be looked at
        finally:
            kube_api.patch(path, {"metadata": {"finalizers": None}})
        kube_api.wait_gone(path, timeout=60)

        # Gone: the next use starts a fresh session — once the old session's workspaces
        # (deleted with it) are gone too; until then the answer says to retry.
        def fresh_start() -> bool:
            r = _upload(client, user, "c")
            assert r.status_code == 201 or "retry-after" in r.headers, r.text
            return r.status_code == 201

        wait_until(fresh_start, timeout=60, interval=0.5, message="a fresh session")


def test_a_failed_session_recovers_on_the_first_try(stack, kube_api, namespace):
    user = "dan"
    path = f"{GROUP}/namespaces/{namespace}/sandboxsessions/sb-session-{user}"
    with _client(stack, user) as client:
        assert _upload(client, user, "c").status_code == 201
        stack.stop_operator()
        session = kube_api.get(path)
        status = {**session["status"], "phase": "Error"}
        kube_api.patch(path + "/status", {"status": status})
        answers: list[httpx.Response] = []
        caller = threading.Thread(target=lambda: answers.append(_upload(client, user, "c")))
        caller.start()
        wait_until(
            lambda: (
                "sandboxworkspace.io/resume-requested"
                in (kube_api.get(path)["metadata"].get("annotations") or {})
            ),
            timeout=30,
            message="the API to request a resume",
        )
        stack.start_operator()
        caller.join(120)
    assert answers and answers[0].status_code == 201, answers and answers[0].text
