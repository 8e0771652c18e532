"""operator/builders.py: whole manifests, compared as a whole (STYLE 3)."""

from __future__ import annotations

import json

import pytest

from sandbox_workspace.operator.builders import (
    build_cleanup_pod,
    build_cleanup_secret,
    build_runtime_secret,
    build_sandbox_pod,
    build_workspace_pvc,
    container_resources,
    needs_claim,
    spec_hash,
)
from sandbox_workspace.operator.models import SandboxSession, SandboxSessionSpec
from sandbox_workspace.operator.settings import OperatorSettings

LABELS = {
    "app.kubernetes.io/name": "sandbox-workspace",
    "app.kubernetes.io/managed-by": "sandbox-workspace-operator",
    "sandboxworkspace.io/session": "sb-session-alice",
    "sandboxworkspace.io/user": "alice",
}
ANNOTATIONS = {"sandboxworkspace.io/user-id": "alice"}


def make_session(name: str = "sb-session-alice", **spec: object) -> SandboxSession:
    return SandboxSession(
        name=name,
        namespace="ns",
        spec=SandboxSessionSpec.model_validate({"userId": "alice", **spec}),
    )


@pytest.fixture
def settings() -> OperatorSettings:
    return OperatorSettings(_env_file=None, image="registry.example/sandbox:1.2.3")


def test_secret(settings: OperatorSettings) -> None:
    assert build_runtime_secret(make_session(), "tok") == {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": "sb-session-alice-token",
            "labels": LABELS,
            "annotations": ANNOTATIONS,
        },
        "type": "Opaque",
        "stringData": {"token": "tok"},
    }


def test_pvc_with_storage_class() -> None:
    session = make_session(storage={"size": "5Gi", "storageClassName": "fast"})
    assert build_workspace_pvc(session) == {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": "sb-session-alice-workspace",
            "labels": LABELS,
            "annotations": ANNOTATIONS,
        },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "volumeMode": "Filesystem",
            "resources": {"requests": {"storage": "5Gi"}},
            "storageClassName": "fast",
        },
    }


def expected_pod(workspace_volume: dict, network: str = "deny", **spec_extra: object) -> dict:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "sb-session-alice",
            "labels": {
                **LABELS,
                "sandboxworkspace.io/component": "runtime",
                "app.kubernetes.io/component": "runtime",
            },
            "annotations": ANNOTATIONS,
        },
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 10,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 10001,
                "runAsGroup": 10001,
                "fsGroup": 10001,
                "fsGroupChangePolicy": "OnRootMismatch",
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "runtime",
                    "image": "registry.example/sandbox:1.2.3",
                    "imagePullPolicy": "IfNotPresent",
                    "command": [
                        "sandbox-workspace",
                        "runtime",
                        "--host",
                        "0.0.0.0",
                        "--port",
                        "8080",
                        "--root",
                        "/workspace",
                    ],
                    "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                    "env": [
                        {
                            "name": "SANDBOX_RUNTIME_TOKEN",
                            "valueFrom": {
                                "secretKeyRef": {"name": "sb-session-alice-token", "key": "token"}
                            },
                        },
                        {"name": "SANDBOX_RUNTIME_MAX_FILE_SIZE_BYTES", "value": "104857600"},
                        {"name": "SANDBOX_RUNTIME_MAX_FILE_COUNT", "value": "50"},
                        {
                            "name": "SANDBOX_RUNTIME_ALLOWED_FILE_TYPES",
                            "value": "csv,xlsx,json,txt,pkl,png,jpg,pdf",
                        },
                        {"name": "SANDBOX_RUNTIME_CONFINEMENT", "value": "auto"},
                        {"name": "SANDBOX_RUNTIME_CONFINEMENT_MIN_ABI", "value": "6"},
                        {"name": "SANDBOX_RUNTIME_NETWORK", "value": network},
                        # spec.limits' defaults, in bytes: inside the pod's 1Gi.
                        {"name": "SANDBOX_RUNTIME_LIMIT_MEMORY", "value": "536870912"},
                        {"name": "SANDBOX_RUNTIME_LIMIT_CPU_SECONDS", "value": "300"},
                        {"name": "SANDBOX_RUNTIME_LIMIT_FILE_SIZE", "value": "268435456"},
                        {"name": "SANDBOX_RUNTIME_LIMIT_CONVERSATION_SIZE", "value": "536870912"},
                        {"name": "HOME", "value": "/tmp"},
                    ],
                    "resources": {
                        "requests": {
                            "cpu": "100m",
                            "memory": "256Mi",
                            "ephemeral-storage": "256Mi",
                        },
                        "limits": {"cpu": "1", "memory": "1Gi", "ephemeral-storage": "1Gi"},
                    },
                    "readinessProbe": {
                        "httpGet": {"path": "/healthz", "port": 8080},
                        "periodSeconds": 2,
                        "timeoutSeconds": 2,
                        "failureThreshold": 3,
                    },
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 10001,
                        "runAsGroup": 10001,
                        "allowPrivilegeEscalation": False,
                        "privileged": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "volumeMounts": [
                        {"name": "workspace", "mountPath": "/workspace"},
                        {"name": "tmp", "mountPath": "/tmp"},
                    ],
                }
            ],
            "volumes": [
                workspace_volume,
                {"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}},
            ],
            **spec_extra,
        },
    }
    # The digest of the whole spec above: a pod is replaced when it changes.
    pod["metadata"]["annotations"] = {**ANNOTATIONS, "sandboxworkspace.io/pod-spec": spec_hash(pod)}
    return pod


