"""The SandboxSession the kubernetes backend creates for a caller (compared whole)."""

from __future__ import annotations

import pytest

from sandbox_workspace.api.backends.base import SessionSpec
from sandbox_workspace.api.backends.kubernetes import session_body
from sandbox_workspace.contract import crd
from sandbox_workspace.operator import models, naming


def _expected_spec(**extra) -> dict:
    return {
        "userId": "alice",
        "agentId": "agent-1",
        "fileUploadConfig": models.FileUploadConfig().model_dump(by_alias=True),
        **extra,
    }


@pytest.mark.parametrize(
    ("network_enabled", "extra"),
    [
        pytest.param(False, {}, id="network-off-by-default"),
        pytest.param(True, {"network": {"enabled": True}}, id="network-allowed"),
    ],
)
def test_session_body_carries_the_api_defaults_for_new_sessions(network_enabled, extra) -> None:
    spec = SessionSpec(session_id="sb-session-alice", user_id="alice", agent_id="agent-1")
    body = session_body(
        spec,
        idle_timeout_seconds=600,
        storage=models.StorageSpec(size="2Gi"),
        network_enabled=network_enabled,
    )
    full = models.SandboxSessionSpec.model_validate(body["spec"]).model_dump(
        by_alias=True, exclude_none=True
    )
    assert body == {
        "apiVersion": crd.API_VERSION,
        "kind": crd.SESSION_KIND,
        "metadata": {
            "name": "sb-session-alice",
            "labels": {crd.LABEL_USER: "alice"},
            "annotations": {
                crd.ANNOTATION_USER_ID: "alice",
                # Made with current (64-bit) names for its pod, Secret and claim.
                naming.ANNOTATION_NAMES: naming.NAMES_CURRENT,
            },
        },
        "spec": full,
    }
    assert body["spec"]["idleTimeoutSeconds"] == 600
    assert body["spec"]["storage"]["size"] == "2Gi"
    # Network stays off unless the API was told to allow it for new sessions.
    assert models.SandboxSessionSpec.model_validate(body["spec"]).network.enabled is network_enabled
    for key, value in _expected_spec(**extra).items():
        assert body["spec"][key] == value


def test_the_apis_limits_are_written_into_new_sessions() -> None:
    spec = SessionSpec(session_id="sb-session-alice", user_id="alice")
    limits = models.ExecutionLimits(memory="1Gi", cpu_seconds=60)
    body = session_body(
        spec, idle_timeout_seconds=None, storage=None, network_enabled=False, limits=limits
    )
    assert body["spec"]["limits"] == {
        "memory": "1Gi", "cpuSeconds": 60, "fileSize": "256Mi", "conversationSize": "512Mi",
    }  # fmt: skip
