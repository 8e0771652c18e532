"""operator/status.py: a session's status from its pod, conditions and their transitions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from sandbox_workspace.operator.models import (
    SandboxSession,
    SandboxSessionSpec,
    SandboxSessionStatus,
)
from sandbox_workspace.operator.status import (
    PodState,
    condition,
    is_stopped,
    observe_pod,
    session_status,
)

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def pod(phase: str, *, ready: bool = False, ip: str | None = "10.0.0.7", **status) -> dict:
    return {
        "metadata": {"name": "sb-session-alice"},
        "status": {
            "phase": phase,
            **({"podIP": ip} if ip else {}),
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            **status,
        },
    }


def waiting(reason: str, message: str = "") -> dict:
    return {"containerStatuses": [{"state": {"waiting": {"reason": reason, "message": message}}}]}


@pytest.mark.parametrize(
    ("obj", "kind", "reason"),
    [
        pytest.param(None, "missing", "PodMissing", id="missing"),
        pytest.param(pod("Pending", ip=None), "pending", "PodPending", id="pending"),
        pytest.param(
            pod("Pending", **waiting("ContainerCreating")),
            "pending",
            "ContainerCreating",
            id="creating",
        ),
        pytest.param(pod("Running"), "starting", "RuntimeNotReady", id="not-ready"),
        pytest.param(pod("Running", ready=True), "ready", "RuntimeReady", id="ready"),
        pytest.param(
            pod("Running", ready=True, ip=None),
            "starting",
            "RuntimeNotReady",
            id="ready-without-ip",
        ),
        pytest.param(pod("Failed"), "failed", "PodFailed", id="failed"),
        pytest.param(pod("Succeeded"), "failed", "PodFailed", id="exited-zero"),
        pytest.param(pod("Failed", reason="Evicted"), "failed", "Evicted", id="evicted"),
        pytest.param(
            pod("Pending", **waiting("ImagePullBackOff", "no such image")),
            "broken",
            "ImagePullBackOff",
            id="image-pull",
        ),
        pytest.param(
            {**pod("Running", ready=True), "metadata": {"name": "p", "deletionTimestamp": "x"}},
            "terminating",
            "PodTerminating",
            id="terminating",
        ),
    ],
)
def test_observe_pod(obj, kind, reason) -> None:
    state = observe_pod(obj)
    assert (state.kind, state.reason) == (kind, reason)


def test_exit_code_is_in_the_message() -> None:
    obj = pod("Failed", containerStatuses=[{"state": {"terminated": {"exitCode": 137}}}])
    assert observe_pod(obj).message == "the runtime exited with code 137"


def session(status: SandboxSessionStatus | None = None, **meta) -> SandboxSession:
    return SandboxSession(
        name="sb-session-alice",
        namespace="ns",
        generation=3,
        creation_timestamp=T0,
        spec=SandboxSessionSpec(user_id="alice", ttl_seconds=meta.pop("ttl", None)),
        status=status or SandboxSessionStatus(),
        **meta,
    )


READY = PodState(
    "ready",
    "RuntimeReady",
    "the runtime answers",
    "10.0.0.7",
    "2025-01-01T00:00:00Z",
    "sb-session-alice",
    "cold",
)


def test_running_session_status() -> None:
    status = session_status(session(ttl=60), READY, T0)
    assert status.model_dump(mode="json", by_alias=True) == {
        "phase": "Running",
        "podName": "sb-session-alice",
        "podIP": "10.0.0.7",
        "endpoint": "http://10.0.0.7:8080",
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "RuntimeReady",
                "message": "the runtime answers",
                "lastTransitionTime": "2025-01-01T00:00:00Z",
            },
            {
                "type": "Stopped",
                "status": "False",
                "reason": "Active",
                "message": "the session is active",
                "lastTransitionTime": "2025-01-01T00:00:00Z",
            },
            {
                "type": "Expired",
                "status": "False",
                "reason": "NotExpired",
                "message": "expires at 2025-01-01T00:01:00+00:00",
                "lastTransitionTime": "2025-01-01T00:00:00Z",
            },
        ],
        "lastActivityTime": None,
        "startedAt": "2025-01-01T00:00:00Z",
        "startedFrom": "cold",
        "workspacePath": None,
        "expiresAt": "2025-01-01T00:01:00Z",
        "observedGeneration": 3,
    }


def test_transition_time_moves_only_on_change() -> None:
    first = session_status(session(), READY, T0)
    later = T0 + timedelta(minutes=5)
    same = session_status(session(first), READY, later)
    assert condition(same, "Ready").last_transition_time == T0
    failed = session_status(session(same), observe_pod(pod("Failed")), later)
    assert failed.phase == "Error" and failed.endpoint is None
    assert condition(failed, "Ready").last_transition_time == later
    assert condition(failed, "Ready").reason == "PodFailed"


def test_stop_and_resume() -> None:
    running = session_status(session(), READY, T0)
    stopped = session_status(session(running), observe_pod(None), T0, stopped=True)
    assert (stopped.phase, stopped.pod_name, stopped.endpoint) == ("Stopped", None, None)
    assert condition(stopped, "Stopped").status == "True"
    assert condition(stopped, "Stopped").reason == "IdleTimeout"
    assert is_stopped(session(stopped))
    resumed = session(stopped, annotations={"sandboxworkspace.io/resume-requested": "now"})
    assert not is_stopped(resumed)
    pending = session_status(resumed, observe_pod(None), T0)
    assert pending.phase == "Pending"
    assert condition(pending, "Stopped").reason == "Resumed"


def test_the_workspace_path_follows_its_pod_start() -> None:
    """What the runtime named (a claim's answer) is recorded and kept by every later
    status of the same pod start; a new start (the container restarted, another pod) and a
    stop drop it — the runtime of the new start is asked again (firstlook.py)."""
    claimed = session_status(session(), READY, T0, workspace_path="/srv/ws")
    assert claimed.workspace_path == "/srv/ws"
    again = session_status(session(claimed), READY, T0 + timedelta(seconds=5))
    assert again.workspace_path == "/srv/ws"
    restarted = PodState(**{**READY.__dict__, "started_at": "2025-01-01T00:09:00Z"})
    assert session_status(session(again), restarted, T0).workspace_path is None
    other = PodState(**{**READY.__dict__, "name": "sbx-pool-2"})
    assert session_status(session(again), other, T0).workspace_path is None
    stopped = session_status(session(again), observe_pod(None), T0, stopped=True)
    assert stopped.workspace_path is None


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("workspace", id="relative"),
        pytest.param("", id="empty"),
        pytest.param("/work\x00space", id="nul"),
        pytest.param("/" + "a" * 4096, id="huge"),
        pytest.param(["/workspace"], id="list"),
        pytest.param(7, id="number"),
        pytest.param({"path": "/workspace"}, id="object"),
    ],
)
def test_a_status_drops_a_workspace_path_of_another_shape(value: object) -> None:
    """A reader drops what no operator of this release writes (the apiserver refuses it
    too: the CRD's pattern and maxLength) instead of refusing the whole status."""
    from sandbox_workspace.operator.models import workspace_path_of

    assert workspace_path_of(value) is None
    read = SandboxSessionStatus.model_validate({"phase": "Running", "workspacePath": value})
    assert read.phase == "Running" and read.workspace_path is None
    assert workspace_path_of("/" + "a" * 4095) == "/" + "a" * 4095


def test_a_missing_pod_is_pending_not_stopped() -> None:
    status = session_status(session(), observe_pod(None), T0)
    assert status.phase == "Pending"
    assert condition(status, "Ready").reason == "PodMissing"


def test_a_secret_cache_not_yet_synced_is_pending_not_broken() -> None:
    """The kubelet retries this CreateContainerConfigError by itself (a node just
    started): the session waits instead of failing; a real config error stays broken."""
    from sandbox_workspace.operator.status import observe_pod

    def pod(message: str) -> dict:
        waiting = {"reason": "CreateContainerConfigError", "message": message}
        return {
            "metadata": {"name": "p"},
            "status": {"phase": "Pending", "containerStatuses": [{"state": {"waiting": waiting}}]},
        }

    transient = "failed to sync secret cache: timed out waiting for the condition"
    assert observe_pod(pod(transient)).kind == "pending"
    assert observe_pod(pod('secret "x" not found')).kind == "broken"
