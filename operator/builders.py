"""Pure builders of the Kubernetes objects a SandboxSession owns. No I/O.

Contract: each builder takes the typed session (and the operator settings) and returns a
whole manifest dict; the same input always gives the same manifest. Owner references
and the namespace are added by the handler (``kopf.adopt``), not here. The token is an
argument, so the builder stays deterministic; the handler generates it.

The sandbox pod is locked down as DESIGN.md "Identity and isolation" says: non-root,
no service-account token, all capabilities dropped, read-only root filesystem with
writable ``/workspace`` and ``/tmp`` only, seccomp RuntimeDefault, resource and
ephemeral-storage limits, optional runtimeClassName. In store mode ``s3`` ``/workspace``
is an emptyDir of the session's storage size (no claim; ``needs_claim``) and the pod
holds no store credential: the API and the operator move the bytes. It never restarts in place
(``restartPolicy: Never``): a failed pod is replaced by the operator, which also
notices and reports it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from sandbox_workspace.contract.crd import (
    ANNOTATION_POD_SPEC,
    ANNOTATION_USER_ID,
    COMPONENT_RUNTIME,
    LABEL_CLEANUP,
    LABEL_COMPONENT,
    LABEL_SESSION,
    LABEL_USER,
)
from sandbox_workspace.egress.ca import trust_env
from sandbox_workspace.egress.cluster import placeholder_for
from sandbox_workspace.runtime.settings import RuntimeSettings

from . import naming
from .models import ResourceList, SandboxSession
from .settings import RUNTIME_PORT, RUNTIME_UID, OperatorSettings, host_port

TOKEN_KEY = "token"
WORKSPACE_MOUNT = "/workspace"
# The egress CA's public part (ConfigMap ``egress_ca_configmap``): never the key.
EGRESS_CA_MOUNT = "/etc/sandbox-workspace/egress-ca"
EGRESS_CA_BUNDLE = f"{EGRESS_CA_MOUNT}/bundle.pem"
CONTAINER_NAME = "runtime"


def session_labels(session: SandboxSession) -> dict[str, str]:
    """Labels every child of the session carries (selectors, NetworkPolicy, kubectl)."""
    return {
        "app.kubernetes.io/name": "sandbox-workspace",
        "app.kubernetes.io/managed-by": "sandbox-workspace-operator",
        LABEL_SESSION: session.name,
        LABEL_USER: naming.dns_name(session.spec.user_id),
    }


def _metadata(name: str, session: SandboxSession, **labels: str) -> dict[str, Any]:
    return {
        "name": name,
        "labels": {**session_labels(session), **labels},
        # The user id verbatim: label values are restricted, annotations are not.
        "annotations": {ANNOTATION_USER_ID: session.spec.user_id},
    }


def build_runtime_secret(session: SandboxSession, token: str) -> dict[str, Any]:
    """The Secret holding the runtime's bearer token (read by the pod and the API)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(
            naming.runtime_secret_name(session.name, legacy=session.legacy_children), session
        ),
        "type": "Opaque",
        "stringData": {TOKEN_KEY: token},
    }


def build_workspace_pvc(session: SandboxSession) -> dict[str, Any]:
    """The claim backing ``/workspace`` of a persistent session."""
    storage = session.spec.storage
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "volumeMode": "Filesystem",
        "resources": {"requests": {"storage": storage.size}},
    }
    if storage.storage_class_name:
        spec["storageClassName"] = storage.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _metadata(
            naming.workspace_claim_name(session.name, legacy=session.legacy_children), session
        ),
        "spec": spec,
    }


def _merge(default: ResourceList | None, override: ResourceList | None) -> dict[str, str]:
    merged = default.as_dict() if default else {}
    merged.update(override.as_dict() if override else {})
    return merged


def container_resources(session: SandboxSession, settings: OperatorSettings) -> dict[str, Any]:
    """The operator's defaults, overridden key by key by the session's own."""
    defaults, own = settings.default_resources, session.spec.resources
    out = {}
    for key in ("requests", "limits"):
        merged = _merge(getattr(defaults, key), getattr(own, key) if own else None)
        if merged:
            out[key] = merged
    return out