def test_pod_with_persistent_workspace(settings: OperatorSettings) -> None:
    assert build_sandbox_pod(make_session(), settings) == expected_pod(
        {"name": "workspace", "persistentVolumeClaim": {"claimName": "sb-session-alice-workspace"}}
    )


def test_pod_with_ephemeral_workspace_and_runtime_class(settings: OperatorSettings) -> None:
    settings = settings.model_copy(update={"runtime_class_name": "gvisor"})
    session = make_session(storage={"persistent": False, "size": "2Gi"})
    assert build_sandbox_pod(session, settings) == expected_pod(
        {"name": "workspace", "emptyDir": {"sizeLimit": "2Gi"}}, runtimeClassName="gvisor"
    )


def _s3_settings(settings: OperatorSettings) -> OperatorSettings:
    return OperatorSettings(
        _env_file=None,
        image=settings.image,
        store="s3",
        s3={
            "endpoint_url": "http://store.example:8333",
            "bucket": "the-bucket",
            "access_key_id": "AKIA-OPERATOR-ONLY",
            "secret_access_key": "operator-secret-never-in-a-pod",
        },
    )


@pytest.mark.parametrize("persistent", [True, False])
def test_store_mode_s3_pod_workspace_is_an_empty_dir_and_no_claim(
    settings: OperatorSettings, persistent: bool
) -> None:
    s3 = _s3_settings(settings)
    session = make_session(storage={"persistent": persistent, "size": "3Gi"})
    assert not needs_claim(session, s3)
    assert needs_claim(session, settings) is persistent
    # The whole manifest: the local mode's pod with the emptyDir, nothing else changed.
    assert build_sandbox_pod(session, s3) == expected_pod(
        {"name": "workspace", "emptyDir": {"sizeLimit": "3Gi"}}
    )