def runtime_env(
    session: SandboxSession, settings: OperatorSettings, secret: str | None = None
) -> list[dict[str, Any]]:
    """SANDBOX_RUNTIME_* settings of the runtime (runtime/settings.py); the token comes
    from ``secret`` (default: the session's runtime Secret)."""
    upload = session.spec.file_upload_config
    secret = secret or naming.runtime_secret_name(session.name, legacy=session.legacy_children)
    env = RuntimeSettings.env(
        max_file_size_bytes=upload.max_file_size_bytes,
        max_file_count=upload.max_file_count,
        allowed_file_types=upload.allowed_file_types,
        confinement=settings.confinement,
        confinement_min_abi=settings.confinement_min_abi,
        **code_network(session, settings),
    )
    return [
        {
            "name": RuntimeSettings.env_name("token"),
            "valueFrom": {"secretKeyRef": {"name": secret, "key": TOKEN_KEY}},
        },
        *({"name": k, "value": v} for k, v in env.items()),
        *({"name": k, "value": v} for k, v in session.spec.limits.runtime_env().items()),
        # The root filesystem is read-only; tools that want a home get the scratch space.
        {"name": "HOME", "value": "/tmp"},
    ]


def mount_egress_ca(spec: dict[str, Any], configmap: str, *, optional: bool = False) -> None:
    """The egress CA's public part at ``EGRESS_CA_MOUNT`` of the pod ``spec``'s runtime
    (the whole ConfigMap, no subPath: a rotated CA reaches running pods)."""
    spec["containers"][0]["volumeMounts"].append(
        {"name": "egress-ca", "mountPath": EGRESS_CA_MOUNT, "readOnly": True}
    )
    source: dict[str, Any] = {"name": configmap}
    if optional:
        source["optional"] = True
    spec["volumes"].append({"name": "egress-ca", "configMap": source})


def code_network(session: SandboxSession, settings: OperatorSettings) -> dict[str, Any]:
    """The runtime's network settings for the session's code. CIDR mode (``network.
    enabled``): allowed, its NetworkPolicy decides. An egress policy on a cluster with a
    proxy: ``proxy_port`` — code may open IPv4 TCP to the proxy's port alone, so on a CNI
    that enforces no NetworkPolicy it still cannot reach anything but that one port — and
    the variables of ``egress_env`` (the executed code's environment, never the runtime
    process's: the runtime itself has no business with the proxy). Else denied."""
    spec = session.spec
    values: dict[str, Any] = {"network": "deny"}
    if spec.egress is not None and settings.egress_proxy:
        values = {
            "network": "proxy_port",
            "egress_proxy_port": host_port(settings.egress_proxy)[1],
            "code_env": egress_env(session, settings),
        }
    if spec.network.enabled:
        values["network"] = "allow"
    return values