def test_store_mode_s3_pod_holds_no_store_credential(settings: OperatorSettings) -> None:
    """No pod holds another conversation's keys: none at all — no variable, no Secret but
    the runtime's own token, no service account token, no account of its own."""
    pod = build_sandbox_pod(make_session(), _s3_settings(settings))
    text = json.dumps(pod)
    for needle in ("AKIA-OPERATOR-ONLY", "operator-secret", "the-bucket", "store.example"):
        assert needle not in text
    spec = pod["spec"]
    (container,) = spec["containers"]
    names = {e["name"] for e in container["env"]}
    assert not {n for n in names if "S3" in n or "AWS" in n or "STORE" in n}
    secret_refs = [e["valueFrom"]["secretKeyRef"] for e in container["env"] if "valueFrom" in e]
    assert secret_refs == [{"name": "sb-session-alice-token", "key": "token"}]
    assert "envFrom" not in container
    assert not [v for v in spec["volumes"] if "secret" in v or "projected" in v]
    assert spec["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in spec and "serviceAccount" not in spec


def test_pod_upload_limits_come_from_the_spec(settings: OperatorSettings) -> None:
    session = make_session(
        fileUploadConfig={
            "maxFileSize": 2,
            "maxFileSizeUnit": "kb",
            "maxFileCount": 3,
            "allowedFileTypes": [],
        },
        image="custom:tag",
    )
    pod = build_sandbox_pod(session, settings)
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["SANDBOX_RUNTIME_MAX_FILE_SIZE_BYTES"] == "2048"
    assert env["SANDBOX_RUNTIME_MAX_FILE_COUNT"] == "3"
    assert env["SANDBOX_RUNTIME_ALLOWED_FILE_TYPES"] == ""
    assert container["image"] == "custom:tag"


@pytest.mark.parametrize(
    ("own", "expected"),
    [
        pytest.param(
            None,
            {
                "requests": {"cpu": "100m", "memory": "256Mi", "ephemeral-storage": "256Mi"},
                "limits": {"cpu": "1", "memory": "1Gi", "ephemeral-storage": "1Gi"},
            },
            id="defaults",
        ),
        pytest.param(
            {"limits": {"memory": "4Gi", "cpu": 2}},
            {
                "requests": {"cpu": "100m", "memory": "256Mi", "ephemeral-storage": "256Mi"},
                "limits": {"cpu": "2", "memory": "4Gi", "ephemeral-storage": "1Gi"},
            },
            id="override-some-keys",
        ),
        pytest.param(
            {"requests": {"ephemeral-storage": "5Gi"}},
            {
                "requests": {"cpu": "100m", "memory": "256Mi", "ephemeral-storage": "5Gi"},
                "limits": {"cpu": "1", "memory": "1Gi", "ephemeral-storage": "1Gi"},
            },
            id="dash-key",
        ),
    ],
)
def test_resources_merge_key_by_key(settings, own, expected) -> None:
    session = make_session(**({"resources": own} if own else {}))
    assert container_resources(session, settings) == expected


def test_odd_user_ids_give_valid_labels_and_verbatim_annotation(settings) -> None:
    session = SandboxSession(
        name="sb-session-x-0a1b2c3d",
        namespace="ns",
        spec=SandboxSessionSpec(user_id="Ünïcode User@example.com"),
    )
    pod = build_sandbox_pod(session, settings)
    user_label = pod["metadata"]["labels"]["sandboxworkspace.io/user"]
    assert len(user_label) <= 63 and user_label.isascii()
    assert pod["metadata"]["annotations"]["sandboxworkspace.io/user-id"] == (
        "Ünïcode User@example.com"
    )


def test_network_and_confinement_reach_the_runtime(settings) -> None:
    settings = settings.model_copy(update={"confinement": "require"})
    pod = build_sandbox_pod(make_session(network={"enabled": True}), settings)
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert (env["SANDBOX_RUNTIME_NETWORK"], env["SANDBOX_RUNTIME_CONFINEMENT"]) == (
        "allow",
        "require",
    )


@pytest.mark.parametrize(
    ("change", "new_pod"),
    [
        pytest.param({"image": "other:1"}, True, id="image"),
        pytest.param({"network": {"enabled": True}}, True, id="network"),
        pytest.param({"fileUploadConfig": {"maxFileCount": 7}}, True, id="upload-limits"),
        pytest.param({"idleTimeoutSeconds": 5}, False, id="idle-timeout"),
        pytest.param({"ttlSeconds": 60}, False, id="ttl"),
    ],
)
def test_pod_spec_digest_changes_only_with_the_pod(settings, change, new_pod) -> None:
    def digest(session: SandboxSession) -> str:
        return build_sandbox_pod(session, settings)["metadata"]["annotations"][
            "sandboxworkspace.io/pod-spec"
        ]

    assert (digest(make_session()) != digest(make_session(**change))) is new_pod


def test_cleanup_pod_mounts_the_orphaned_claim_with_its_own_token(settings) -> None:
    pod = build_cleanup_pod(make_session(), settings, "sb-session-alice-workspace")
    expected = expected_pod(
        {"name": "workspace", "persistentVolumeClaim": {"claimName": "sb-session-alice-workspace"}}
    )
    expected["metadata"]["name"] = "sb-session-alice-workspace-cleanup"
    labels = expected["metadata"]["labels"]
    del labels["sandboxworkspace.io/session"]  # no session's reconciler takes it for its pod
    labels["sandboxworkspace.io/cleanup-of"] = "sb-session-alice-workspace"
    expected["metadata"]["annotations"] = ANNOTATIONS
    env = expected["spec"]["containers"][0]["env"]
    env[0]["valueFrom"]["secretKeyRef"]["name"] = "sb-session-alice-workspace-cleanup-token"
    assert pod == expected
    secret = build_cleanup_secret(make_session(), "sb-session-alice-workspace", "tok")
    assert secret["metadata"]["name"] == "sb-session-alice-workspace-cleanup-token"
    assert secret["stringData"] == {"token": "tok"}
    assert "sandboxworkspace.io/session" not in secret["metadata"]["labels"]


def test_a_sessions_limits_reach_the_runtime_in_bytes(settings) -> None:
    limits = {"memory": "1Gi", "cpuSeconds": 60, "fileSize": 1048576, "conversationSize": "2G"}
    pod = build_sandbox_pod(make_session(limits=limits), settings)
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert [env[f"SANDBOX_RUNTIME_LIMIT_{k}"] for k in ("MEMORY", "CPU_SECONDS")] == [
        str(2**30),
        "60",
    ]
    assert env["SANDBOX_RUNTIME_LIMIT_FILE_SIZE"] == "1048576"
    assert env["SANDBOX_RUNTIME_LIMIT_CONVERSATION_SIZE"] == str(2 * 10**9)