def egress_env(session: SandboxSession, settings: OperatorSettings) -> dict[str, str]:
    """For a session with an egress policy, what its code sees: HTTP(S)_PROXY at the
    egress proxy (both spellings: curl reads only lower case ``http_proxy``), the trust
    variables at the CA bundle (when the cluster has one) and each bound secret's
    *placeholder* under its variable. The value is never here: the egress proxy reads it
    from the Secret on the way out."""
    egress = session.spec.egress
    if egress is None or not settings.egress_proxy:
        return {}
    url = f"http://{settings.egress_proxy}"
    env = {name: url for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")}
    env.update({"NO_PROXY": "", "no_proxy": ""})
    if settings.egress_ca_configmap:
        env.update(trust_env(EGRESS_CA_BUNDLE))
    for secret in egress.secrets:
        env[secret.env_name] = placeholder_for(session.namespace, session.name, secret.name)
    return env


def needs_claim(session: SandboxSession, settings: OperatorSettings) -> bool:
    """A PersistentVolumeClaim backs ``/workspace``: a persistent session in store mode
    ``local``. In store mode ``s3`` the bucket is the source of truth and ``/workspace``
    is a node-local cache (an emptyDir), filled by the API before first use."""
    return session.spec.storage.persistent and settings.store != "s3"


def _workspace_volume(session: SandboxSession, settings: OperatorSettings) -> dict[str, Any]:
    storage = session.spec.storage
    if needs_claim(session, settings):
        claim = naming.workspace_claim_name(session.name, legacy=session.legacy_children)
        return {"name": "workspace", "persistentVolumeClaim": {"claimName": claim}}
    return {"name": "workspace", "emptyDir": {"sizeLimit": storage.size}}


def spec_hash(manifest: dict[str, Any]) -> str:
    """A digest of a pod manifest's spec: equal digests, equal pods."""
    text = json.dumps(manifest["spec"], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def build_sandbox_pod(session: SandboxSession, settings: OperatorSettings) -> dict[str, Any]:
    """The pod running the runtime for ``session``, annotated with the digest of its
    spec (``ANNOTATION_POD_SPEC``) so a spec change that needs a new pod is noticed."""
    pod = _runtime_pod(session, settings)
    pod["metadata"]["annotations"][ANNOTATION_POD_SPEC] = spec_hash(pod)
    return pod


def build_cleanup_pod(
    session: SandboxSession, settings: OperatorSettings, claim: str
) -> dict[str, Any]:
    """A short-lived runtime on an orphaned ``claim``, only to delete conversations'
    directories from it (``session``: a stand-in giving the user id and defaults).
    Never labelled with a session: no session's reconciler mistakes it for its pod."""
    pod = _runtime_pod(session, settings, secret=naming.cleanup_secret_name(claim))
    pod["metadata"]["name"] = naming.cleanup_pod_name(claim)
    pod["metadata"]["labels"].pop(LABEL_SESSION)
    pod["metadata"]["labels"][LABEL_CLEANUP] = claim
    volume = {"name": "workspace", "persistentVolumeClaim": {"claimName": claim}}
    pod["spec"]["volumes"][0] = volume
    return pod


def build_cleanup_secret(session: SandboxSession, claim: str, token: str) -> dict[str, Any]:
    """The bearer token of the cleanup pod on ``claim``."""
    secret = build_runtime_secret(session, token)
    secret["metadata"]["name"] = naming.cleanup_secret_name(claim)
    secret["metadata"]["labels"].pop(LABEL_SESSION)
    secret["metadata"]["labels"][LABEL_CLEANUP] = claim
    return secret


def _runtime_pod(
    session: SandboxSession, settings: OperatorSettings, secret: str | None = None
) -> dict[str, Any]:
    image = session.spec.image or settings.image
    container = {
        "name": CONTAINER_NAME,
        "image": image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": [
            "sandbox-workspace",
            "runtime",
            "--host",
            "0.0.0.0",
            "--port",
            str(RUNTIME_PORT),
            "--root",
            WORKSPACE_MOUNT,
        ],
        "ports": [{"name": "http", "containerPort": RUNTIME_PORT, "protocol": "TCP"}],
        "env": runtime_env(session, settings, secret),
        "resources": container_resources(session, settings),
        "readinessProbe": {
            "httpGet": {"path": "/healthz", "port": RUNTIME_PORT},
            "periodSeconds": 2,
            "timeoutSeconds": 2,
            "failureThreshold": 3,
        },
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUNTIME_UID,
            "runAsGroup": RUNTIME_UID,
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [
            {"name": "workspace", "mountPath": WORKSPACE_MOUNT},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": settings.termination_grace_seconds,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUNTIME_UID,
            "runAsGroup": RUNTIME_UID,
            # Makes the workspace volume writable by the runtime's user.
            "fsGroup": RUNTIME_UID,
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [
            _workspace_volume(session, settings),
            {"name": "tmp", "emptyDir": {"sizeLimit": settings.tmp_size_limit}},
        ],
    }
    if session.spec.egress is not None and settings.egress_ca_configmap:
        mount_egress_ca(spec, settings.egress_ca_configmap)
    if settings.runtime_class_name:
        spec["runtimeClassName"] = settings.runtime_class_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _metadata(
            naming.runtime_pod_name(session.name, legacy=session.legacy_children),
            session,
            **{LABEL_COMPONENT: COMPONENT_RUNTIME, "app.kubernetes.io/component": "runtime"},
        ),
        "spec": spec,
    }
